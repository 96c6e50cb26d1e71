"""One definition of a percentile for every table the project prints."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1), linear between the closest ranks (numpy's default and
    Python's statistics.quantiles(method="inclusive")); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)

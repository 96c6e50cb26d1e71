"""Reading unittest's report: totals, and the outcome of each test id."""

from __future__ import annotations

import re


def parse_unittest(output: str) -> tuple[int, int]:
    """(tests run, tests failed or errored) from unittest's summary lines."""
    ran = re.search(r"^Ran (\d+) tests?", output, re.M)
    total = int(ran.group(1)) if ran else 0
    failed = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", output))
    return total, failed

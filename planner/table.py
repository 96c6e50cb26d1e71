"""The Markdown tables every `python -m planner` command prints."""

from __future__ import annotations

import math
from typing import Any


def _fmt(v: Any, nd: int = 1) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.{nd}f}"
    return str(v)


def print_table(headers: list[str], rows: list[list[Any]]) -> str:
    text = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    text += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    out = "\n".join(text)
    print(out, flush=True)
    return out


def interval(values: list[float], nd: int = 1) -> str:
    """Mean, and [min - max] over seeds when there are several."""
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.{nd}f}"
    return f"{mean:.{nd}f} [{min(values):.{nd}f} - {max(values):.{nd}f}]"

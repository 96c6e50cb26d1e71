"""The smallest fleet that meets a target: any P:D worker counts, a TP size per role.

A deployment team asks "how few GPUs serve N sessions at X tok/s per user with TTFT p90 under
Y s?". Each candidate is a whole fleet, judged by one callable (`meets`: a simulation, in the CLI),
so the search is where the cost is. It assumes what a fleet's capacity does: more prefill or
more decode workers never break a target a smaller fleet met. Then the least decode count that
meets it can only fall as prefill workers are added, and a staircase over (prefill, decode) with
a bisection per prefill count visits a few fleets where the full grid visits all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """`prefill` workers of `tp_prefill` GPUs and `decode` workers of `tp_decode` GPUs."""

    prefill: int
    decode: int
    tp_prefill: int = 8
    tp_decode: int = 8

    @property
    def gpus(self) -> int:
        return self.prefill * self.tp_prefill + self.decode * self.tp_decode

    @property
    def name(self) -> str:
        return f"{self.prefill}P:{self.decode}D (TP{self.tp_prefill}/TP{self.tp_decode})"


def grid(max_prefill: int, max_decode: int, tps: Iterable[int]) -> list[Shape]:
    """Every fleet the search may visit."""
    tps = sorted(set(tps))
    return [Shape(p, d, a, b) for a in tps for b in tps
            for p in range(1, max_prefill + 1) for d in range(1, max_decode + 1)]


def smallest(meets: Callable[[Shape], bool], max_prefill: int, max_decode: int,
             tps: Iterable[int]) -> tuple[Shape | None, list[Shape]]:
    """The fewest-GPU fleet of `grid(...)` that meets the target (the first found among equals),
    and the fleets judged on the way, in order."""
    judged: dict[Shape, bool] = {}

    def ok(s: Shape) -> bool:
        if s not in judged:
            judged[s] = meets(s)
        return judged[s]

    best: Shape | None = None
    tps = sorted(set(tps))
    for tp_p in tps:
        for tp_d in tps:
            top = max_decode  # the least decode count that meets, as prefill workers grow
            for p in range(1, max_prefill + 1):
                cap = top if best is None else min(
                    top, (best.gpus - 1 - p * tp_p) // tp_d)  # strictly fewer GPUs than best
                if cap < 1:
                    if best is not None and p * tp_p + tp_d >= best.gpus:
                        break
                    continue
                if not ok(Shape(p, cap, tp_p, tp_d)):
                    continue
                lo, hi = 1, cap  # hi meets; find the least d that does
                while lo < hi:
                    mid = (lo + hi) // 2
                    if ok(Shape(p, mid, tp_p, tp_d)):
                        hi = mid
                    else:
                        lo = mid + 1
                top, best = hi, Shape(p, hi, tp_p, tp_d)
    return best, list(judged)

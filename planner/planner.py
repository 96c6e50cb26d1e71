"""The smallest fleet that meets a target: any P:D worker counts, a TP/EP layout per role.

A deployment team asks "how few GPUs serve N sessions at X tok/s per user with TTFT p90 under
Y s?". Each candidate is a whole fleet, judged by one callable (`meets`: a simulation, in the CLI),
so the search is where the cost is. It assumes what a fleet's capacity does: more prefill or
more decode workers never break a target a smaller fleet met. Then the least decode count that
meets it can only fall as prefill workers are added, and a staircase over (prefill, decode) with
a bisection per prefill count visits a few fleets where the full grid visits all of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

Layout = tuple[int, int]  # one worker's (TP, EP)


def parse_layout(text: str) -> Layout:
    """"TP8" (EP = TP), "TP1EP8" (attention DP 8, experts over 8 GPUs), "TP8EP1" (MoE TP)."""
    m = re.fullmatch(r"TP(\d+)(?:EP(\d+))?", text.strip().upper())
    if not m or int(m[1]) < 1 or (m[2] is not None and int(m[2]) < 1):
        raise ValueError(f"worker layout {text!r}: expected TP<n> or TP<n>EP<m>, as TP8, TP1EP8")
    tp, ep = int(m[1]), int(m[2] or m[1])
    if max(tp, ep) % min(tp, ep):
        raise ValueError(f"worker layout {text!r}: TP and EP must divide one another")
    return tp, ep


def layout_name(tp: int, ep: int) -> str:
    return f"TP{tp}" if ep == tp else f"TP{tp}EP{ep}"


def worker_gpus(tp: int, ep: int) -> int:
    """A worker spans TP x attention DP = MoE TP x EP GPUs: the larger of the two."""
    return max(tp, ep)


@dataclass(frozen=True)
class Shape:
    """`prefill` workers of layout (`tp_prefill`, `ep_prefill`) and `decode` workers of
    (`tp_decode`, `ep_decode`)."""

    prefill: int
    decode: int
    tp_prefill: int = 8
    tp_decode: int = 8
    ep_prefill: int = 8
    ep_decode: int = 8

    @property
    def gpus(self) -> int:
        return (self.prefill * worker_gpus(self.tp_prefill, self.ep_prefill)
                + self.decode * worker_gpus(self.tp_decode, self.ep_decode))

    @property
    def name(self) -> str:
        return (f"{self.prefill}P:{self.decode}D ({layout_name(self.tp_prefill, self.ep_prefill)}"
                f"/{layout_name(self.tp_decode, self.ep_decode)})")


def grid(max_prefill: int, max_decode: int, layouts: Iterable[Layout]) -> list[Shape]:
    """Every fleet the search may visit."""
    layouts = sorted(set(layouts))
    return [Shape(p, d, a[0], b[0], a[1], b[1]) for a in layouts for b in layouts
            for p in range(1, max_prefill + 1) for d in range(1, max_decode + 1)]


def smallest(meets: Callable[[Shape], bool], max_prefill: int, max_decode: int,
             layouts: Iterable[Layout]) -> tuple[Shape | None, list[Shape]]:
    """The fewest-GPU fleet of `grid(...)` that meets the target (the first found among equals),
    and the fleets judged on the way, in order."""
    judged: dict[Shape, bool] = {}

    def ok(s: Shape) -> bool:
        if s not in judged:
            judged[s] = meets(s)
        return judged[s]

    best: Shape | None = None
    layouts = sorted(set(layouts))
    for lp in layouts:
        for ld in layouts:
            def shape(p: int, d: int, lp: Layout = lp, ld: Layout = ld) -> Shape:
                return Shape(p, d, lp[0], ld[0], lp[1], ld[1])

            gp, gd = worker_gpus(*lp), worker_gpus(*ld)
            top = max_decode  # the least decode count that meets, as prefill workers grow
            for p in range(1, max_prefill + 1):
                cap = top if best is None else min(
                    top, (best.gpus - 1 - p * gp) // gd)  # strictly fewer GPUs than best
                if cap < 1:
                    if best is not None and p * gp + gd >= best.gpus:
                        break
                    continue
                if not ok(shape(p, cap)):
                    continue
                lo, hi = 1, cap  # hi meets; find the least d that does
                while lo < hi:
                    mid = (lo + hi) // 2
                    if ok(shape(p, mid)):
                        hi = mid
                    else:
                        lo = mid + 1
                top, best = hi, shape(p, hi)
    return best, list(judged)

"""The pinned knobs at the ends of their stated ranges (issue 50): where a prediction or a plan
could land if a pinned value is wrong. One knob moves at a time, the others stay at the fit.

An end of a knob the fit's own fleet depends on (`Knob.moves_fit`) is refitted: the two fitted
efficiencies are found again so that 1P:4D still serves the seed's point there, since the point
is evidence and an end that cannot meet it with efficiencies inside their ranges is ruled out by
it (kept in the record, left out of the intervals). The other ends (a layout the fit has not
got) take the fit's efficiencies as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.calibrate import KNOBS, Fit, fit, fitted


@dataclass(frozen=True)
class End:
    """One knob at one end of its range, with the knobs (refitted or not) to simulate there."""

    knob: str
    value: float
    knobs: dict[str, float]
    refitted: bool
    consistent: bool  # meets the published point with efficiencies inside their ranges
    fit: Fit | None = None

    @property
    def name(self) -> str:
        return f"{self.knob}={self.value:g}"


def pinned_ends(center: dict[str, float]) -> list[tuple[str, float]]:
    """(knob, value) at each end of every pinned knob's range that differs from its value."""
    return [(k.name, v) for k in KNOBS.values() if not k.fitted_to
            for v in (k.low, k.high) if v != center[k.name]]


def in_range(knobs: dict[str, float]) -> bool:
    return all(KNOBS[k].low <= knobs[k] <= KNOBS[k].high for k in KNOBS if KNOBS[k].fitted_to)


def ends(center: dict[str, float], refit: Callable[[dict[str, float]], Fit],
         target_tok_s: float, ttft_slo_s: float,
         map_: Callable[[Callable, list], list] = lambda f, xs: [f(x) for x in xs]) -> list[End]:
    """Every pinned end; `refit(start)` fits the efficiencies from `start` (the center's knobs
    with one pinned knob moved); `map_` runs the refits (side by side, if it can)."""
    todo = pinned_ends(center)

    def one(end: tuple[str, float]) -> End:
        name, value = end
        knobs = {**center, name: value}
        if not KNOBS[name].moves_fit:
            return End(name, value, knobs, refitted=False, consistent=True)
        got = refit(knobs)
        ok = fitted(got, ttft_slo_s, target_tok_s) and in_range(got.knobs)
        return End(name, value, got.knobs, refitted=True, consistent=ok, fit=got)

    return map_(one, todo)


def refitter(measure: Callable[[dict[str, float]], dict], target_tok_s: float,
             ttft_slo_s: float) -> Callable[[dict[str, float]], Fit]:
    """A refit from a start, prefill efficiency doubled no further than twice its range."""
    limit = 2 * KNOBS["prefill_efficiency"].high

    def refit(start: dict[str, float]) -> Fit:
        return fit(measure, target_tok_s, ttft_slo_s, start=start, limit=limit)

    return refit

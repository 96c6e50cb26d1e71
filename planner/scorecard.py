"""The calibration's scorecard (issue 50): each figure the seed publishes beside the prediction
made without refitting to it, as a mean with an interval over seeds and the pinned knobs' range
ends, its error, and whether it lands within 15% of the published figure. Pure: the CLI
gathers the simulations' figures, this lays them out."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

BAR = 0.15  # a prediction within 15% of the published figure counts as a hit

# ITL, three ways (planner/offline.py): which one the seed's "p90 inter-token latency" means is
# argued in docs/planner.md; the scorecard scores the argued one and reports the other two.
ITL_DEFINITIONS = {
    "per_request": ("itl_request_p90_ms", "p90 over requests of each request's mean gap"),
    "per_token": ("itl_p90_ms", "p90 over every gap between two tokens"),
    "mean": ("itl_mean_ms", "the mean gap over every decoded token"),
}
SEED_ITL = "per_token"


@dataclass(frozen=True)
class Row:
    figure: str
    published: float
    mean: float
    low: float
    high: float
    unit: str
    interval_over: str
    note: str = ""

    @property
    def error(self) -> float:
        return self.mean / self.published - 1.0

    @property
    def within_15(self) -> bool:
        return abs(self.error) <= BAR

    def record(self) -> dict:
        d = asdict(self)
        mean, low, high = d.pop("mean"), d.pop("low"), d.pop("high")
        return {**d, "predicted": {"mean": mean, "low": low, "high": high},
                "error": self.error, "within_15": self.within_15}


def spread(center: list[float], ends: list[float]) -> tuple[float, float, float]:
    """Mean over the center's seeds; the interval over those and every end's value."""
    both = [x for x in center + ends if not math.isnan(x)]
    return sum(center) / len(center), min(both), max(both)


def reduction(disagg: dict, agg: dict, key: str) -> float:
    return 1.0 - disagg[key] / agg[key]


def itl_rows(center: list[dict], ends: list[dict], published: float) -> tuple[Row, dict]:
    """The scored ITL row (the seed's definition) and every definition's figures. `center` and
    `ends`: {"disagg": run, "agg": run} per seed / per end."""
    every = {}
    for name, (key, what) in ITL_DEFINITIONS.items():
        mean, low, high = spread([reduction(x["disagg"], x["agg"], key) for x in center],
                                 [reduction(x["disagg"], x["agg"], key) for x in ends])
        every[name] = {"what": what, "key": key, "mean": mean, "low": low, "high": high,
                       "error": mean / published - 1.0}
    seed = every[SEED_ITL]
    row = Row("p90 ITL, 1P:4D vs the same 5 workers aggregated, 66 sessions (reduction)",
              published, seed["mean"], seed["low"], seed["high"], "fraction",
              "seeds and pinned-knob ends", f"definition: {seed['what']}")
    return row, every


def point(figure: str, published: float, value: float, unit: str, note: str = "") -> Row:
    """A prediction no seed or pinned knob moves (aiconfigurator's memory model)."""
    return Row(figure, published, value, value, value, unit, "none: one deterministic model",
               note)


def ranged(figure: str, published: float, mean: float, values: list[float], unit: str,
           over: str, note: str = "") -> Row:
    return Row(figure, published, mean, min(values), max(values), unit, over, note)


def summary(rows: list[Row]) -> dict:
    hits = [r.figure for r in rows if r.within_15]
    return {"bar": BAR, "numeric": len(rows), "within_15": len(hits), "hits": hits,
            "misses": [r.figure for r in rows if not r.within_15]}

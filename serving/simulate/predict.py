"""The seed's other published figures, predicted at the calibrated knobs, never refitted to them
(issue 27): p90 ITL of P/D against aggregated workers at equal load, a decoder's KV tokens with
576- and 352-byte rows, and which P:D ratio serves the most sessions per GPU. (The KV-transfer
descriptors are `layouts`', from the descriptor model.) Each function returns its figures; the
CLI lays them side by side with the published ones.
"""

from __future__ import annotations

from serving.simulate.planner import Shape
from serving.simulate.sim import Sim

# 1:2 ... 1:6 and 2:k with k the same decode share (the seed chose 1:4 among such)
RATIOS = tuple(Shape(1, k) for k in range(2, 7)) + tuple(Shape(2, k) for k in (6, 8, 10))


def itl(sim: Sim, sessions: int) -> dict:
    """p90 ITL of 1P:4D and of the same 5 workers aggregated, both serving `sessions`."""
    disagg = sim.run(sim.fleet(1), sessions)
    agg = sim.run(sim.fleet(1, agg=True), sessions)
    return {"sessions": sessions, "disagg": disagg, "agg": agg,
            "reduction": 1 - disagg["itl_p90_ms"] / agg["itl_p90_ms"]}


def kv_tokens(sim: Sim) -> dict:
    """Tokens a decoder caches with the seed's 576-byte FP8 rows and with 352-byte NVFP4 rows
    (each plus the 132-byte indexer row), in aiconfigurator's memory budget."""
    fp8, nvfp4 = sim.capacity("fp8"), sim.capacity("nvfp4")
    return {"fp8": fp8, "nvfp4": nvfp4, "ratio": nvfp4 / fp8}


def capacity(sim: Sim, shape: Shape, low: int, high: int, resolution: float = 0.06) -> dict:
    """The most sessions `shape` serves at the target (bisection between `low` and `high`
    sessions per prefill worker, to `resolution`), and the run there."""
    fleet = sim.shape_fleet(shape)
    best, best_run, runs = 0, {}, []
    lo, hi = low * shape.prefill, high * shape.prefill
    if fleet is None:
        return {"sessions": 0, "run": {}, "runs": runs}
    while hi - lo > max(1, resolution * lo):
        mid = (lo + hi) // 2
        r = sim.run(fleet, mid)
        runs.append({"sessions": mid, **r})
        if r["ok"]:
            best, best_run, lo = mid, r, mid
        else:
            hi = mid
    return {"sessions": best, "run": best_run, "runs": runs}


def best_ratio(sim: Sim, low: int = 16, high: int = 128) -> dict:
    """Sessions per GPU at the target for each of RATIOS; the best one."""
    rows = []
    for shape in RATIOS:
        c = capacity(sim, shape, low, high)
        rows.append({"ratio": f"{shape.prefill}:{shape.decode}", "gpus": shape.gpus,
                     "sessions": c["sessions"], "sessions_per_gpu": c["sessions"] / shape.gpus,
                     "run": c["run"], "runs": c["runs"]})
    best = max(rows, key=lambda r: r["sessions_per_gpu"])
    return {"rows": rows, "best": best["ratio"] if best["sessions"] else None,
            "published": "1:4"}

"""The seed's other published figures, predicted at the calibrated knobs, never refitted to them
(issue 27): p90 ITL of P/D against aggregated workers at equal load, a decoder's KV tokens with
576- and 352-byte rows, and which P:D ratio serves the most sessions per GPU. (The KV-transfer
descriptors are `layouts`', from the descriptor model.) Each function returns its figures; the
CLI lays them side by side with the published ones.
"""

from __future__ import annotations

from planner.planner import Shape
from planner.sim import Sim, side_by_side

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


def same_ratio(a: str, b: str) -> bool:
    """Whether two fleets "P:D" have the same ratio (2:8 is 1:4 twice over)."""
    (pa, da), (pb, db) = (map(int, x.split(":")) for x in (a, b))
    return pa * db == pb * da


def best_ratio(sims: list[Sim], jobs: int = 1, low: int = 16, high: int = 128) -> dict:
    """Sessions per GPU at the target for each of RATIOS, searched once per seed (one Sim each,
    `jobs` searches side by side); the best ratio by the mean, and how often each won."""
    units = [(i, shape) for i in range(len(sims)) for shape in RATIOS]
    found = side_by_side(lambda unit: capacity(sims[unit[0]], unit[1], low, high), units, jobs)
    by_unit = dict(zip(units, found, strict=True))
    rows = []
    for shape in RATIOS:
        per_seed = [by_unit[(i, shape)] for i in range(len(sims))]
        counts = [c["sessions"] for c in per_seed]
        rows.append({"ratio": f"{shape.prefill}:{shape.decode}", "gpus": shape.gpus,
                     "sessions": sum(counts) / len(counts), "sessions_by_seed": counts,
                     "sessions_per_gpu": sum(counts) / len(counts) / shape.gpus,
                     "run": per_seed[0]["run"],
                     "runs": [{"seed": sims[i].cfg.seed, **x}
                              for i, c in enumerate(per_seed) for x in c["runs"]]})
    wins = {r["ratio"]: 0 for r in rows}
    for i in range(len(sims)):
        top = max(rows, key=lambda r: r["sessions_by_seed"][i] / r["gpus"])
        if top["sessions_by_seed"][i]:
            wins[top["ratio"]] += 1
    best = max(rows, key=lambda r: r["sessions_per_gpu"])
    return {"rows": rows, "best": best["ratio"] if best["sessions"] else None,
            "wins": wins, "seeds": [x.cfg.seed for x in sims], "published": "1:4",
            "simulations": sum(len(r["runs"]) for r in rows)}

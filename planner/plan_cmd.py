"""`python -m planner plan`: the fewest GPUs that serve `simulate.sessions` with tok/s per user
(its p10 by default: what the slowest users get) at the target and TTFT p90 within the SLO.

A fleet counts only if it meets the target under every setting it is judged in: each seed at
the calibrated knobs (`simulate.calibrated`), and each pinned knob at either end of its range
(the refitted knobs the calibration recorded there; an end the published point rules out is
left out). An end that cannot change a fleet is skipped for it (how much of the fitted gain
another layout gets, for a fleet of the fit's layout; a DEP prefill worker's overlap, for a
fleet without one). Settings run `jobs` at a time and a fleet's judging stops at its first
miss. Fleets report the NVL72 racks they take (72 GPUs a rack)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from planner import perf, planner
from planner.ends import End
from planner.sim import Sim, side_by_side
from planner.table import interval, print_table
from rollfleet.cli import ConfigError


def knob_ends(cfg) -> list[End]:
    """The consistent pinned ends the calibration JSON recorded (none without one)."""
    if not (cfg.knob_ends and cfg.calibrated):
        return []
    cal = json.loads(Path(cfg.calibrated).read_text())["calibration"]
    return [End(e["knob"], e["value"], e["knobs"], e["refitted"], e["consistent"])
            for e in cal.get("ends") or [] if e["consistent"]]


def matters(end: End, shape: planner.Shape, base: tuple[int, int]) -> bool:
    """Whether an end can change `shape`'s figures."""
    if end.knob == "layout_efficiency_carry":
        return {(shape.tp_prefill, shape.ep_prefill), (shape.tp_decode, shape.ep_decode)} != \
            {base}
    if end.knob == "dp_prefill_overlap":
        return shape.ep_prefill > shape.tp_prefill
    return True


def at(sim: Sim, knobs: dict[str, float]) -> Sim:
    typed = {k: type(getattr(sim.cfg, k))(v) for k, v in knobs.items()}
    return Sim(sim.serving, replace(sim.cfg, **typed), sim.work_dir, sim.cache_dir)


def racks(gpus: int, rack_gpus: int) -> int:
    return math.ceil(gpus / rack_gpus)


def cmd_plan(sim: Sim) -> dict:
    cfg = sim.cfg
    seeds = sim.seeded()
    at_ends = [(e, at(sim, e.knobs)) for e in knob_ends(cfg)]
    base = (sim.spec.tp, sim.spec.moe_ep)
    runs: dict[planner.Shape, dict] = {}

    def meets(shape: planner.Shape) -> bool:
        fleet = sim.shape_fleet(shape)
        if fleet is None:
            runs[shape] = {"ok": False, "fits": False, "why": "weights do not fit"}
            return False
        if cfg.policy == "kv_affine" and shape.decode < shape.prefill:
            runs[shape] = {"ok": False, "fits": False,
                           "why": "kv_affine: a prefill worker without a decoder of its own"}
            return False
        settings = [(f"seed {x.cfg.seed}", x) for x in seeds[:1]]
        settings += [(e.name, x) for e, x in at_ends if matters(e, shape, base)]
        settings += [(f"seed {x.cfg.seed}", x) for x in seeds[1:]]
        judged: list[dict] = []
        for i in range(0, len(settings), max(1, cfg.jobs)):
            batch = settings[i:i + max(1, cfg.jobs)]
            done = side_by_side(lambda u: u[1].run(u[1].shape_fleet(shape), cfg.sessions),
                                batch, cfg.jobs)
            judged += [{"setting": name, **r} for (name, _), r in zip(batch, done, strict=True)]
            if not all(r["ok"] for r in done):
                break
        sim.runs += len(judged)
        ok = len(judged) == len(settings) and all(r["ok"] for r in judged)
        runs[shape] = {"ok": ok, "settings": len(settings), "judged": len(judged),
                       "failed_at": next((r["setting"] for r in judged if not r["ok"]), None),
                       "racks": racks(shape.gpus, cfg.rack_gpus), "by_setting": judged}
        return ok

    layouts = [planner.parse_layout(x) for x in cfg.plan_layouts]
    for layout in layouts:  # every table before the search: a layout without data stops it here
        try:
            sim.at_layout(*layout)
        except perf.NoPerfData as exc:
            raise ConfigError(f"simulate.plan_layouts: {exc}") from None
    best, judged = planner.smallest(meets, cfg.plan_max_prefill, cfg.plan_max_decode, layouts)
    stat = "p10" if cfg.target_stat == "p10" else "mean"
    rows = []
    for s in judged:
        r = runs[s]
        if not r.get("fits", True):
            rows.append([s.name, s.gpus, "-", "-", "-", "-", r["why"]])
            continue
        by = r["by_setting"]
        key = "tok_s_user_p10" if stat == "p10" else "tok_s_user"
        rows.append([s.name, s.gpus, r["racks"], interval([x[key] for x in by]),
                     interval([x["ttft_p90_s"] for x in by], 2),
                     interval([x["output_tok_s"] / s.gpus for x in by]),
                     f"yes ({r['judged']} settings)" if r["ok"]
                     else f"no ({r['failed_at']}, {r['judged']} of {r['settings']} judged)"])
    print(f"judged under {len(seeds)} seeds at the calibrated knobs and {len(at_ends)} pinned "
          "knob ends (mean [min - max] over what was judged; a fleet counts if it meets the "
          "target under all)")
    table = print_table(["fleet", "GPUs", "NVL72 racks", f"tok/s/user {stat}", "TTFT p90 s",
                         "tok/s per GPU", "meets"], rows)
    grid = len(planner.grid(cfg.plan_max_prefill, cfg.plan_max_decode, layouts))
    target = (f"{cfg.sessions} sessions at >= {cfg.target_tok_s:.0f} tok/s/user ({stat}), "
              f"TTFT p90 <= {cfg.ttft_slo_s:g} s")
    if best is None:
        print(f"no fleet up to {cfg.plan_max_prefill}P:{cfg.plan_max_decode}D of "
              f"{', '.join(cfg.plan_layouts)} serves {target}")
    else:
        print(f"smallest fleet: {best.name}, {best.gpus} GPUs in "
              f"{racks(best.gpus, cfg.rack_gpus)} NVL72 rack(s), for {target} "
              f"({len(judged)} of {grid} fleets simulated)")
    return {"table": table, "best": vars(best) if best else None, "grid": grid,
            "seeds": [x.cfg.seed for x in seeds], "ends": [e.name for e, _ in at_ends],
            "target_stat": cfg.target_stat,
            "judged": [{**vars(s), "gpus": s.gpus, **runs[s]} for s in judged]}

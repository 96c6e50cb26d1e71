"""`python -m planner calibrate`: fit the knobs the seed does not publish to its one point, find
them again at each pinned knob's range ends, predict the seed's other figures at all of them
without refitting to those figures, and score each prediction against the published one
(planner/scorecard.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from planner import (
    calibrate,
    descriptors,
    ends,
    kv_layouts,
    pareto,
    perf,
    predict,
    scorecard,
    sensitivity,
)
from planner.connector import run_share
from planner.published import PUBLISHED, TOK_S_STAT
from planner.sim import Sim, side_by_side
from planner.table import interval, print_table


def inputs(cfg) -> list[dict]:
    """What the calibration takes, and whose each input is."""
    published = [{"input": k, "value": v, "kind": "published"} for k, v in PUBLISHED.items()
                 if k in ("tok_s_user", "sessions_per_prefill_group")]
    chosen = [{"input": k, "value": getattr(cfg, k), "kind": "project's choice"} for k in (
        "ttft_slo_s", "system", "perf_backend", "gpu_memory_utilization", "first_prompt",
        "growth", "max_prompt", "output", "kv_transport", "kv_layout")]
    knobs = [{"input": k.name, "value": k.value, "low": k.low, "high": k.high,
              "kind": f"fitted to {k.fitted_to}" if k.fitted_to else "pinned, with a range",
              "source": k.source} for k in calibrate.KNOBS.values()]
    share = run_share()
    measured = [{"input": "runs per moved block", "value": share.share, "low": share.low,
                 "high": share.high, "kind": "measured (the real connector)",
                 "source": share.source}]
    return published + chosen + knobs + measured


def cmd_calibrate(sim: Sim) -> dict:
    cfg, p = sim.cfg, PUBLISHED
    sessions = p["sessions_per_prefill_group"]
    made: list[Sim] = []

    def at(knobs: dict[str, float], seed: int = cfg.seed) -> Sim:
        """A simulation at `knobs`, judging tok/s per user as the seed published it."""
        typed = {k: type(getattr(cfg, k))(v) for k, v in knobs.items()}
        made.append(Sim(sim.serving, replace(cfg, seed=seed, target_stat=TOK_S_STAT, **typed),
                        sim.work_dir, sim.cache_dir))
        return made[-1]

    def measure(knobs: dict[str, float], seed: int = cfg.seed) -> dict:
        one = at(knobs, seed)
        return one.run(one.fleet(1), sessions)

    prior = json.loads(Path(cfg.calibrated).read_text()) if cfg.calibrated else None
    if prior:  # a committed fit's knobs: predictions without fitting again
        knobs = prior["calibration"]["knobs"]
        fit = calibrate.Fit(knobs, measure(knobs), [])
    else:
        fit = calibrate.fit(measure, p["tok_s_user"], cfg.ttft_slo_s)
    print(f"\ncalibration: 1P:4D, {sessions} sessions, to {p['tok_s_user']:.0f} tok/s per user "
          f"with TTFT p90 at the SLO ({cfg.ttft_slo_s:.0f} s); "
          + (f"knobs from {cfg.calibrated}" if prior else f"{len(fit.steps)} simulations"))
    cal_table = print_table(
        ["knob", "value", "plausible range", "fitted to", "source"],
        [[k.name, f"{fit.knobs[k.name]:.3g}"
          + ("" if k.low <= fit.knobs[k.name] <= k.high else " (OUTSIDE its range)"),
          f"{k.low:.3g} - {k.high:.3g}", k.fitted_to or "pinned", k.source]
         for k in calibrate.KNOBS.values()])
    seeds = range(cfg.seed, cfg.seed + max(1, cfg.seeds))
    at_ends = knob_ends(cfg, fit, prior, measure, sim) if cfg.knob_ends else []
    usable = [e for e in at_ends if e.consistent]
    point = [fit.result] + [measure(fit.knobs, s) for s in seeds[1:]]
    itl = side_by_side(lambda s: predict.itl(at(fit.knobs, s), sessions), list(seeds), cfg.jobs)
    itl_ends = side_by_side(lambda e: predict.itl(at(e.knobs), sessions), usable, cfg.jobs)
    if cfg.jobs > 1:  # run in worker processes: not counted by their Sims here
        sim.runs += 2 * (len(itl) + len(itl_ends))
    fitted = at(fit.knobs)
    kv = predict.kv_tokens(fitted)
    ratios = (predict.best_ratio([fitted] + [at(fit.knobs, s) for s in seeds[1:]], cfg.jobs)
              if cfg.predict_ratios else None)
    if ratios and cfg.jobs > 1:
        sim.runs += ratios["simulations"]
    rows, itl_all = score(cfg, sim.topo["kv_cache_dtype"], itl, itl_ends, kv)
    print(f"\nthe fit's point over {len(seeds)} seeds: tok/s per user "
          f"{interval([r['tok_s_user'] for r in point])}, TTFT p90 "
          f"{interval([r['ttft_p90_s'] for r in point], 2)} s")
    print_ends(at_ends)
    print(f"\nscorecard: predictions at the fitted knobs, not refitted ({len(seeds)} seeds, "
          f"{len(usable)} pinned-knob ends: mean [low - high]); within 15%: "
          f"{sum(r.within_15 for r in rows)} of {len(rows)}")
    card = print_table(["figure", "published", "predicted", "error", "within 15%"],
                       [[r.figure, f"{r.published:.4g}", f"{r.mean:.4g} [{r.low:.4g} - "
                         f"{r.high:.4g}]", f"{r.error:+.0%}", "hit" if r.within_15 else "miss"]
                        for r in rows])
    print_table(["ITL definition", "reduction, mean [low - high]", "error vs 40%"],
                [[v["what"], f"{v['mean']:.0%} [{v['low']:.0%} - {v['high']:.0%}]",
                  f"{v['error']:+.0%}"] for v in itl_all.values()])
    ratio_row = None
    if ratios:
        best = ratios["best"]
        won = ", ".join(f"{k} {n}" for k, n in ratios["wins"].items() if n)
        hit = bool(best) and predict.same_ratio(best, "1:4")
        ratio_row = {"figure": "the P:D ratio serving most sessions per GPU (1:2 ... 1:6, 2:k)",
                     "published": "1:4", "predicted": best, "wins": ratios["wins"],
                     "hit": hit, "interval_over": "seeds only (the search is most of the cost)"}
        print(f"best P:D ratio: {best or 'none'} (published 1:4; best in seeds: {won or 'none'})"
              f": {'hit' if hit else 'miss'}")
    title = f"GLM-5.3 on {cfg.system}, calibrated: {perf.version_label(fitted.spec)}"
    sweeps = None
    if cfg.sensitivity_plot:
        def measure_all(settings: list[dict[str, float]]) -> list[list[dict]]:
            units = [(i, s) for i in range(len(settings)) for s in seeds]
            done = side_by_side(lambda u: measure(settings[u[0]], u[1]), units, cfg.jobs)
            if cfg.jobs > 1:  # run in worker processes: not counted by their Sims here
                sim.runs += len(units)
            return [[r for u, r in zip(units, done, strict=True) if u[0] == i]
                    for i in range(len(settings))]

        sweeps = sensitivity.sweep(measure_all, fit.knobs)
        sensitivity.plot(sweeps, fit.knobs, Path(cfg.sensitivity_plot), title, cfg.target_tok_s,
                         cfg.ttft_slo_s)
    points = pareto_points(ratios["rows"] if ratios else [], cfg.ttft_slo_s)
    if cfg.pareto_plot and points:
        pareto.plot(points, Path(cfg.pareto_plot), title, cfg.target_tok_s)
    sim.runs += sum(one.runs for one in made)
    return {"table": cal_table + "\n\n" + card,
            "calibration": {"knobs": fit.knobs, "result": fit.result, "steps": fit.steps,
                            "sources": {k.name: vars(k) for k in calibrate.KNOBS.values()},
                            "seeds": list(seeds), "point": point,
                            "ends": [end_record(e) for e in at_ends]},
            "inputs": inputs(cfg),
            "scorecard": {"rows": [r.record() for r in rows] + ([ratio_row] if ratio_row else []),
                          "itl_definitions": itl_all, **scorecard.summary(rows)},
            "predictions": {"itl": itl, "itl_ends": [{"end": e.name, **x}
                                                     for e, x in zip(usable, itl_ends,
                                                                     strict=True)],
                            "kv_tokens": kv, "ratios": ratios},
            "sensitivity": sweeps,
            "pareto": {"points": points, "front": pareto.front(points)}}


def knob_ends(cfg, fit: calibrate.Fit, prior: dict | None, measure, sim: Sim) -> list[ends.End]:
    """The pinned ends: from the committed fit's JSON if it has them, else refitted here."""
    if prior and prior["calibration"].get("ends"):
        return [ends.End(e["knob"], e["value"], e["knobs"], e["refitted"], e["consistent"])
                for e in prior["calibration"]["ends"]]
    refit = ends.refitter(measure, PUBLISHED["tok_s_user"], cfg.ttft_slo_s)
    got = ends.ends(fit.knobs, refit, PUBLISHED["tok_s_user"], cfg.ttft_slo_s,
                    map_=lambda f, xs: side_by_side(f, xs, cfg.jobs))
    if cfg.jobs > 1:
        sim.runs += sum(len(e.fit.steps) for e in got if e.fit)
    return got


def end_record(e: ends.End) -> dict:
    return {"knob": e.knob, "value": e.value, "knobs": e.knobs, "refitted": e.refitted,
            "consistent": e.consistent,
            "result": e.fit.result if e.fit else None,
            "steps": len(e.fit.steps) if e.fit else 0}


def print_ends(at_ends: list[ends.End]) -> None:
    if not at_ends:
        return
    print("\nthe pinned knobs' range ends (one at a time; refitted where the fit's fleet depends "
          "on the knob):")
    print_table(["end", "decode efficiency", "prefill efficiency", "tok/s per user there",
                 "TTFT p90 s there", "meets the published point in range"],
                [[e.name, f"{e.knobs['decode_efficiency']:.3g}",
                  f"{e.knobs['prefill_efficiency']:.3g}",
                  f"{e.fit.result['tok_s_user']:.1f}" if e.fit else "-",
                  f"{e.fit.result['ttft_p90_s']:.1f}" if e.fit else "-",
                  ("yes" if e.consistent else "no: ruled out") if e.refitted else "no refit"]
                 for e in at_ends])


def score(cfg, dtype: str, itl: list[dict], itl_ends: list[dict], kv: dict
          ) -> tuple[list[scorecard.Row], dict]:
    """The eight numeric rows: ITL (the seed's definition), KV tokens at both rows and their
    ratio, descriptors and ms of a transfer in both layouts."""
    p = PUBLISHED
    itl_row, itl_all = scorecard.itl_rows(itl, itl_ends, p["itl_p90_reduction"])
    rows = [itl_row,
            scorecard.point("a decoder's KV tokens, 576-byte rows", p["fp8_tokens"], kv["fp8"],
                            "tokens"),
            scorecard.point("a decoder's KV tokens, 352-byte rows", p["nvfp4_tokens"],
                            kv["nvfp4"], "tokens"),
            scorecard.point("their ratio", p["nvfp4_tokens"] / p["fp8_tokens"], kv["ratio"],
                            "ratio")]
    # a transfer: the blocks each decoder lacked in the replay, the probe's runs per block,
    # the transport's constants; interval over seeds, ends, the share's and transport's ranges
    share = run_share()
    transport = descriptors.TRANSPORTS[cfg.kv_transport]
    slow, fast = descriptors.TRANSPORT_RANGES.get(cfg.kv_transport, (transport, transport))
    center = [x["disagg"]["transfer_blocks_mean"] for x in itl]
    every = center + [x["disagg"]["transfer_blocks_mean"] for x in itl_ends]
    mean_blocks = sum(center) / len(center)
    mid = kv_layouts.predict(dtype, mean_blocks, transport, share.share)
    corners = [kv_layouts.predict(dtype, b, t, s) for b in (min(every), max(every))
               for t in (slow, fast) for s in (share.low, share.high)]
    over = ("seeds, pinned-knob ends, the runs-per-block range, the transport's range")
    note = f"{mean_blocks:.0f} blocks a transfer (the replay's decoders' misses)"
    for layout, figure in (("per_layer", "descriptors of a TP8 worker's transfer, per-layer"),
                           ("block_major", "the same, block-major")):
        rows.append(scorecard.ranged(figure, p[f"{layout}_descriptors"], mid[layout],
                                     [c[layout] for c in corners], "descriptors", over, note))
    for layout, figure in (("per_layer", "its transfer time, per-layer"),
                           ("block_major", "its transfer time, block-major")):
        rows.append(scorecard.ranged(figure, p[f"{layout}_ms"], mid[f"{layout}_ms"],
                                     [c[f"{layout}_ms"] for c in corners], "ms", over, note))
    return rows, itl_all


def pareto_points(rows: list[dict], ttft_slo_s: float) -> list[dict]:
    """Every run of the ratio search as an operating point (ok: TTFT p90 within the SLO)."""
    return [{"label": r["ratio"], "per_user": x["tok_s_user"], "ttft_p90_s": x["ttft_p90_s"],
             "per_gpu": x["output_tok_s"] / r["gpus"], "sessions": x["sessions"],
             "ok": x["ttft_p90_s"] <= ttft_slo_s} for r in rows for x in r["runs"]]

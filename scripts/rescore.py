"""Re-score N records of a run from the records alone (rollout/rescore.py says how).

    python scripts/rescore.py RUN_DIR [--diffs 5] [--turns 20] [--tolerance 0.05]
                              [--base-url http://127.0.0.1:8000/v1] [--out rescore.json]

Rewards: every scored record with a diff (up to --diffs) is re-graded from its `final_diff`.
Logprobs: up to --turns turns are replayed with prompt logprobs, on a vLLM engine started here
with the run's model folder (provenance.model_path), or on a running vLLM server (--base-url).
Exit code 0 if every reward matches and every sampled token's logprob is within tolerance.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from datasets import load_from_disk
from omegaconf import OmegaConf

from envs import EnvConfig, load
from rollfleet.cli import bad_config, typed
from rollfleet.paths import ROOT
from rollfleet.run_dir import RunDir
from rollout.rescore import DEFAULT_TOLERANCE, check_logprobs, check_rewards
from serving import Endpoint, ModelConfig, ServingConfig, open_front_door
from serving.cluster import Cluster


async def replay(records, endpoint: Endpoint, turns: int):
    door = open_front_door(endpoint)
    try:
        return await check_logprobs(records, door.prompt_logprobs, turns)
    finally:
        await door.aclose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--diffs", type=int, default=5)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    ap.add_argument("--base-url", help="a running vLLM server serving the run's model")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    run = RunDir(args.run_dir)
    try:
        dataset = run.require_dataset()
    except FileNotFoundError as exc:
        return bad_config(str(exc))
    cfg = OmegaConf.load(run.config_file)
    records = [r for r in load_from_disk(str(dataset))
               if r["status"] != "infra_error"]
    with_diff = [r for r in records if r["final_diff"] and r["reward"] is not None]
    env = load(typed(EnvConfig, cfg.env, "env"))
    rewards = check_rewards(with_diff[:args.diffs], env)
    model = replace(typed(ModelConfig, cfg.model, "model"),
                    path=records[0]["provenance"]["model_path"])
    if args.base_url:
        endpoint = Endpoint(args.base_url, model.name, model.path)
        logprobs = asyncio.run(replay(records, endpoint, args.turns))
    else:
        with tempfile.TemporaryDirectory() as tmp, \
                Cluster(ServingConfig(), model, Path(tmp), ROOT / ".cache") as ep:
            logprobs = asyncio.run(replay(records, ep, args.turns))
    bad_rewards = [c for c in rewards if not c.ok]
    for c in rewards:
        print(f"reward {c.rollout_id}: recorded {c.recorded} rescored {c.rescored}"
              f"{' ' + c.error if c.error else ''}{'' if c.ok else '  MISMATCH'}")
    print(f"logprobs: {logprobs.turns} turns, {len(logprobs.diffs)} sampled tokens, "
          f"max |diff| {logprobs.max_abs:.4f} (at {logprobs.worst}), mean {logprobs.mean_abs:.5f}"
          f", tolerance {args.tolerance}; {logprobs.skipped} turns not comparable")
    ok = not bad_rewards and logprobs.max_abs <= args.tolerance and rewards and logprobs.turns
    if args.out:
        args.out.write_text(json.dumps({
            "run_dir": str(args.run_dir), "rewards_checked": len(rewards),
            "rewards_mismatched": [c.rollout_id for c in bad_rewards],
            "turns": logprobs.turns, "tokens": len(logprobs.diffs),
            "max_abs": logprobs.max_abs, "mean_abs": logprobs.mean_abs,
            "worst": logprobs.worst, "tolerance": args.tolerance, "ok": bool(ok)}, indent=2))
    print("rescore: OK" if ok else "rescore: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

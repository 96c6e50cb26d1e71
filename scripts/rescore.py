"""Re-score N records of a run from the records alone (rollout/reports/rescore.py says how).

    python scripts/rescore.py RUN_DIR [--records 20] [--diffs 5] [--mean 0.005] [--max 0.05]
                              [--out rescore.json]

Rewards: every scored record with a diff (up to --diffs) is re-graded from its `final_diff`.
Logprobs: up to --records records are recomputed, each turn by the checkpoint of its version:
version 0 is the run's model folder (provenance.model_path), later ones the checkpoints the run
kept (<run>/policy/checkpoints/index.json). Exit code 0 if every reward matches and the
recorded logprobs are within the tolerances (mean and max |recorded - recomputed|, nats).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from datasets import load_from_disk
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from envs import EnvConfig, load
from rollfleet.cli import bad_config, typed
from rollfleet.run_dir import RunDir
from rollout.reports.rescore import check_logprobs, check_rewards
from rollout.rl.behaviour import FIDELITY_MAX, FIDELITY_MEAN, SessionLogprobs
from serving.checkpoints import digest_of, read_index


def kept_checkpoints(run: RunDir, records: list[dict]) -> dict[int, tuple[str, str]]:
    """version -> (folder, digest): what the run kept, version 0 from the records' model."""
    kept = {v: (c.path, c.digest) for v, c in read_index(run.path).items()}
    if 0 not in kept:
        folder = records[0]["provenance"]["model_path"]
        kept[0] = (folder, digest_of(Path(folder)))
    return kept


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--records", type=int, default=20)
    ap.add_argument("--diffs", type=int, default=5)
    ap.add_argument("--mean", type=float, default=FIDELITY_MEAN)
    ap.add_argument("--max", type=float, default=FIDELITY_MAX)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    run = RunDir(args.run_dir)
    try:
        dataset = run.require_dataset()
    except FileNotFoundError as exc:
        return bad_config(str(exc))
    cfg = OmegaConf.load(run.config_file)
    records = [r for r in load_from_disk(str(dataset)) if r["status"] != "infra_error"]
    if not records:
        return bad_config(f"{dataset} holds no record to re-score")
    with_diff = [r for r in records if r["final_diff"] and r["reward"] is not None]
    env = load(typed(EnvConfig, cfg.env, "env"))
    rewards = check_rewards(with_diff[:args.diffs], env)
    model_dir = records[0]["provenance"]["model_path"]
    logprobs, skipped = check_logprobs(
        records[:args.records], kept_checkpoints(run, records),
        lambda folder: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(),
        SessionLogprobs(model_dir))
    bad_rewards = [c for c in rewards if not c.ok]
    for c in rewards:
        print(f"reward {c.rollout_id}: recorded {c.recorded} rescored {c.rescored}"
              f"{' ' + c.error if c.error else ''}{'' if c.ok else '  MISMATCH'}")
    s = logprobs.summary()
    print(f"logprobs: {s['turns']} turns, {s['tokens']} sampled tokens ({s['forced']} forced, "
          f"{s['forced_nonzero']} of them not 0), max |diff| {s['max_abs']:.4f} (at "
          f"{s['worst']}), mean {s['mean_abs']:.5f}; tolerance mean {args.mean}, max "
          f"{args.max}; the unmasked recompute: max {s['unmasked_max_abs']:.3f}, mean "
          f"{s['unmasked_mean_abs']:.4f}")
    for reason, ids in skipped.reasons.items():
        print(f"not re-scored ({reason}): {', '.join(ids[:5])}"
              f"{f' and {len(ids) - 5} more' if len(ids) > 5 else ''}")
    ok = bool(not bad_rewards and logprobs.holds(args.mean, args.max) and rewards)
    if args.out:
        args.out.write_text(json.dumps({
            "run_dir": str(args.run_dir), "rewards_checked": len(rewards),
            "rewards_mismatched": [c.rollout_id for c in bad_rewards], **s,
            "not_rescored": skipped.reasons, "tolerance_mean": args.mean,
            "tolerance_max": args.max, "ok": ok}, indent=2))
    print("rescore: OK" if ok else "rescore: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

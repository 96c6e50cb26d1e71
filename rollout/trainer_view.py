"""The trainer's view of a run: one row per scored session, the sequence exactly as sampled.

`input_ids` is the whole session as one token sequence (every prompt, then every completion, as
the server returned them; nothing re-tokenized), `loss_mask` is 1 on sampled tokens, and
`old_logprobs` holds the sampler's logprob on those positions (0.0 elsewhere). Sessions that
ended in an infrastructure error or whose history broke (README: prefix breaks), and sessions
that outlived the policy lag bound (`stale`), are left out; GRPO-style groups are `group_id`
with `sample_index` within it. Each row says which policy version sampled it (`policy_version`
of its first turn, `turn_policy_versions` of each), and `group_mixed` whether the rows of its
group come from more than one version.

    python -m rollout.trainer_view RUN_DIR   # (re)writes RUN_DIR/trainer from RUN_DIR/dataset
"""

from __future__ import annotations

import sys
from pathlib import Path

from datasets import Dataset, Features, List, Value, load_from_disk

from rollfleet.cli import bad_config
from rollfleet.run_dir import RunDir

TRAINED = ("ok", "truncated")  # statuses whose sessions ran to a scored end
TRAINER_FEATURES = Features({
    "rollout_id": Value("string"),
    "group_id": Value("string"),
    "sample_index": Value("int32"),
    "input_ids": List(Value("int32")),
    "loss_mask": List(Value("int8")),
    "old_logprobs": List(Value("float32")),
    "logprobs_mode": Value("string"),  # raw | processed: what `old_logprobs` are
    "temperature": Value("float32"),
    "reward": Value("float32"),
    "status": Value("string"),
    "policy_version": Value("int32"),
    "turn_policy_versions": List(Value("int32")),
    "group_mixed": Value("bool"),
})


def trainer_rows(records: Dataset) -> Dataset:
    keep = [i for i, (status, ok, reward, stale) in enumerate(zip(
        records["status"], records["prefix_consistent"], records["reward"], records["stale"],
        strict=True)) if status in TRAINED and ok and reward is not None and not stale]
    kept = records.select(keep)
    versions: dict[str, set[int]] = {}
    for r in kept:
        versions.setdefault(r["group_id"], set()).update(r["policy_versions"])
    rows = []
    for r in kept:
        first = r["turns"][0]
        rows.append({"rollout_id": r["rollout_id"], "group_id": r["group_id"],
                     "sample_index": r["sample_index"], "input_ids": r["token_ids"],
                     "loss_mask": r["loss_mask"], "old_logprobs": r["logprobs"],
                     "logprobs_mode": first["logprobs_mode"],
                     "temperature": first["temperature"], "reward": r["reward"],
                     "status": r["status"], "policy_version": r["policy_version"],
                     "turn_policy_versions": [t["policy_version"] for t in r["turns"]],
                     "group_mixed": len(versions[r["group_id"]]) > 1})
    if not rows:
        return Dataset.from_dict({k: [] for k in TRAINER_FEATURES}, features=TRAINER_FEATURES)
    return Dataset.from_list(rows, features=TRAINER_FEATURES)


def save_trainer_view(records: Dataset, out: Path) -> Dataset:
    view = trainer_rows(records)
    # an empty dataset saved in 0 shards cannot be loaded back (datasets 4): write one
    view.save_to_disk(str(out), num_shards=1 if not len(view) else None)
    return view


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m rollout.trainer_view RUN_DIR", file=sys.stderr)
        return 2
    run = RunDir(Path(argv[0]))
    try:
        dataset = load_from_disk(str(run.require_dataset()))
    except FileNotFoundError as exc:
        return bad_config(str(exc))
    view = save_trainer_view(dataset, run.trainer)
    print(f"{len(view)} sessions -> {run.trainer}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The trainer's view of a run: one row per scored session, the sequence exactly as sampled.

`input_ids` is the whole session as one token sequence (every prompt, then every completion, as
the server returned them; nothing re-tokenized), `loss_mask` is 1 on sampled tokens, and
`old_logprobs` holds the sampler's logprob on those positions (0.0 elsewhere). Sessions that
ended in an infrastructure error or whose history broke (README: prefix breaks) are left out;
GRPO-style groups are `group_id` with `sample_index` within it.

    python -m rollout.trainer_view RUN_DIR   # (re)writes RUN_DIR/trainer from RUN_DIR/dataset
"""

from __future__ import annotations

import sys
from pathlib import Path

from datasets import Dataset, Features, List, Value, load_from_disk

from rollfleet.cli import bad_config
from rollfleet.run_dir import RunDir

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
})


def trainer_rows(records: Dataset) -> Dataset:
    keep = [i for i, (status, ok, reward) in enumerate(zip(
        records["status"], records["prefix_consistent"], records["reward"], strict=True))
        if status != "infra_error" and ok and reward is not None]
    rows = []
    for r in records.select(keep):
        first = r["turns"][0]
        rows.append({"rollout_id": r["rollout_id"], "group_id": r["group_id"],
                     "sample_index": r["sample_index"], "input_ids": r["token_ids"],
                     "loss_mask": r["loss_mask"], "old_logprobs": r["logprobs"],
                     "logprobs_mode": first["logprobs_mode"],
                     "temperature": first["temperature"], "reward": r["reward"],
                     "status": r["status"]})
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

"""The trainer's view of a run: one row per scored session, the sequence exactly as sampled.

`input_ids` is the whole session as one token sequence (every prompt, then every completion, as
the server returned them; nothing re-tokenized), `loss_mask` is 1 on sampled tokens,
`old_logprobs` holds the sampler's logprob on those positions (0.0 elsewhere): with
`logprobs_mode=behaviour` the probability each token was sampled with, after every mask), and
`token_versions` the policy version that sampled each (-1 elsewhere). `turns` says where each
turn's tokens start and what they were sampled under (grammar, logit bias, temperature, top-p),
so that a trainer can replay the masks (rollout/rl/behaviour.py). Sessions that
ended in an infrastructure error or whose history broke (README: prefix breaks), and sessions
that outlived the policy lag bound (`stale`), are left out; GRPO-style groups are `group_id`
with `sample_index` within it. Each row says which policy version sampled it (`policy_version`
of its first turn, `turn_policy_versions` of each), and `group_mixed` whether the rows of its
group come from more than one version.

    python -m rollout.rl.trainer_view RUN_DIR   # (re)writes RUN_DIR/trainer from RUN_DIR/dataset
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetInfo, Features, List, Value, load_from_disk

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
    "token_versions": List(Value("int32")),
    "logprobs_mode": Value("string"),  # behaviour | raw: what `old_logprobs` are
    "temperature": Value("float32"),
    "reward": Value("float32"),
    "status": Value("string"),
    "policy_version": Value("int32"),
    "turn_policy_versions": List(Value("int32")),
    "group_mixed": Value("bool"),
    "turns": List({"start": Value("int32"),  # index of the turn's first sampled token
                   "length": Value("int32"), "temperature": Value("float32"),
                   "top_p": Value("float32"), "grammar": Value("string"),
                   "logit_bias": Value("string")}),
})


# the record columns a trainer row is made of
_READ = ["rollout_id", "group_id", "sample_index", "token_ids", "loss_mask", "logprobs",
         "token_versions", "turns", "reward", "status", "policy_version", "policy_versions",
         "prefix_consistent", "stale"]


def trainer_rows(records: Dataset) -> Dataset:
    """Column by column in arrow: reading the records row by row decoded every turn's prompt
    ids twice (1.4 ms of CPU a record, measured here)."""
    table = records.select_columns(_READ).with_format("arrow")[:]
    keep = pc.and_(pc.and_(pc.is_in(table["status"], pa.array(TRAINED)),
                           pc.fill_null(table["prefix_consistent"], False)),
                   pc.and_(pc.is_valid(table["reward"]),
                           pc.invert(pc.fill_null(table["stale"], False))))
    table = table.filter(keep).combine_chunks()
    if not table.num_rows:
        return Dataset.from_dict({k: [] for k in TRAINER_FEATURES}, features=TRAINER_FEATURES)
    turns = table["turns"].chunk(0)
    first = pc.list_element(turns, 0)
    versions: dict[str, set[int]] = {}
    groups = table["group_id"].to_pylist()
    for group, seen in zip(groups, table["policy_versions"].to_pylist(), strict=True):
        versions.setdefault(group, set()).update(seen)
    columns = {
        "rollout_id": table["rollout_id"], "group_id": table["group_id"],
        "sample_index": table["sample_index"], "input_ids": table["token_ids"],
        "loss_mask": table["loss_mask"], "old_logprobs": table["logprobs"],
        "token_versions": table["token_versions"],
        "logprobs_mode": pc.struct_field(first, "logprobs_mode"),
        "temperature": pc.struct_field(first, "temperature"),
        "reward": table["reward"], "status": table["status"],
        "policy_version": table["policy_version"],
        "turn_policy_versions": pa.ListArray.from_arrays(
            turns.offsets, pc.struct_field(turns.values, "policy_version")),
        "group_mixed": [len(versions[g]) > 1 for g in groups],
        "turns": _spans(turns),
    }
    view = pa.table(columns, schema=TRAINER_FEATURES.arrow_schema)
    return Dataset(view, info=DatasetInfo(features=TRAINER_FEATURES))


def _spans(turns: pa.ListArray) -> pa.ListArray:
    """Each turn's span of the sequence and what it was sampled under, from the records'
    turns (a turn's first sampled token sits right after its prompt)."""
    t = turns.values
    spans = pa.StructArray.from_arrays(
        [pc.list_value_length(pc.struct_field(t, "prompt_token_ids")).cast(pa.int32()),
         pc.list_value_length(pc.struct_field(t, "completion_token_ids")).cast(pa.int32()),
         pc.struct_field(t, "temperature"), pc.struct_field(t, "top_p"),
         pc.struct_field(t, "grammar"), pc.struct_field(t, "logit_bias")],
        names=["start", "length", "temperature", "top_p", "grammar", "logit_bias"])
    return pa.ListArray.from_arrays(turns.offsets, spans)


def save_trainer_view(records: Dataset, out: Path) -> Dataset:
    view = trainer_rows(records)
    # an empty dataset saved in 0 shards cannot be loaded back (datasets 4): write one
    view.save_to_disk(str(out), num_shards=1 if not len(view) else None)
    return view


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m rollout.rl.trainer_view RUN_DIR", file=sys.stderr)
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

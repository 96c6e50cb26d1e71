"""The record builder and the sink: one schema, built in one place, durable as it lands."""

import os
import stat
import subprocess
import sys
from dataclasses import replace

import pyarrow.parquet as pq
import pytest
from datasets import Dataset, load_dataset, load_from_disk
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.record import (
    FEATURES,
    Job,
    Outcome,
    PrefixBreak,
    Provenance,
    SessionTrace,
    ToolCallRecord,
    TurnPart,
    TurnRecord,
    build_record,
    error_record,
    prefix_break,
)
from rollout.rl.trainer_view import trainer_rows
from rollout.sink import RecordSink, SchemaError

PROV = Provenance("run-1", "tiny-glm", "/models/tiny", "abc", 7, '{"vllm": "0.31.0"}')


def _turn(index, prompt, completion, calls=()):
    return TurnRecord(index=index, prompt_token_ids=prompt, completion_token_ids=completion,
                      completion_logprobs=[-0.5] * len(completion), logprobs_mode="behaviour",
                      temperature=1.0, top_p=1.0, max_tokens=64, seed=11, finish_reason="stop",
                      content="", reasoning="", tool_calls=list(calls), constraint="c",
                      grammar="", logit_bias="{}", issues=[], dropped_calls=0, cached_tokens=1,
                      engine_id="0", prefill_engine_id="", latency_s=0.1, tool_s=0.0)


def _call(valid=True, issues=(), failed=False):
    return ToolCallRecord("c1", "bash", "{}", valid, "", failed, list(issues), "out")


def test_a_session_joins_into_one_sequence_with_a_loss_mask():
    trace = SessionTrace(turns=[_turn(0, [1, 2], [3, 4]), _turn(1, [1, 2, 3, 4, 5], [6])],
                         messages=[{"role": "user", "content": "hi"}])
    rec = build_record(Job("t", 0), PROV, Outcome("ok", "submitted", reward=1.0), trace)
    assert rec["prefix_consistent"] and rec["prefix_breaks"] == []
    assert rec["token_ids"] == [1, 2, 3, 4, 5, 6]
    assert rec["loss_mask"] == [0, 0, 1, 1, 0, 1]
    assert rec["logprobs"] == [0.0, 0.0, -0.5, -0.5, 0.0, -0.5]
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (7, 3)
    assert set(rec) == set(FEATURES)
    assert rec["provenance"]["model_path"] == "/models/tiny"


def test_a_break_empties_the_sequence_and_says_where():
    trace = SessionTrace(turns=[_turn(0, [1, 2], [3]), _turn(1, [1, 9, 3, 5], [6])],
                         breaks=[PrefixBreak(1, 1, "because")])
    rec = build_record(Job("t", 0), PROV, Outcome("ok", "submitted", reward=0.0), trace)
    assert not rec["prefix_consistent"] and rec["token_ids"] == rec["loss_mask"] == []
    assert rec["prefix_breaks"] == [{"turn": 1, "position": 1, "reason": "because"}]


def test_prefix_break_finds_the_first_difference():
    assert prefix_break([1, 2, 3], [1, 2, 3, 4]) is None
    assert prefix_break([1, 2, 3], [1, 9, 3, 4]) == 1
    assert prefix_break([1, 2, 3], [1, 2]) == 2  # the prompt is shorter than what was seen


def test_counts_come_from_the_calls():
    calls = [_call(), _call(False, ["invalid_utf8"]), _call(failed=True)]
    rec = build_record(Job("t", 0), PROV, Outcome("ok", "submitted", reward=0.0),
                       SessionTrace(turns=[_turn(0, [1], [2], calls)]))
    assert (rec["num_tool_calls"], rec["num_invalid_tool_calls"]) == (3, 1)
    assert rec["tool_call_issues"]["invalid_utf8"] == 1 and rec["tool_call_issues"]["failed"] == 1


def _record(job, status="ok", reward=1.0):
    if status == "infra_error":
        return error_record(job, PROV, "engine down")
    trace = SessionTrace(turns=[_turn(0, [1], [2])])
    return build_record(job, PROV, Outcome(status, "submitted", reward=reward), trace)


def test_records_written_together_are_one_file_on_disk_when_write_returns(tmp_path):
    sink = RecordSink(tmp_path, shard_size=2)
    sink.write([_record(Job("a", 0)), _record(Job("a", 1), reward=0.0)])
    sink.write([_record(Job("b", 0))])
    first, second = sink.parts()
    assert pq.read_table(first).to_pydict()["rollout_id"] == ["a/0", "a/1"]
    assert pq.read_table(first).to_pydict()["reward"] == [1.0, 0.0]
    assert pq.read_table(second)["rollout_id"].to_pylist() == ["b/0"]
    assert not list((tmp_path / "data").glob("*.tmp"))


def test_a_record_reads_back_from_its_part_file_as_datasets_stores_it(tmp_path):
    """The sink hands records to pyarrow as they are, without datasets' encode_example."""
    calls = [_call(), _call(False, ["invalid_utf8"]), _call(failed=True)]
    trace = SessionTrace(turns=[_turn(0, [1, 2], [3, 4], calls), _turn(1, [1, 2, 3, 4, 5], [6])],
                         breaks=[PrefixBreak(1, 2, "re-rendered")])
    rec = build_record(Job("t", 0), PROV, Outcome("ok", "submitted", reward=0.5), trace)
    error = error_record(Job("t", 1), PROV, "engine down")
    sink = RecordSink(tmp_path)
    sink.write([rec, error])
    stored = Dataset.from_list([rec, error], features=FEATURES)
    assert pq.read_table(sink.parts()[0]).to_pylist() == stored.to_list()
    assert stored[0]["turns"][0]["tool_calls"][1]["issues"] == ["invalid_utf8"]


def test_the_sink_refuses_keys_outside_the_schema_and_writes_none_of_the_batch(tmp_path):
    sink = RecordSink(tmp_path)
    with pytest.raises(SchemaError, match=r"unknown keys \['surprise'\]"):
        sink.write([_record(Job("a", 1)), {**_record(Job("a", 0)), "surprise": 1}])
    rec = _record(Job("a", 0))
    del rec["reward"]
    with pytest.raises(SchemaError, match=r"missing keys \['reward'\]"):
        sink.write([rec])
    assert sink.parts() == []


def test_compaction_resume_and_retries(tmp_path):
    sink = RecordSink(tmp_path, shard_size=2)
    sink.write([_record(Job("a", 0))])
    sink.write([_record(Job("a", 1), status="infra_error")])
    sink.write([_record(Job("b", 0))])
    sink.compact()
    assert len(sink.shards()) == 2 and sink.parts() == []
    resumed = RecordSink(tmp_path)
    assert resumed.done_ids() == {"a/0", "b/0"}  # infra errors are run again
    resumed.write([_record(Job("a", 1))])  # the retry
    # readable mid-run as parquet, shards and single records together
    mid = load_dataset("parquet", data_dir=str(tmp_path / "data"), split="train")
    assert sorted(mid["rollout_id"]) == ["a/0", "a/1", "a/1", "b/0"]
    ds = resumed.finalize()
    assert sorted(ds["rollout_id"]) == ["a/0", "a/1", "b/0"]
    assert load_from_disk(str(tmp_path / "dataset"))["status"].count("infra_error") == 0


_KILLED_WRITER = """
import os, signal, sys
from rollout.record import Job
from tests.rollout.test_record import _record
from rollout.sink import RecordSink
sink = RecordSink(__import__("pathlib").Path(sys.argv[1]))
for i in range(3):
    sink.write([_record(Job("k", i))])
    print(i, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_records_written_before_a_sigkill_survive(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == -9 and proc.stdout.split() == ["0", "1", "2"]
    assert RecordSink(tmp_path).done_ids() == {"k/0", "k/1", "k/2"}


def test_each_record_and_its_folder_entry_are_fsynced(tmp_path, monkeypatch):
    """On disk means on disk: the file's bytes and the folder's entry for its new name are
    both fsynced before write returns (a power loss keeps every counted record)."""
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_mode), real(fd)))
    RecordSink(tmp_path).write([_record(Job("a", 0))])
    assert [stat.S_ISREG(m) for m in synced] == [True, False]  # the file, then its folder
    assert stat.S_ISDIR(synced[1])


def test_shards_hold_whole_parts_of_at_least_shard_size_rows_in_order(tmp_path):
    sink = RecordSink(tmp_path, shard_size=3)
    batches = [["a"], ["b", "c"], ["d", "e", "f", "g"], ["h"]]
    for batch in batches:
        sink.write([_record(Job(t, 0)) for t in batch])
    sink.compact()
    shards = [pq.read_table(s)["task_id"].to_pylist() for s in sink.shards()]
    assert shards == [["a", "b", "c"], ["d", "e", "f", "g"], ["h"]] and sink.parts() == []


def test_the_trainer_view_leaves_out_what_no_trainer_should_see():
    ok = _record(Job("a", 0))
    broken = build_record(Job("a", 1), PROV, Outcome("ok", "submitted", reward=1.0),
                          SessionTrace(turns=[_turn(0, [1, 2], [3])],
                                       breaks=[PrefixBreak(0, 0, "x")]))
    stale = build_record(Job("a", 2), PROV, Outcome("ok", "submitted", reward=1.0),
                         SessionTrace(turns=[_turn(0, [1, 2], [3])], stale=True))
    rows = [ok, broken, stale, error_record(Job("a", 3), PROV, "engine down"),
            error_record(Job("a", 4), PROV, "Traceback: bug", status="error"),
            build_record(Job("a", 5), PROV, Outcome("stale", "policy_lag"))]
    view = trainer_rows(Dataset.from_list(rows, features=FEATURES))
    assert view["rollout_id"] == ["a/0"]
    assert view["policy_version"] == [0] and view["turn_policy_versions"] == [[0]]


def test_a_trainer_row_is_its_session_as_sampled_with_its_group_s_versions():
    newer = [replace(_turn(0, [1, 2], [3, 4]), policy_version=1),
             replace(_turn(1, [1, 2, 3, 4, 9], [5]), policy_version=2, temperature=0.7)]
    mixed = build_record(Job("b", 1), PROV, Outcome("truncated", "max_turns", reward=0.0),
                         SessionTrace(turns=newer))
    rows = [_record(Job("a", 0)), _record(Job("b", 0)), mixed]
    view = trainer_rows(Dataset.from_list(rows, features=FEATURES)).to_list()
    assert [r["rollout_id"] for r in view] == ["a/0", "b/0", "b/1"]
    assert [r["group_mixed"] for r in view] == [False, True, True]
    last = view[2]
    assert last["input_ids"] == mixed["token_ids"] == [1, 2, 3, 4, 9, 5]
    assert last["loss_mask"] == mixed["loss_mask"] == [0, 0, 1, 1, 0, 1]
    assert last["old_logprobs"] == mixed["logprobs"]
    assert (last["policy_version"], last["turn_policy_versions"]) == (1, [1, 2])
    assert (last["logprobs_mode"], last["temperature"], last["status"]) == (
        "behaviour", 1.0, "truncated")


def test_a_run_that_finished_nothing_saves_an_empty_dataset_with_the_schema(tmp_path):
    """(datasets 5.2 cannot load a saved dataset of 0 rows back: README, Known limits.)"""
    ds = RecordSink(tmp_path).finalize()
    assert len(ds) == 0 and set(ds.features) == set(FEATURES)
    assert (tmp_path / "dataset" / "dataset_info.json").is_file()


# -- properties over generated sessions ---------------------------------------------------------

_tokens = st.lists(st.integers(0, 9), max_size=4)


@st.composite
def _session(draw):
    """Turns whose prompts each extend the last prompt + completion by what the environment
    added, and beside them what the joined sequence must be: ids, mask, logprobs, versions."""
    want = {"token_ids": draw(_tokens.filter(bool)), "logprobs": [], "token_versions": []}
    want["loss_mask"] = [0] * len(want["token_ids"])
    want["logprobs"], want["token_versions"] = [0.0] * len(want["loss_mask"]), [-1] * len(
        want["loss_mask"])
    turns = []
    for index in range(draw(st.integers(0, 4))):
        if index:  # the tool's output and the next turn's markup
            added = draw(_tokens)
            want["token_ids"] += added
            want["loss_mask"] += [0] * len(added)
            want["logprobs"] += [0.0] * len(added)
            want["token_versions"] += [-1] * len(added)
        completion = draw(_tokens)
        turn = _turn(index, list(want["token_ids"]), completion)
        turn.completion_logprobs = draw(st.lists(st.sampled_from([-2.0, -0.25, 0.0]),
                                                 min_size=len(completion),
                                                 max_size=len(completion)))
        cut = draw(st.integers(0, len(completion)))  # an update may cut the turn in two parts
        turn.policy_version = draw(st.integers(0, 3))
        if draw(st.booleans()):
            turn.parts = [TurnPart(turn.policy_version, "a", cut),
                          TurnPart(turn.policy_version + 1, "b", len(completion) - cut)]
        versions = [p.version for p in turn.parts for _ in range(p.tokens)] if turn.parts \
            else [turn.policy_version] * len(completion)
        want["token_ids"] += completion
        want["loss_mask"] += [1] * len(completion)
        want["logprobs"] += turn.completion_logprobs
        want["token_versions"] += versions
        turns.append(turn)
    return turns, want


@settings(max_examples=200)
@given(session=_session(), broken=st.booleans(), attempt=st.integers(0, 2),
       reward=st.sampled_from([None, 0.0, 1.0]))
def test_a_session_of_any_length_joins_into_its_sequence_or_none(session, broken, attempt,
                                                                  reward):
    """The trainer reads token_ids, loss_mask, logprobs and token_versions as one aligned
    sequence: exactly the session's tokens with the sampled ones masked in, or nothing when a
    prefix broke or no turn ran (no sequence, no training on it). Counts add up over turns,
    the versions are those that sampled a token, a retry keeps its rollout id, and an unscored
    rollout has no reward_info."""
    turns, want = session
    breaks = [PrefixBreak(len(turns) - 1, 0, "re-rendered")] if broken and turns else []
    rec = build_record(Job("t", 3, attempt), PROV, Outcome("ok", "submitted", reward=reward),
                       SessionTrace(turns=turns, breaks=breaks))
    consistent = bool(turns) and not breaks
    joined = {k: rec[k] for k in want}
    assert joined == (want if consistent else dict.fromkeys(want, []))
    assert rec["prefix_consistent"] == consistent
    assert (rec["num_turns"], rec["prompt_tokens"], rec["completion_tokens"]) == (
        len(turns), sum(len(t.prompt_token_ids) for t in turns),
        sum(len(t.completion_token_ids) for t in turns))
    assert rec["policy_version"] == (turns[0].policy_version if turns else 0)
    assert rec["policy_versions"] == sorted(set(want["token_versions"]) - {-1})
    assert (rec["rollout_id"], rec["attempt"]) == ("t/3", attempt)
    assert (rec["reward_info"] is None) == (reward is None)
    assert set(rec) == set(FEATURES)
    FEATURES.encode_example(rec)


@settings(max_examples=300)
@given(sequence=_tokens, prompt=_tokens, shared=st.integers(0, 4))
def test_prefix_break_is_the_first_position_the_prompt_leaves_the_sequence(sequence, prompt,
                                                                           shared):
    """A prompt that extends the sequence is no break; else the break is the first position of
    the sequence that the prompt does not repeat (where it differs, or where it ends)."""
    prompt = sequence[:shared] + prompt  # often a common head, so breaks land past position 0
    where = next((i for i in range(len(sequence))
                  if i >= len(prompt) or prompt[i] != sequence[i]), None)
    assert prefix_break(sequence, prompt) == where

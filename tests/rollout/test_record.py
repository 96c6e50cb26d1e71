"""The record builder and the sink: one schema, built in one place, durable as it lands."""

import os
import stat
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta

import numpy as np
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, List, load_dataset, load_from_disk
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
    experts_fields,
    prefix_break,
)
from rollout.rl.trainer_view import TRAINER_FEATURES, trainer_rows
from rollout.rl.trainer_view import main as trainer_view_main
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


def _schema_keys(value, feature, where="record"):
    """Every dict of a record, nested ones included, has exactly its schema's keys."""
    if isinstance(feature, List):
        for i, item in enumerate(value or []):
            _schema_keys(item, feature.feature, f"{where}[{i}]")
    elif isinstance(feature, dict) and value is not None:
        assert set(value) == set(feature), where
        for key, sub in feature.items():
            _schema_keys(value[key], sub, f"{where}.{key}")


def test_every_field_of_a_record_nested_ones_included_is_the_schema_s_and_says_what_it_got():
    """A session with tool calls, parts, messages, labels and a score; an unscored one."""
    calls = [ToolCallRecord("c1", "bash", '{"cmd": "ls"}', False, "", True, ["malformed"], "o")]
    first = replace(_turn(0, [1, 2], [3, 4], calls), dropped_calls=2, issues=["cut_off"])
    second = replace(_turn(1, [1, 2, 3, 4, 5], [6], calls), dropped_calls=1,
                     issues=["cut_off", "subtoken_markup"],
                     parts=[TurnPart(0, "d0", 0), TurnPart(1, "d1", 1)])
    messages = [{"role": "user", "content": "fix it"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "function": {"name": "bash"}}]},
                {"role": "tool", "content": "out", "tool_call_id": "c1"}]
    trace = SessionTrace(turns=[first, second], messages=messages, node_id="n1",
                         labels=("hard", "strings"))
    outcome = Outcome("ok", "submitted", reward=1.0, tests_total=3, tests_failed=1,
                      test_output="3 tests")
    rec = build_record(Job("t", 0), PROV, outcome, trace)
    _schema_keys(rec, FEATURES)
    assert (rec["task_difficulty"], rec["task_category"], rec["node_id"]) == (
        "hard", "strings", "n1")
    assert rec["reward_info"] == {"tests_total": 3, "tests_failed": 1, "output": "3 tests"}
    assert rec["messages"] == [
        {"role": "user", "content": "fix it", "tool_calls": "", "tool_call_id": ""},
        {"role": "assistant", "content": "",
         "tool_calls": '[{"id": "c1", "function": {"name": "bash"}}]', "tool_call_id": ""},
        {"role": "tool", "content": "out", "tool_call_id": "c1", "tool_calls": ""}]
    assert [(t["prompt_tokens"], t["completion_tokens"]) for t in rec["turns"]] == [(2, 2),
                                                                                  (5, 1)]
    counts = rec["tool_call_issues"]
    assert (counts["dropped"], counts["cut_off"], counts["subtoken_markup"]) == (3, 2, 1)
    assert (counts["malformed"], counts["failed"], counts["invalid_utf8"]) == (2, 2, 0)
    stamp = rec["provenance"]
    assert {k: stamp[k] for k in stamp if k != "created_at"} == {
        "model": "tiny-glm", "model_path": "/models/tiny", "config_hash": "abc", "seed": 7,
        "versions": '{"vllm": "0.31.0"}', "checkpoint": ""}
    assert datetime.fromisoformat(stamp["created_at"]).utcoffset() == timedelta(0)
    unscored = build_record(Job("t", 1), PROV, Outcome("infra_error", "error"))
    _schema_keys(unscored, FEATURES)
    assert unscored["reward_info"] is None and unscored["tool_call_issues"]["dropped"] == 0


def test_an_error_record_keeps_the_error_and_stops_on_error():
    rec = error_record(Job("t", 2), PROV, "actor died")
    assert (rec["status"], rec["stop_reason"], rec["error"]) == ("infra_error", "error",
                                                                 "actor died")
    assert rec["reward"] is None and rec["turns"] == [] and not rec["prefix_consistent"]


def test_routed_experts_are_kept_as_bytes_of_uint8_ids_with_their_shape_and_start():
    assert experts_fields(None, 4) == {}
    kept = experts_fields([[[0, 255]], [[7, 1]]], 5)
    assert kept == {"routed_experts": bytes([0, 255, 7, 1]), "routed_experts_shape": [2, 1, 2],
                    "routed_experts_start": 5}
    assert experts_fields([[3]], None)["routed_experts_start"] == 0
    assert experts_fields(np.zeros((0, 2, 1), dtype=np.int64), 1)["routed_experts"] == b""
    with pytest.raises(ValueError, match="expert ids up to 256 do not fit uint8"):
        experts_fields([[256]], 0)


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


def test_a_trainer_row_says_where_each_turn_s_tokens_start_and_what_they_were_sampled_under():
    turns = [_turn(0, [1, 2], [3, 4]),
             replace(_turn(1, [1, 2, 3, 4, 9], [5]), temperature=0.5, top_p=0.9,
                     grammar="root ::= x", logit_bias='{"7": -100}')]
    rec = build_record(Job("a", 0), PROV, Outcome("ok", "submitted", reward=1.0),
                       SessionTrace(turns=turns))
    view = trainer_rows(Dataset.from_list([rec], features=FEATURES))
    assert view.features == TRAINER_FEATURES
    assert view[0]["turns"] == [
        {"start": 2, "length": 2, "temperature": 1.0, "top_p": 1.0, "grammar": "",
         "logit_bias": "{}"},
        {"start": 5, "length": 1, "temperature": 0.5, "top_p": pytest.approx(0.9),
         "grammar": "root ::= x", "logit_bias": '{"7": -100}'}]


def test_a_group_of_two_versions_is_mixed_and_one_of_a_single_version_is_not():
    def sampled(task, i, version):
        turn = replace(_turn(0, [1], [2]), policy_version=version)
        return build_record(Job(task, i), PROV, Outcome("ok", "submitted", reward=1.0),
                            SessionTrace(turns=[turn]))
    rows = [sampled("a", 0, 0), sampled("a", 1, 1), sampled("b", 0, 1), sampled("b", 1, 1)]
    view = trainer_rows(Dataset.from_list(rows, features=FEATURES))
    assert view["group_mixed"] == [True, True, False, False]


def test_a_record_of_unknown_staleness_is_trained_and_one_of_unknown_consistency_is_not():
    """Records written before these fields existed read them as null."""
    stale_unknown = _record(Job("a", 0)) | {"stale": None}
    consistency_unknown = _record(Job("a", 1)) | {"prefix_consistent": None}
    view = trainer_rows(Dataset.from_list([stale_unknown, consistency_unknown],
                                          features=FEATURES))
    assert view["rollout_id"] == ["a/0"]


def test_the_trainer_view_of_a_run_is_written_beside_its_dataset_and_reads_back(tmp_path,
                                                                                capsys):
    """`python -m rollout.rl.trainer_view RUN_DIR`; a view of no session reads back too."""
    for name, rows in [("run", [_record(Job("a", 0)), _record(Job("a", 1), reward=None)]),
                       ("empty", [error_record(Job("a", 0), PROV, "engine down")])]:
        Dataset.from_list(rows, features=FEATURES).save_to_disk(str(tmp_path / name / "dataset"))
        assert trainer_view_main([str(tmp_path / name)]) == 0
        view = load_from_disk(str(tmp_path / name / "trainer"))
        assert view.features == TRAINER_FEATURES and len(view) == len(rows) - 1
    assert "1 sessions -> " in capsys.readouterr().out
    assert trainer_view_main([]) == 2
    assert "usage: python -m rollout.rl.trainer_view RUN_DIR" in capsys.readouterr().err
    assert trainer_view_main([str(tmp_path / "nothing")]) == 2
    assert "is not a finished run folder" in capsys.readouterr().err


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

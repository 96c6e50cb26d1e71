from datasets import load_from_disk

from rollout.record import flatten_turns
from rollout.scheduler import infra_error_record
from rollout.session import Job
from rollout.sink import RecordSink


def _turn(prompt, completion):
    return {"prompt_token_ids": prompt, "completion_token_ids": completion,
            "completion_logprobs": [-0.5] * len(completion)}


def test_flatten_consistent_turns():
    turns = [_turn([1, 2], [3, 4]), _turn([1, 2, 3, 4, 5], [6])]
    ok, tokens, mask, logprobs = flatten_turns(turns)
    assert ok
    assert tokens == [1, 2, 3, 4, 5, 6]
    assert mask == [0, 0, 1, 1, 0, 1]
    assert logprobs == [0.0, 0.0, -0.5, -0.5, 0.0, -0.5]


def test_flatten_refuses_a_rewritten_history():
    assert flatten_turns([_turn([1, 2], [3]), _turn([1, 9, 3, 5], [6])])[0] is False
    assert flatten_turns([])[0] is False


def _record(job, status="ok", reward=1.0):
    rec = infra_error_record(job, "")
    rec.update(status=status, reward=reward, error="", run_id="r",
               turns=[{**_turn([1], [2]), "index": 0, "tool_calls": []}])
    return rec


def test_sink_writes_shards_and_resumes(tmp_path):
    sink = RecordSink(tmp_path, shard_size=2)
    sink.write(_record(Job("a", 0)))
    sink.write(_record(Job("a", 1), status="infra_error", reward=None))
    sink.write(_record(Job("b", 0)))
    sink.flush()
    assert len(sink.shards()) == 2
    resumed = RecordSink(tmp_path)
    assert resumed.done_ids() == {"a/0", "b/0"}  # infra errors are run again
    resumed.write(_record(Job("a", 1)))  # the retry
    ds = resumed.finalize()
    assert sorted(ds["rollout_id"]) == ["a/0", "a/1", "b/0"]
    assert load_from_disk(str(tmp_path / "dataset"))["status"].count("infra_error") == 0
    row = ds[0]
    assert row["turns"][0]["prompt_token_ids"] == [1]

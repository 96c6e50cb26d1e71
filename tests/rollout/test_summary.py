"""The summary's arithmetic: sums over records, statuses counted, nothing unscored averaged."""

import pytest

from rollout.record import Job, Outcome, Provenance, SessionTrace, ToolCallRecord, build_record
from rollout.summary import SUMMARY_FIELDS, RunningTally, summarize
from tests.rollout.test_record import _turn

PROV = Provenance("run", "m", "/m", "h", 0, "{}")


def _records():
    bad = ToolCallRecord("c", "bash", "{}", False, "", False, ["invalid_utf8"], "")
    failed = ToolCallRecord("d", "bash", "{}", True, "", True, [], "")
    return [
        build_record(Job("a", 0), PROV, Outcome("ok", "submitted", reward=1.0),
                     SessionTrace(turns=[_turn(0, [1, 2], [3]), _turn(1, [1, 2, 3, 9], [4])])),
        build_record(Job("a", 1), PROV, Outcome("truncated", "max_turns", reward=0.0),
                     SessionTrace(turns=[_turn(0, [1], [2, 3], [bad, failed])])),
        build_record(Job("b", 0), PROV, Outcome("infra_error", "error", "down")),
        build_record(Job("b", 1), PROV, Outcome("error", "error", "Traceback")),
    ]


def test_sums_counts_and_the_mean_of_scored_rewards():
    s = summarize(_records(), wall_s=2.0)
    assert (s["tasks"], s["rollouts"], s["ok"], s["truncated"], s["infra_error"],
            s["error"]) == (2, 4, 1, 1, 1, 1)
    assert s["mean_reward"] == pytest.approx(0.5)  # the two scored rollouts only
    assert (s["turns"], s["tool_calls"], s["invalid_tool_calls"]) == (3, 2, 1)
    assert (s["prompt_tokens"], s["completion_tokens"]) == (2 + 4 + 1, 1 + 1 + 2)
    assert s["cached_tokens"] == 3 and s["completion_tokens_per_s"] == pytest.approx(2.0)
    assert (s["calls_invalid_utf8"], s["calls_failed"]) == (1, 1)


def test_a_run_s_dataset_is_read_for_the_summary_fields_alone():
    records = _records()
    fields = [{k: r[k] for k in SUMMARY_FIELDS} for r in records]
    assert summarize(fields, wall_s=2.0) == summarize(records, wall_s=2.0)


def test_no_records_is_zeros_not_an_error():
    s = summarize([], wall_s=0.0)
    assert s["rollouts"] == 0 and s["mean_reward"] == 0.0 and s["completion_tokens_per_s"] == 0


def test_the_progress_tally_keeps_sums_not_records():
    records = [
        build_record(Job("a", 0), PROV, Outcome("ok", "submitted", reward=1.0),
                     SessionTrace(turns=[_turn(0, [1, 2], [3, 4, 5])])),
        build_record(Job("a", 1), PROV, Outcome("ok", "submitted", reward=0.0),
                     SessionTrace(turns=[_turn(0, [1], [2])])),
        build_record(Job("b", 0), PROV, Outcome("infra_error", "error", "down")),
    ]
    tally = RunningTally()
    assert tally.line(running=3, elapsed_s=0.0) == "running 3  failed 0  0 tok/s  reward -"
    for record in records:
        tally.add(record)
    assert tally.line(running=1, elapsed_s=2.0) == "running 1  failed 1  2 tok/s  reward 0.500"

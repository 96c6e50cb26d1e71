"""Corpus filters and exports, on records made by the real builder."""

from datasets import load_from_disk

from rollout.record import (
    Job,
    Outcome,
    PrefixBreak,
    Provenance,
    SessionTrace,
    ToolCallRecord,
    build_record,
)
from rollout.reports.corpus import CorpusConfig, build, corpus_message, select
from tests.rollout.test_record import _turn

PROV = Provenance("run", "m", "/m", "h", 0, "{}")
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def _rec(task, i, reward=1.0, status="ok", diff="diff --git a/x b/x\n", invalid=False,
         failed=False, turns=1, broken=False):
    call = ToolCallRecord("c1", "bash", '{"command": "ls"}', not invalid, "", failed,
                          ["malformed"] if invalid else [], "out")
    sequence = [_turn(n, [1, 2] + [3, 4, 5] * n, [3, 4, 5][:2 + (n > 0)], [call])
                for n in range(turns)]
    trace = SessionTrace(turns=sequence, breaks=[PrefixBreak(0, 0, "x")] if broken else [],
                         messages=[
        {"role": "user", "content": "fix"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash",
                                                          "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"}])
    return build_record(Job(task, i), PROV, Outcome(status, "submitted", reward=reward,
                                                    final_diff=diff), trace)


def test_filters_apply_in_order_and_count_what_they_removed():
    records = [_rec("a", 0), _rec("a", 1), _rec("a", 2, diff="other"), _rec("a", 3, diff="3"),
               _rec("b", 0, reward=0.0), _rec("b", 1, status="truncated"),
               _rec("b", 2, invalid=True)]
    kept, removed = select(records, CorpusConfig(per_task_cap=2))
    assert [r["rollout_id"] for r in kept] == ["a/0", "a/2"]
    assert removed == {"duplicate": 1, "per_task_cap": 1, "reward": 1, "status": 1,
                       "invalid_calls": 1}


def test_the_other_filters_each_remove_what_they_name():
    """Failed calls (when asked), a broken sequence, too few / too many turns, too long."""
    records = [_rec("a", 0, failed=True), _rec("a", 1, broken=True, diff="1"),
               _rec("a", 2, turns=3, diff="2"), _rec("a", 3, diff="3"),
               _rec("b", 0, turns=2, diff="4")]
    cfg = CorpusConfig(drop_failed_calls=True, min_turns=1, max_turns=2, max_tokens=6)
    kept, removed = select(records, cfg)
    assert [r["rollout_id"] for r in kept] == ["a/3"]
    assert removed == {"failed_calls": 1, "prefix_break": 1, "turns": 1, "tokens": 1}
    kept, removed = select(records, CorpusConfig(min_turns=3))
    assert [r["rollout_id"] for r in kept] == ["a/2"] and removed["turns"] == 3


def test_exports_keep_the_sampled_tokens_and_the_chat_shape(tmp_path):
    records = [_rec("a", 0), _rec("b", 0, diff="")]
    sft, tokens, _ = build(records, TOOLS, CorpusConfig(), tmp_path, {"run_dir": "r"})
    assert len(sft) == len(tokens) == 2
    row = load_from_disk(str(tmp_path / "tokens"))[0]
    assert row["input_ids"] == records[0]["token_ids"] == [1, 2, 3, 4]
    assert row["loss_mask"] == [0, 0, 1, 1]
    msgs = load_from_disk(str(tmp_path / "sft"))[0]["messages"]
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "bash",
                                                    "arguments": '{"command": "ls"}'}
    assert msgs[2] == {"role": "tool", "content": "out", "tool_calls": [],
                       "tool_call_id": "c1"}
    card = (tmp_path / "sft" / "README.md").read_text()
    assert "2 rows kept of 2 records" in card and "`min_reward`: 1.0" in card


def test_a_filter_that_removes_everything_is_a_clear_message(tmp_path):
    records = [_rec("a", 0, reward=0.0), _rec("a", 1, reward=0.0)]
    sft, tokens, removed = build(records, TOOLS, CorpusConfig(), tmp_path, {})
    assert len(sft) == len(tokens) == 0
    assert len(load_from_disk(str(tmp_path / "sft"))) == 0
    assert corpus_message(0, 2, removed, tmp_path).startswith(
        "corpus: empty: every one of the 2 records was filtered out (2 by reward)")

"""The session loop's logic with a scripted model client (the real-engine path is in e2e)."""

import asyncio
import json

import envs.workspace
from envs import EnvConfig, load
from rollout.model_client import Completion
from rollout.session import Job, Session, SessionLimits, request_seed


class ScriptedClient:
    """Replays tool calls; stands in for the server only in these unit tests."""

    def __init__(self, calls):
        self.calls = list(calls)
        self.released = []

    def constraint(self):
        return "scripted"

    async def complete(self, messages, tools, max_tokens, seed, session_id):
        name, args = self.calls.pop(0)
        call = {"id": f"c{len(self.calls)}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}
        return Completion("", [call], "tool_calls", [1, 2], [3], [-0.1], 2, 1, 0, 0.01)

    async def release(self, session_id):
        self.released.append(session_id)


ENV = load(EnvConfig(task_ids=["stats_mean"]))
FIX = {"path": "stats.py", "old_text": "(len(values) - 1)", "new_text": "len(values)"}


def run(calls, limits=None):
    client = ScriptedClient(calls)
    session = Session(Job("stats_mean", 0), ENV, client, limits or SessionLimits(), 0, "run")
    record = asyncio.run(session.run())
    assert client.released == [session.session_id]  # the router may drop the binding now
    return record


def test_fix_and_submit_is_rewarded():
    rec = run([("str_replace", FIX), ("submit", {})])
    assert (rec["status"], rec["stop_reason"], rec["reward"]) == ("ok", "submitted", 1.0)
    assert rec["num_turns"] == 2 and rec["num_invalid_tool_calls"] == 0
    assert "+    return sum(values) / len(values)" in rec["final_diff"]
    assert [m["role"] for m in rec["messages"]] == [
        "system", "user", "assistant", "tool", "assistant", "tool"]


def test_turn_limit_still_scores_the_final_state():
    rec = run([("str_replace", FIX), ("bash", {"command": "ls"})], SessionLimits(max_turns=2))
    assert (rec["status"], rec["stop_reason"], rec["reward"]) == ("truncated", "max_turns", 1.0)


def test_malformed_calls_are_recorded_not_raised():
    rec = run([("bash", {}), ("nope", {}), ("submit", {})])
    calls = [c for t in rec["turns"] for c in t["tool_calls"]]
    assert [c["valid"] for c in calls] == [False, False, True]
    assert rec["num_invalid_tool_calls"] == 2 and rec["reward"] == 0.0


def test_a_broken_sandbox_is_an_infra_error_never_a_zero(monkeypatch):
    def broken(argv, workdir, policy):
        return ["bwrap", "--no-such-option", "--", *argv]

    monkeypatch.setattr(envs.workspace, "wrap", broken)
    rec = run([("bash", {"command": "ls"})])
    assert rec["status"] == "infra_error" and rec["reward"] is None
    assert "sandbox failed: bwrap:" in rec["error"]


def test_request_seeds_are_stable_and_distinct():
    a, b = Job("t", 0), Job("t", 1)
    assert request_seed(0, a, 0) == request_seed(0, a, 0)
    assert len({request_seed(0, a, 0), request_seed(0, b, 0), request_seed(0, a, 1),
                request_seed(1, a, 0)}) == 4

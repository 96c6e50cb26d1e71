"""The session loop with the real client, renderer and parser; only the server is scripted.

The scripted front door answers each request with the tokens of a scripted completion and
reports back the prompt it was sent (the real-engine path is in tests/e2e)."""

import asyncio
import json
import subprocess
import sys

import pytest

import envs.lease
from envs import EnvConfig, load
from rollfleet.paths import ROOT
from rollout.model_client import ModelClient, SamplingConfig
from rollout.record import Job, Provenance
from rollout.rl.policy_fence import TurnEnd, TurnFence
from rollout.session import Session, SessionLimits, request_seed
from serving import (
    Endpoint,
    Generation,
    PromptTooLong,
    ServerUnavailable,
    ServingError,
    ToolCallSampler,
)
from serving.chat import chat_renderer
from serving.model_dir import tokenizer_markup_ids
from serving.tiny_model import ensure_tiny_glm

MODEL_DIR = ensure_tiny_glm(ROOT / ".cache" / "models")
ENDPOINT = Endpoint(base_url="http://127.0.0.1:9/v1", model="tiny-glm", model_dir=str(MODEL_DIR),
                    markup_token_ids=tokenizer_markup_ids(MODEL_DIR))
RENDERER = chat_renderer(str(MODEL_DIR), False)
ENV = load(EnvConfig(task_ids=["stats_mean"]))
FIX = {"path": "stats.py", "old_text": "(len(values) - 1)", "new_text": "len(values)"}
LIMITS = SessionLimits(max_turns=4, max_tokens_per_turn=6144, max_total_tokens=16384)
PROVENANCE = Provenance("run", "tiny-glm", str(MODEL_DIR), "hash", 0, "{}")


def call(name: str, args: dict | None = None) -> str:
    """A GLM call as the model writes it, ending its turn with <|observation|>."""
    parts = "".join(f"<arg_key>{k}</arg_key><arg_value>{v if isinstance(v, str) else json.dumps(v)}"
                    f"</arg_value>" for k, v in (args or {}).items())
    return f"<tool_call>{name}{parts}</tool_call><|observation|>"


class ScriptedDoor:
    """Stands in for the server: answers with scripted completions, echoes the prompt."""

    def __init__(self, completions, tamper=None):
        self.completions = list(completions)
        self.tamper = tamper  # prompt -> the prompt the "server" says it ran
        self.prompts, self.released, self.samplings, self.grammars = [], [], [], []
        self.resumed = []

    def logit_bias(self, grammar):  # a vLLM server's: the grammar's bias applied
        return {7: -1.5} if grammar else {}

    async def generate(self, prompt_ids, sampling, grammar, session_id, resume=None):
        self.prompts.append(list(prompt_ids))
        self.samplings.append(sampling)
        self.grammars.append(grammar)
        self.resumed.append(resume)
        item = self.completions.pop(0)
        if isinstance(item, Exception):
            raise item
        item, finish = item if isinstance(item, tuple) else (item, "stop")
        ids = RENDERER.encode(item) if isinstance(item, str) else list(item)
        ran = self.tamper(list(prompt_ids)) if self.tamper else list(prompt_ids)
        return Generation(ran, ids, [-0.5] * len(ids), finish, cached_tokens=3, engine_id="0")

    async def release(self, session_id):
        self.released.append(session_id)


def run(completions, limits=LIMITS, tamper=None, sampling=None, fence=None):
    door = ScriptedDoor(completions, tamper)
    client = ModelClient(ENDPOINT, sampling or SamplingConfig(), ToolCallSampler(ENDPOINT, door))
    session = Session(Job("stats_mean", 0), ENV, client, limits, 0, PROVENANCE, fence=fence)
    record = asyncio.run(session.run())
    assert door.released == [session.session_id]  # the router may drop the binding now
    return record, door


def test_each_turn_records_the_sampling_it_was_sent_with():
    """temperature, top_p, max_tokens and each turn's own seed, as the request carried them."""
    rec, door = run([call("run_tests"), call("submit")],
                    sampling=SamplingConfig(temperature=0.7, top_p=0.9))
    seeds = [request_seed(0, Job("stats_mean", 0), n) for n in range(2)]
    assert [(s.temperature, s.top_p, s.seed) for s in door.samplings] == [
        (0.7, 0.9, seeds[0]), (0.7, 0.9, seeds[1])]
    assert [(pytest.approx(t["temperature"]), pytest.approx(t["top_p"]), t["seed"],
             t["max_tokens"]) for t in rec["turns"]] == [
        (0.7, 0.9, s.seed, s.max_tokens) for s in door.samplings]
    assert seeds[0] != seeds[1]
    # and the constraint a trainer replays: the grammar sent, the bias the server applied
    assert [(t["grammar"], t["logit_bias"]) for t in rec["turns"]] == [
        (g.ebnf, '{"7": -1.5}') for g in door.grammars]


class Versions(TurnFence):
    """The board's answers, scripted: the version each `begin` gets, how many engine pauses
    fell inside each attempt (and the version served after the first, if known)."""

    def __init__(self, versions, pauses, after=None):
        super().__init__()
        self.versions, self.pauses = list(versions), list(pauses)
        self.after = list(after or [None] * len(self.pauses))

    async def begin(self, turn):
        version = self.versions.pop(0)
        return version, f"digest-{version}"

    async def end(self, turn):
        after = self.after.pop(0)
        return TurnEnd(self.pauses.pop(0), None if after is None else (after, f"digest-{after}"))


def test_a_turn_an_update_cut_is_sampled_again_and_tagged_with_the_new_version():
    """The first sample of turn 0 straddled an update (keep) or was aborted: it is dropped
    and the turn sampled again; every recorded turn names its version."""
    rec, door = run([call("run_tests"), call("run_tests"), call("submit")],
                    fence=Versions([0, 1, 1], [1, 0, 0]))
    assert len(door.prompts) == 3 and door.prompts[0] == door.prompts[1]  # the same turn again
    assert [(t["policy_version"], t["resampled"]) for t in rec["turns"]] == [(1, 1), (1, 0)]
    thrown = len(RENDERER.encode(call("run_tests")))  # what the dropped sample had sampled
    assert [t["discarded_tokens"] for t in rec["turns"]] == [thrown, 0]
    assert [t["policy_checkpoint"] for t in rec["turns"]] == ["digest-1", "digest-1"]
    assert rec["policy_version"] == 1 and rec["policy_versions"] == [1]
    # an engine aborted the request (abort mode): its partial tokens are never recorded
    rec, door = run([("<tool_call>run", "abort"), call("run_tests"), call("submit")],
                    fence=Versions([0, 1, 1], [0, 0, 0]))
    assert [(t["policy_version"], t["resampled"], t["finish_reason"]) for t in rec["turns"]] \
        == [(1, 1, "stop"), (1, 0, "stop")]
    assert rec["turns"][0]["discarded_tokens"] == len(RENDERER.encode("<tool_call>run"))


def test_a_session_past_the_policy_lag_bound_ends_stale_or_is_kept_marked():
    lagging = Versions([0, 2, 2], [0, 0, 0])
    rec, _ = run([call("run_tests"), call("run_tests"), call("submit")], fence=lagging,
                 limits=SessionLimits(4, 6144, 16384, max_policy_lag=1))
    assert (rec["status"], rec["stop_reason"], rec["reward"]) == ("stale", "policy_lag", None)
    assert [t["policy_version"] for t in rec["turns"]] == [0]
    rec, _ = run([call("run_tests"), call("submit")], fence=Versions([0, 2], [0, 0]),
                 limits=SessionLimits(4, 6144, 16384, max_policy_lag=1,
                                         stale_sessions="keep"))
    assert rec["status"] == "ok" and rec["stale"] is True
    assert rec["policy_versions"] == [0, 2]


def test_fix_and_submit_is_rewarded():
    rec, _ = run([call("str_replace", FIX), call("submit")])
    assert (rec["status"], rec["stop_reason"], rec["reward"]) == ("ok", "submitted", 1.0)
    assert rec["num_turns"] == 2 and rec["num_invalid_tool_calls"] == 0
    assert "+    return sum(values) / len(values)" in rec["final_diff"]
    assert [m["role"] for m in rec["messages"]] == [
        "system", "user", "assistant", "tool", "assistant", "tool"]
    # the recorded diff alone re-scores to the same reward (scripts/rescore.py does this)
    assert ENV.score_diff("stats_mean", rec["final_diff"]).reward == 1.0
    assert ENV.score_diff("stats_mean", "").reward == 0.0


def test_every_prompt_is_the_last_one_plus_what_was_sampled_plus_the_new_messages():
    rec, door = run([call("read_file", {"path": "stats.py", "start_line": 1, "end_line": 3}),
                     call("str_replace", FIX), call("submit")])
    turns = rec["turns"]
    assert door.prompts[0] == RENDERER.prompt_ids(ENV.prompt(ENV.tasks["stats_mean"]), ENV.tools)
    for prev, turn in zip(turns, turns[1:], strict=False):
        seen = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert turn["prompt_token_ids"][:len(seen)] == seen
        delta = RENDERER.tokenizer.decode(turn["prompt_token_ids"][len(seen):],
                                           skip_special_tokens=False)
        output = prev["tool_calls"][0]["output"]
        # the sampled <|observation|> opens the tool results: it is not rendered again
        assert delta == f"\n<tool_response>{output}</tool_response><|assistant|>\n<think></think>"
    assert rec["prefix_consistent"] and rec["prefix_breaks"] == []
    last = turns[-1]
    assert rec["token_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
    assert sum(rec["loss_mask"]) == rec["completion_tokens"]
    sampled = [lp for t in turns for lp in t["completion_logprobs"]]
    assert [lp for lp, m in zip(rec["logprobs"], rec["loss_mask"], strict=True) if m] == sampled
    for msg in rec["messages"]:  # for people: no markup, no turn-end token
        assert "<|observation|>" not in msg["content"] and "<tool_call>" not in msg["content"]


def test_a_server_that_runs_another_prompt_is_a_recorded_prefix_break():
    sent = []

    def second_differs(prompt):
        sent.append(prompt)
        return prompt if len(sent) == 1 else prompt[:100] + [7] + prompt[101:]

    rec, _ = run([call("run_tests"), call("submit")], tamper=second_differs)
    assert not rec["prefix_consistent"] and rec["token_ids"] == []
    [brk] = rec["prefix_breaks"]
    assert brk == {"turn": 1, "position": 100,
                   "reason": "the server ran a prompt other than the token ids sent"}


def test_turn_limit_still_scores_the_final_state():
    rec, _ = run([call("str_replace", FIX), call("bash", {"command": "ls"})],
                 SessionLimits(max_turns=2, max_tokens_per_turn=6144, max_total_tokens=16384))
    assert (rec["status"], rec["stop_reason"], rec["reward"]) == ("truncated", "max_turns", 1.0)


def test_calls_that_cannot_be_read_as_sampled_are_not_run():
    bad_bytes = RENDERER.encode("<tool_call>bash<arg_key>command</arg_key><arg_value>echo ")
    bad_bytes += [RENDERER.tokenizer.token_to_id("Â")]  # a lead byte, no char
    bad_bytes += RENDERER.encode("</arg_value></tool_call><|observation|>")
    rec, _ = run([call("nope"), bad_bytes, call("submit")])
    calls = [c for t in rec["turns"] for c in t["tool_calls"]]
    assert [(c["valid"], c["issues"]) for c in calls] == [
        (False, ["unknown_tool"]), (False, ["invalid_utf8"]), (True, [])]
    assert "it was not run" in calls[1]["output"]
    assert rec["num_invalid_tool_calls"] == 2 and rec["tool_call_issues"]["invalid_utf8"] == 1


def test_no_call_gets_a_nudge_rendered_after_the_sampled_stop():
    rec, door = run(["I am done.<|user|>", call("submit")])
    assert rec["turns"][0]["content"] == "I am done."
    seen = rec["turns"][0]["prompt_token_ids"] + rec["turns"][0]["completion_token_ids"]
    delta = RENDERER.tokenizer.decode(door.prompts[1][len(seen):], skip_special_tokens=False)
    assert delta.startswith("\nNo valid tool call")  # <|user|> was sampled, not re-rendered


@pytest.mark.parametrize(("error", "status", "stop"), [
    (ServerUnavailable("HTTP 503"), "infra_error", "error"),
    (ServingError("the engine lost its KV tier"), "infra_error", "error"),
    (PromptTooLong("maximum context length"), "truncated", "context_length"),
])
def test_server_failures_end_the_session(error, status, stop):
    rec, _ = run([call("run_tests"), error])
    assert (rec["status"], rec["stop_reason"]) == (status, stop)
    assert (rec["reward"] is None) == (status == "infra_error")


def test_a_broken_sandbox_is_an_infra_error_never_a_zero(monkeypatch):
    def broken(argv, workdir, policy, source, capabilities=True, info_fd=None):
        return ["bwrap", "--no-such-option", "--", *argv]

    monkeypatch.setattr(envs.lease, "wrap", broken)  # both sandbox paths build their command there
    rec, _ = run([call("bash", {"command": "ls"})])
    assert rec["status"] == "infra_error" and rec["reward"] is None
    assert "sandbox failed: bwrap:" in rec["error"]


def test_request_seeds_replay_across_processes_and_differ_per_turn_and_sample():
    a, b = Job("t", 0), Job("t", 1)
    code = ("from rollout.record import Job; from rollout.session import request_seed; "
            "print(request_seed(0, Job('t', 0), 0))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": "123", "PATH": ""},
                           cwd=ROOT)
    assert int(other.stdout) == request_seed(0, a, 0)
    assert len({request_seed(0, a, 0), request_seed(0, b, 0), request_seed(0, a, 1),
                request_seed(1, a, 0)}) == 4


def test_a_turn_an_update_cut_goes_on_from_its_tokens_when_asked_and_says_who_sampled_each():
    """rollout.update_mode=continue: the engines' pause aborts the turn's request after 3
    tokens; the turn goes on under version 1 from those tokens (they end the next prompt, the
    grammar resumes after them, the budget shrinks by them), and the record tags each token."""
    cut = RENDERER.encode(call("run_tests"))
    limits = SessionLimits(4, 6144, 16384, continue_turns=True)
    rec, door = run([(cut[:3], "abort"), cut[3:], call("submit")], limits=limits,
                    fence=Versions([0, 1, 1], [1, 0, 0]))
    first = rec["turns"][0]
    assert first["completion_token_ids"] == cut and len(first["completion_logprobs"]) == len(cut)
    assert door.prompts[1] == door.prompts[0] + cut[:3] and door.resumed[1] == cut[:3]
    assert door.samplings[1].max_tokens == door.samplings[0].max_tokens - 3
    assert door.grammars[1] is door.grammars[0]  # the same grammar, resumed mid-call
    assert [(p["version"], p["checkpoint"], p["tokens"]) for p in first["parts"]] == [
        (0, "digest-0", 3), (1, "digest-1", len(cut) - 3)]
    assert (first["policy_version"], first["resampled"], first["discarded_tokens"]) == (0, 0, 0)
    assert first["tool_calls"][0]["name"] == "run_tests" and first["tool_calls"][0]["valid"]
    sampled = [v for v, m in zip(rec["token_versions"], rec["loss_mask"], strict=True) if m]
    assert sampled[:len(cut)] == [0] * 3 + [1] * (len(cut) - 3)
    assert rec["policy_versions"] == [0, 1]
    # without `continue` the same cut is sampled again whole, on the new version
    rec, door = run([(cut[:3], "abort"), call("run_tests"), call("submit")],
                    fence=Versions([0, 1, 1], [1, 0, 0]))
    assert door.resumed[1] is None and door.prompts[1] == door.prompts[0]
    assert [p["version"] for p in rec["turns"][0]["parts"]] == [1]
    assert rec["turns"][0]["discarded_tokens"] == 3


def test_a_continued_request_two_pauses_fell_inside_is_sampled_again_from_the_last_known_point():
    """Two pauses inside one attempt: it reached an engine after the first and ran on the new
    weights before the second cut it, so its tokens are of no known version. Only they are
    thrown; the turn goes on from the tokens the first cut left, and nothing of those is lost."""
    cut = RENDERER.encode(call("run_tests"))
    limits = SessionLimits(4, 6144, 16384, continue_turns=True)
    rec, door = run([(cut[:3], "abort"), (cut[3:5], "abort"), cut[3:], call("submit")],
                    limits=limits, fence=Versions([0, 1, 2, 2], [1, 2, 0, 0]))
    first = rec["turns"][0]
    assert first["completion_token_ids"] == cut
    assert door.resumed[1] == door.resumed[2] == cut[:3]  # the spoiled 2 are not kept
    assert door.prompts[2] == door.prompts[0] + cut[:3]
    assert [(p["version"], p["tokens"]) for p in first["parts"]] == [(0, 3), (2, len(cut) - 3)]
    assert (first["resampled"], first["discarded_tokens"]) == (1, 2)
    # not cut, a pause inside, the version it installed not known yet: thrown the same way
    rec, door = run([(cut[:3], "abort"), cut[3:], cut[3:], call("submit")], limits=limits,
                    fence=Versions([0, 1, 1, 1], [1, 1, 0, 0]))
    assert door.resumed[2] == cut[:3]
    assert [(p["version"], p["tokens"]) for p in rec["turns"][0]["parts"]] == [
        (0, 3), (1, len(cut) - 3)]
    assert rec["turns"][0]["discarded_tokens"] == len(cut) - 3


def test_a_continued_request_one_pause_fell_inside_uncut_ran_whole_on_the_new_version():
    """The engines pause by aborting what they hold: a request the pause did not cut reached
    them after it, so every token of it is of what that update installed (not of the version
    its attempt began on); kept so, with continue only. Without continue, sampled again."""
    cut = RENDERER.encode(call("run_tests"))
    limits = SessionLimits(4, 6144, 16384, continue_turns=True)
    rec, door = run([(cut[:3], "abort"), cut[3:], call("submit")], limits=limits,
                    fence=Versions([0, 1, 2], [1, 1, 0], [1, 2, None]))
    first = rec["turns"][0]
    assert [(p["version"], p["checkpoint"], p["tokens"]) for p in first["parts"]] == [
        (0, "digest-0", 3), (2, "digest-2", len(cut) - 3)]
    assert (first["resampled"], first["discarded_tokens"]) == (0, 0)
    rec, _ = run([call("run_tests"), call("run_tests"), call("submit")],
                 fence=Versions([0, 1, 1], [1, 0, 0], [1, None, None]))
    assert rec["turns"][0]["resampled"] == 1 and rec["turns"][0]["parts"][0]["version"] == 1

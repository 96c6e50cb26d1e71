"""One agent session: model turn -> tool calls -> observations, until it ends; then a record.

The conversation is token-in/token-out: the session keeps the prompt as token ids, and each next
prompt is the last one + the sampled ids + the rendered new messages (tool results, a nudge).
`messages` are kept for people only. Control flow by exceptions: each way a session can end is an
exception the loop raises, and the one place that catches them turns it into a status.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from envs import Environment, SandboxError
from rollout.model_client import ModelClient
from rollout.record import (
    Job,
    Outcome,
    PrefixBreak,
    Provenance,
    SessionTrace,
    Timings,
    ToolCallRecord,
    TurnPart,
    TurnRecord,
    build_record,
    experts_fields,
    prefix_break,
)
from rollout.rl.policy_fence import TurnFence
from serving import ServingError, ToolTurn, TurnTooLong

log = logging.getLogger(__name__)
NO_CALL_NUDGE = "No valid tool call was found in your reply. Reply with exactly one tool call."


class InfraError(RuntimeError):
    """The serving side or the sandbox failed: the rollout is retried, never scored."""


@dataclass(frozen=True)
class SessionLimits:
    max_turns: int
    max_tokens_per_turn: int
    max_total_tokens: int  # completion tokens over the whole session
    max_policy_lag: int | None = None  # policy versions a session may outlive its first turn's
    stale_sessions: str = "end"  # end: stop it (status stale) | keep: finish it, marked stale
    # a turn an update cut short goes on from where it stopped (rollout.update_mode=continue)
    # instead of being sampled again
    continue_turns: bool = False


class SessionEnd(Exception):
    stop_reason = ""
    status = "truncated"


class Submitted(SessionEnd):
    stop_reason, status = "submitted", "ok"


class TurnLimit(SessionEnd):
    stop_reason = "max_turns"


class TokenLimit(SessionEnd):
    stop_reason = "max_tokens"


class ContextLimit(SessionEnd):
    stop_reason = "context_length"


class PolicyLag(SessionEnd):
    """The policy moved on more than rollout.max_policy_lag versions since the first turn."""

    stop_reason, status = "policy_lag", "stale"


def request_seed(base: int, job: Job, turn: int) -> int:
    """Deterministic per (run seed, task, sample, turn): a session replays exactly."""
    digest = hashlib.sha256(f"{base}:{job.task_id}:{job.sample_index}:{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


class Session:
    def __init__(self, job: Job, env: Environment, client: ModelClient, limits: SessionLimits,
                 seed: int, provenance: Provenance, node_id: str = "",
                 fence: TurnFence | None = None) -> None:
        self.job, self.env, self.client, self.limits = job, env, client, limits
        self.fence = fence or TurnFence()
        self.first_version: int | None = None
        self.seed, self.provenance = seed, provenance
        self.session_id = f"{provenance.run_id}:{job.rollout_id}:{job.attempt}"  # router's key
        self.trace = SessionTrace(messages=env.prompt(env.tasks[job.task_id]), node_id=node_id,
                                  labels=env.labels(job.task_id))
        self.prompt_ids = client.first_prompt(self.trace.messages, env.tools)
        self.timings = Timings()

    async def run(self) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            episode = await asyncio.to_thread(self.env.episode, self.job.task_id)
        except SandboxError as exc:
            return self._record(Outcome("infra_error", "error", str(exc)), start)
        try:
            try:
                while True:
                    await self._turn(episode)
            except SessionEnd as end:
                status, stop_reason = end.status, end.stop_reason
            if status == PolicyLag.status:  # never trained on: not worth its hidden tests
                return self._record(Outcome(status, stop_reason), start)
            score_start = time.perf_counter()
            score = await asyncio.to_thread(episode.score)
            self.timings.score_s = time.perf_counter() - score_start
            if score.infra_error:
                raise InfraError(score.infra_error)
            outcome = Outcome(status, stop_reason, "", score.reward, score.tests_total,
                              score.tests_failed, score.output, score.diff)
        except InfraError as exc:
            # The rollout layer retries these; they never count as a reward of 0.
            outcome = Outcome("infra_error", "error", str(exc))
        finally:
            await asyncio.to_thread(episode.close)
            await self._release()
        return self._record(outcome, start)

    async def _release(self) -> None:
        try:
            await self.client.release(self.session_id)
        except ServingError as exc:  # the binding then expires after the router's TTL
            log.warning("session %s: release failed: %s", self.session_id, exc)

    async def _turn(self, episode) -> None:
        turns = self.trace.turns
        n = len(turns)
        if n >= self.limits.max_turns:
            raise TurnLimit()
        used = sum(t.completion_tokens for t in turns)
        budget = min(self.limits.max_tokens_per_turn, self.limits.max_total_tokens - used)
        short: type[SessionEnd] = TokenLimit  # what ends the session if no call fits
        room = self.client.endpoint.max_model_len - len(self.prompt_ids)
        if self.client.token_in and room < budget:  # the context window is the tighter bound
            budget, short = room, ContextLimit
        if budget <= 0:
            raise short()
        seed = request_seed(self.seed, self.job, n)
        try:
            done, parts, thrown = await self._sample(n, budget, seed)
        except TurnTooLong as exc:  # no call fits the room left: none is started
            raise (ContextLimit() if exc.context_full else short()) from None
        except ServingError as exc:
            raise InfraError(str(exc)) from None
        self.timings.model_s += done.generation.latency_s
        self._check_prefix(n, done)
        history = [*self.trace.messages, done.assistant_message()]
        calls, new, submitted, tool_s = await self._run_tools(episode, done)
        self.timings.tool_s += tool_s
        turns.append(_turn_record(n, done, calls, tool_s, self.client.endpoint.logprobs_mode,
                                  parts, thrown))
        self.prompt_ids = self.client.next_prompt(self.prompt_ids, done, history, new,
                                                  self.env.tools)
        self.trace.messages = history + new
        if submitted:
            raise Submitted()

    async def _sample(self, n: int, budget: int, seed: int
                      ) -> tuple[ToolTurn, list[TurnPart], list[int]]:
        """One turn, each of its tokens tagged with the policy that sampled it: (turn, its parts
        (version, checkpoint digest, tokens), the tokens of each attempt an update spoiled and
        that were sampled again). An update cuts a turn by aborting its request (the engines'
        pause): with `continue_turns` the turn goes on from its tokens so far under the new
        weights, else it is sampled again whole. With `continue_turns` (the engines pause by
        aborting what they hold) an attempt one pause fell inside and did not cut ran whole
        after it, on what that update installed; any other attempt a pause fell inside may hold
        tokens of two versions and is sampled again from the last point whose version is
        known."""
        key = f"{self.session_id}:{n}"
        thrown: list[int] = []
        parts, so_far = [], None
        while True:
            version, checkpoint = await self.fence.begin(key)
            try:
                self._check_lag(version)
                done = await self.client.complete(self.prompt_ids, self.trace.messages,
                                                  self.env.tools, budget, seed, self.session_id,
                                                  self._experts_from(), so_far)
            finally:
                end = await self.fence.end(key)
            new = len(done.generation.token_ids) - sum(p.tokens for p in parts)
            cut = done.generation.finish_reason == "abort"
            if cut and self.limits.continue_turns and end.pauses <= 1:
                if new:  # sampled before the cut: it stays, tagged with its policy
                    parts.append(TurnPart(version, checkpoint, new))
                    so_far = done
                continue
            sampled_by = (version, checkpoint) if end.pauses == 0 else (
                # the engines paused by aborting what they held: uncut, it ran after the pause
                end.after if self.limits.continue_turns and end.pauses == 1 else None)
            if not cut and sampled_by is not None:
                if new or not parts:
                    parts.append(TurnPart(*sampled_by, new))
                return done, parts, thrown
            thrown.append(new)  # where these tokens changed policy cannot be told

    def _experts_from(self) -> int:
        """Where this turn's MoE routing starts: the last turn's last sampled token (no turn
        computed it), so that the turns' routing tiles the session's sequence."""
        if not self.trace.turns:
            return 0
        last = self.trace.turns[-1]
        return len(last.prompt_token_ids) + len(last.completion_token_ids) - 1

    def _check_lag(self, version: int) -> None:
        if self.first_version is None:
            self.first_version = version
        lag = self.limits.max_policy_lag
        if lag is not None and version - self.first_version > lag:
            if self.limits.stale_sessions == "end":
                raise PolicyLag()
            self.trace.stale = True

    def _check_prefix(self, n: int, done: ToolTurn) -> None:
        """The prompt the server ran must extend the previous prompt + completion."""
        ran = done.generation.prompt_token_ids
        if not ran:
            self.trace.breaks.append(PrefixBreak(n, 0, "the server reported no prompt ids"))
        elif self.client.token_in and ran != self.prompt_ids:
            at = prefix_break(self.prompt_ids, ran)
            self.trace.breaks.append(PrefixBreak(
                n, min(len(ran), len(self.prompt_ids)) if at is None else at,
                "the server ran a prompt other than the token ids sent"))
        elif n > 0:
            last = self.trace.turns[-1]
            at = prefix_break(last.prompt_token_ids + last.completion_token_ids, ran)
            if at is not None:
                self.trace.breaks.append(PrefixBreak(n, at, (
                    "the prompt does not extend the last turn" if self.client.token_in else
                    "the server rendered the prompt from messages (tool_constraint=stock)")))

    async def _run_tools(self, episode, done: ToolTurn
                         ) -> tuple[list[ToolCallRecord], list[dict], bool, float]:
        """Run each call exactly as sampled; a call with any issue is not run, and the model is
        told why."""
        start = time.perf_counter()
        calls, new, submitted = [], [], False
        for call in done.calls:
            if call.issues:
                output = (f"error: the tool call could not be read as sampled "
                          f"({', '.join(call.issues)}); it was not run")
                calls.append(ToolCallRecord(call.id, call.name, call.arguments, False, output,
                                            False, call.issues, output))
            else:
                try:
                    result = await asyncio.to_thread(episode.call, call.name, call.arguments)
                except SandboxError as exc:
                    raise InfraError(str(exc)) from None
                output = result.output
                calls.append(ToolCallRecord(call.id, call.name, call.arguments,
                                            result.error is None, result.error or "",
                                            result.failed, [], output))
                submitted = submitted or result.submitted
            new.append({"role": "tool", "tool_call_id": call.id, "content": output})
        if not done.calls:
            new.append({"role": "user", "content": NO_CALL_NUDGE})
        return calls, new, submitted, time.perf_counter() - start

    def _record(self, outcome: Outcome, start: float) -> dict[str, Any]:
        self.timings.wall_s = time.perf_counter() - start
        return build_record(self.job, self.provenance, outcome, self.trace, self.timings)


def _turn_record(n: int, done: ToolTurn, calls: list[ToolCallRecord], tool_s: float,
                 logprobs_mode: str, parts: list[TurnPart], thrown: list[int]) -> TurnRecord:
    gen, s = done.generation, done.sampling
    return TurnRecord(
        index=n, prompt_token_ids=gen.prompt_token_ids, completion_token_ids=gen.token_ids,
        completion_logprobs=gen.logprobs, logprobs_mode=logprobs_mode,
        temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=s.seed,
        finish_reason=gen.finish_reason, content=done.content, reasoning=done.reasoning,
        tool_calls=calls, constraint=done.constraint, grammar=done.grammar,
        logit_bias=json.dumps(done.logit_bias, sort_keys=True), issues=done.issues,
        dropped_calls=done.dropped_calls, cached_tokens=gen.cached_tokens,
        engine_id=gen.engine_id, prefill_engine_id=gen.prefill_engine_id,
        latency_s=gen.latency_s, tool_s=tool_s, policy_version=parts[0].version,
        policy_checkpoint=parts[0].checkpoint, parts=parts, resampled=len(thrown),
        discarded_tokens=sum(thrown),
        **experts_fields(gen.routed_experts, gen.routed_experts_start))

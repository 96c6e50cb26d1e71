"""One agent session: model turn -> tool calls -> observations, until it ends; then a record.

Control flow by exceptions: each way a session can end is an exception the loop raises, and the
one place that catches them turns it into a status and stop reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from envs import Environment, SandboxError
from rollout.model_client import (
    CallBudgetExhausted,
    Completion,
    ContextFull,
    InfraError,
    ModelClient,
)
from rollout.record import flatten_turns
from serving import ISSUE_KINDS

NO_CALL_NUDGE = "No valid tool call was found in your reply. Reply with exactly one tool call."


@dataclass(frozen=True)
class SessionLimits:
    max_turns: int = 4
    max_tokens_per_turn: int = 256
    max_total_tokens: int = 4096  # completion tokens over the whole session


@dataclass(frozen=True)
class Job:
    task_id: str
    sample_index: int
    attempt: int = 0

    @property
    def rollout_id(self) -> str:
        return f"{self.task_id}/{self.sample_index}"


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


def request_seed(base: int, job: Job, turn: int) -> int:
    """Deterministic per (run seed, task, sample, turn): a session replays exactly."""
    digest = hashlib.sha256(f"{base}:{job.task_id}:{job.sample_index}:{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


class Session:
    def __init__(self, job: Job, env: Environment, client: ModelClient, limits: SessionLimits,
                 seed: int, run_id: str) -> None:
        self.job, self.env, self.client, self.limits = job, env, client, limits
        self.seed, self.run_id = seed, run_id
        self.session_id = f"{run_id}:{job.rollout_id}:{job.attempt}"  # the router's key
        self.messages: list[dict[str, Any]] = env.prompt(env.tasks[job.task_id])
        self.turns: list[dict[str, Any]] = []
        self.model_s = self.tool_s = 0.0

    async def run(self) -> dict[str, Any]:
        start = time.perf_counter()
        status, stop_reason, error = "ok", "", ""
        try:
            episode = await asyncio.to_thread(self.env.episode, self.job.task_id)
        except SandboxError as exc:
            return self._record("infra_error", "error", str(exc), None,
                                time.perf_counter() - start, 0.0)
        try:
            try:
                while True:
                    await self._turn(episode)
            except SessionEnd as end:
                status, stop_reason = end.status, end.stop_reason
            score_start = time.perf_counter()
            score = await asyncio.to_thread(episode.score)
            score_s = time.perf_counter() - score_start
            if score.infra_error:
                raise InfraError(score.infra_error)
        except InfraError as exc:
            # The rollout layer retries these; they never count as a reward of 0.
            status, stop_reason, error, score, score_s = "infra_error", "error", str(exc), None, 0.0
        finally:
            await asyncio.to_thread(episode.close)
            await self.client.release(self.session_id)
        return self._record(status, stop_reason, error, score, time.perf_counter() - start,
                            score_s)

    async def _turn(self, episode) -> None:
        n = len(self.turns)
        if n >= self.limits.max_turns:
            raise TurnLimit()
        used = sum(t["completion_tokens"] for t in self.turns)
        budget = min(self.limits.max_tokens_per_turn, self.limits.max_total_tokens - used)
        if budget <= 0:
            raise TokenLimit()
        seed = request_seed(self.seed, self.job, n)
        try:
            done = await self.client.complete(self.messages, self.env.tools, budget, seed,
                                              session_id=self.session_id)
        except ContextFull:
            raise ContextLimit() from None
        except CallBudgetExhausted:  # a call that could not finish is never started
            raise TokenLimit() from None
        self.model_s += done.latency_s
        self.messages.append(done.assistant_message())
        calls, submitted, tool_s = await self._run_tools(episode, done)
        self.tool_s += tool_s
        self.turns.append(self._turn_record(n, done, calls, seed, tool_s))
        if submitted:
            raise Submitted()

    async def _run_tools(self, episode, done: Completion) -> tuple[list[dict], bool, float]:
        start = time.perf_counter()
        calls, submitted = [], False
        for call, issues in zip(done.tool_calls, done.call_issues or [[]] * len(done.tool_calls),
                                strict=True):
            fn = call["function"]
            try:
                result = await asyncio.to_thread(episode.call, fn["name"], fn["arguments"])
            except SandboxError as exc:
                raise InfraError(str(exc)) from None
            calls.append({"id": call["id"], "name": fn["name"], "arguments": fn["arguments"],
                          "valid": result.error is None, "error": result.error or "",
                          "failed": result.failed, "issues": issues, "output": result.output})
            self.messages.append({"role": "tool", "tool_call_id": call["id"],
                                  "content": result.output})
            submitted = submitted or result.submitted
        if not done.tool_calls:
            self.messages.append({"role": "user", "content": NO_CALL_NUDGE})
        return calls, submitted, time.perf_counter() - start

    def _turn_record(self, n: int, done: Completion, calls: list[dict], seed: int,
                     tool_s: float) -> dict[str, Any]:
        return {
            "index": n, "prompt_token_ids": done.prompt_token_ids,
            "completion_token_ids": done.completion_token_ids,
            "completion_logprobs": done.completion_logprobs,
            "finish_reason": done.finish_reason, "content": done.content, "tool_calls": calls,
            "constraint": done.constraint, "issues": done.turn_issues,
            "dropped_calls": done.dropped_calls, "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens, "cached_tokens": done.cached_tokens,
            "engine_id": done.engine_id, "prefill_engine_id": done.prefill_engine_id,
            "seed": seed, "latency_s": done.latency_s,
            "tool_s": tool_s,
        }

    def _record(self, status: str, stop_reason: str, error: str, score, wall_s: float,
                score_s: float) -> dict[str, Any]:
        consistent, tokens, mask, logprobs = flatten_turns(self.turns)
        calls = [c for t in self.turns for c in t["tool_calls"]]
        return {
            "rollout_id": self.job.rollout_id, "run_id": self.run_id,
            "task_id": self.job.task_id, "group_id": self.job.task_id,
            "sample_index": self.job.sample_index, "attempt": self.job.attempt,
            "status": status, "stop_reason": stop_reason, "error": error,
            "reward": score.reward if score else None,
            "reward_info": {"tests_total": score.tests_total, "tests_failed": score.tests_failed,
                            "output": score.output} if score else None,
            "final_diff": score.diff if score else "",
            "messages": [_message_row(m) for m in self.messages],
            "turns": self.turns, "num_turns": len(self.turns), "num_tool_calls": len(calls),
            "num_invalid_tool_calls": sum(not c["valid"] for c in calls),
            "tool_call_issues": _issue_counts(self.turns),
            "prompt_tokens": sum(t["prompt_tokens"] for t in self.turns),
            "completion_tokens": sum(t["completion_tokens"] for t in self.turns),
            "cached_tokens": sum(t["cached_tokens"] for t in self.turns),
            "prefix_consistent": consistent, "token_ids": tokens, "loss_mask": mask,
            "logprobs": logprobs,
            "timings": {"wall_s": wall_s, "model_s": self.model_s, "tool_s": self.tool_s,
                        "score_s": score_s},
        }


def _message_row(msg: dict[str, Any]) -> dict[str, Any]:
    return {"role": msg["role"], "content": msg.get("content") or "",
            "tool_calls": json.dumps(msg["tool_calls"]) if msg.get("tool_calls") else "",
            "tool_call_id": msg.get("tool_call_id", "")}


def _issue_counts(turns: list[dict[str, Any]]) -> dict[str, int]:
    """Per rollout: calls with each kind of problem, calls the parser dropped, tools that failed."""
    counts = dict.fromkeys(ISSUE_KINDS, 0) | {"dropped": 0, "failed": 0}
    for turn in turns:
        counts["dropped"] += turn["dropped_calls"]
        for kind in turn["issues"]:
            counts[kind] += 1
        for call in turn["tool_calls"]:
            counts["failed"] += call["failed"]
            for kind in call["issues"]:
                counts[kind] += 1
    return counts

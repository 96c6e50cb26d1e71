"""The rollout record: one schema that RL, evals and corpora all read, built in one place.

Token ids and logprobs are stored per turn exactly as the server returned them. A session is
token-in/token-out, so every turn's prompt extends the previous prompt + completion; the record
then also carries the whole session as one sequence with a loss mask, ready for a trainer. A
turn whose prompt does not extend the sequence is a prefix break, recorded with where and why.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from datasets import Features, List, Value

from serving import ToolTurn

TOOL_CALL = {
    "id": Value("string"),
    "name": Value("string"),
    "arguments": Value("string"),  # JSON object, as read from the sampled tokens
    "valid": Value("bool"),  # well-formed (a known tool, arguments match its schema) and run
    "error": Value("string"),
    "failed": Value("bool"),  # well-formed, but the tool itself failed
    "issues": List(Value("string")),  # malformed, unknown_tool, invalid_utf8, ...
    "output": Value("string"),
}

TURN = {
    "index": Value("int32"),
    "prompt_token_ids": List(Value("int32")),  # the prompt the server ran, as it reported it
    "completion_token_ids": List(Value("int32")),
    "completion_logprobs": List(Value("float32")),
    "logprobs_mode": Value("string"),  # behaviour | raw (README: Logprobs)
    "temperature": Value("float32"),
    "top_p": Value("float32"),
    "max_tokens": Value("int32"),
    "seed": Value("int64"),
    "finish_reason": Value("string"),
    "content": Value("string"),
    "reasoning": Value("string"),
    "tool_calls": List(TOOL_CALL),
    "constraint": Value("string"),  # the grammar the turn was sampled under
    "grammar": Value("string"),  # its xgrammar EBNF ("" for none or the server's own)
    "logit_bias": Value("string"),  # JSON object token id -> bias, sent beside the grammar
    "issues": List(Value("string")),  # turn-level: cut_off, subtoken_markup
    "dropped_calls": Value("int32"),  # calls in the sampled text the server's parser dropped
    "prompt_tokens": Value("int32"),
    "completion_tokens": Value("int32"),
    "cached_tokens": Value("int32"),
    "engine_id": Value("string"),  # the engine that decoded the turn
    "prefill_engine_id": Value("string"),  # disaggregated serving: the engine that prefilled it
    "latency_s": Value("float32"),
    "tool_s": Value("float32"),
    "policy_version": Value("int32"),  # the weights its first token was sampled from
    "policy_checkpoint": Value("string"),  # their digest (serving/checkpoints.py)
    # the turn's tokens by the policy that sampled them, in order: one part, or more where an
    # update cut the turn and it went on under the new weights (rollout.update_mode=continue)
    "parts": List({"version": Value("int32"), "checkpoint": Value("string"),
                   "tokens": Value("int32")}),
    "resampled": Value("int32"),  # times the turn was sampled again: an update cut it short
    "discarded_tokens": Value("int32"),  # the tokens those attempts had sampled, thrown away
    # MoE routing (serving.routed_experts): uint8 [positions, MoE layers, top-k], raw bytes,
    # for the positions of the session's sequence from `routed_experts_start` on
    "routed_experts": Value("binary"),
    "routed_experts_shape": List(Value("int32")),
    "routed_experts_start": Value("int32"),
}

MESSAGE = {
    "role": Value("string"),
    "content": Value("string"),
    "tool_calls": Value("string"),  # JSON list, OpenAI shape
    "tool_call_id": Value("string"),
}

PREFIX_BREAK = {
    "turn": Value("int32"),
    "position": Value("int32"),  # first token of the turn's prompt that differs
    "reason": Value("string"),
}

PROVENANCE = {
    "model": Value("string"),
    "model_path": Value("string"),  # the model folder (tokenizer, chat template, config)
    "config_hash": Value("string"),
    "seed": Value("int64"),
    "versions": Value("string"),  # JSON object of package versions
    "checkpoint": Value("string"),  # the served weights' digest when the run started
    "created_at": Value("string"),
}

FEATURES = Features({
    "rollout_id": Value("string"),
    "run_id": Value("string"),
    "task_id": Value("string"),
    "group_id": Value("string"),
    "sample_index": Value("int32"),
    "attempt": Value("int32"),
    "node_id": Value("string"),  # the Ray node whose actor ran the session (and its sandbox)
    "task_difficulty": Value("string"),  # the task's labels, for reports (envs: Task)
    "task_category": Value("string"),
    "status": Value("string"),  # ok | truncated | stale | infra_error | error (README: The record)
    # submitted | max_turns | max_tokens | context_length | policy_lag | error
    "stop_reason": Value("string"),
    "error": Value("string"),
    "reward": Value("float32"),
    "reward_info": {
        "tests_total": Value("int32"),
        "tests_failed": Value("int32"),
        "output": Value("string"),
    },
    "final_diff": Value("string"),  # `git diff --binary` from the starting tree: `git apply`s
    "messages": List(MESSAGE),
    "turns": List(TURN),
    "num_turns": Value("int32"),
    "num_tool_calls": Value("int32"),
    "num_invalid_tool_calls": Value("int32"),
    "tool_call_issues": {k: Value("int32") for k in (*ToolTurn.ISSUE_KINDS, "dropped", "failed")},
    "prompt_tokens": Value("int32"),
    "completion_tokens": Value("int32"),
    "cached_tokens": Value("int32"),
    "prefix_consistent": Value("bool"),
    "policy_version": Value("int32"),  # the version of the session's first turn
    "policy_versions": List(Value("int32")),  # every version its turns were sampled from
    "stale": Value("bool"),  # the session outlived rollout.max_policy_lag (kept, not trained)
    "prefix_breaks": List(PREFIX_BREAK),
    "token_ids": List(Value("int32")),
    "loss_mask": List(Value("int8")),
    "logprobs": List(Value("float32")),
    "token_versions": List(Value("int32")),  # the policy version of each sampled token, else -1
    "timings": {
        "wall_s": Value("float32"),
        "model_s": Value("float32"),
        "tool_s": Value("float32"),
        "score_s": Value("float32"),
    },
    "provenance": PROVENANCE,
})


@dataclass(frozen=True)
class Job:
    """One rollout to run: a (task, sample) key and which attempt this is."""

    task_id: str
    sample_index: int
    attempt: int = 0
    group: int | None = None  # an RL loop's group of this task (None: one group per task)

    @property
    def rollout_id(self) -> str:
        return f"{self.task_id}/{self.sample_index}"

    @property
    def group_id(self) -> str:
        return self.task_id if self.group is None else f"{self.task_id}@{self.group}"


@dataclass(frozen=True)
class Provenance:
    """Where every record of a run comes from; `created_at` is stamped per record."""

    run_id: str
    model: str
    model_path: str
    config_hash: str
    seed: int
    versions: str
    checkpoint: str = ""  # the served weights' digest at the start (version 0)

    def stamp(self) -> dict[str, Any]:
        return {"model": self.model, "model_path": self.model_path,
                "config_hash": self.config_hash, "seed": self.seed, "versions": self.versions,
                "checkpoint": self.checkpoint, "created_at": datetime.now(UTC).isoformat()}


@dataclass
class ToolCallRecord:
    id: str
    name: str
    arguments: str
    valid: bool
    error: str
    failed: bool
    issues: list[str]
    output: str


@dataclass(frozen=True)
class TurnPart:
    """Tokens of a turn that one policy sampled: its version, its weights' digest, how many."""

    version: int
    checkpoint: str
    tokens: int


@dataclass
class TurnRecord:
    index: int
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    logprobs_mode: str
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    finish_reason: str
    content: str
    reasoning: str
    tool_calls: list[ToolCallRecord]
    constraint: str
    grammar: str
    logit_bias: str
    issues: list[str]
    dropped_calls: int
    cached_tokens: int
    engine_id: str
    prefill_engine_id: str
    latency_s: float
    tool_s: float
    policy_version: int = 0
    policy_checkpoint: str = ""
    parts: list[TurnPart] = field(default_factory=list)
    resampled: int = 0
    discarded_tokens: int = 0
    routed_experts: bytes | None = None
    routed_experts_shape: list[int] = field(default_factory=list)
    routed_experts_start: int = 0

    @property
    def token_parts(self) -> list[TurnPart]:
        """Its parts; a turn recorded without any is one part of its version."""
        return self.parts or [TurnPart(self.policy_version, self.policy_checkpoint,
                                       self.completion_tokens)]

    @property
    def token_versions(self) -> list[int]:
        return [p.version for p in self.token_parts for _ in range(p.tokens)]

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.completion_token_ids)

    def row(self) -> dict[str, Any]:
        """Shallow (the lists are the turn's own): asdict deep-copied every turn's token ids,
        most of a record's CPU."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "tool_calls": [dict(vars(c)) for c in self.tool_calls],
            "parts": [dict(vars(p)) for p in self.token_parts],
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


def experts_fields(experts: Any, start: int | None) -> dict[str, Any]:
    """A turn's routed experts as the record keeps them: compact raw bytes and a shape."""
    if experts is None:
        return {}
    import numpy as np

    array = np.asarray(experts)
    if array.size and int(array.max()) > 255:
        raise ValueError(f"expert ids up to {int(array.max())} do not fit uint8")
    return {"routed_experts": array.astype(np.uint8).tobytes(),
            "routed_experts_shape": list(array.shape), "routed_experts_start": int(start or 0)}


@dataclass(frozen=True)
class PrefixBreak:
    turn: int
    position: int
    reason: str


@dataclass
class Outcome:
    """How a session ended and what it scored (None: never scored, e.g. an infra error)."""

    status: str
    stop_reason: str
    error: str = ""
    reward: float | None = None
    tests_total: int = 0
    tests_failed: int = 0
    test_output: str = ""
    final_diff: str = ""


@dataclass
class Timings:
    wall_s: float = 0.0
    model_s: float = 0.0
    tool_s: float = 0.0
    score_s: float = 0.0


@dataclass
class SessionTrace:
    """What a session did, turn by turn; `build_record` turns it into the record."""

    turns: list[TurnRecord] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    breaks: list[PrefixBreak] = field(default_factory=list)
    node_id: str = ""
    labels: tuple[str, str] = ("", "")  # the task's (difficulty, category)
    stale: bool = False  # went on past the policy lag bound (rollout.stale_sessions=keep)


def build_record(job: Job, provenance: Provenance, outcome: Outcome,
                 trace: SessionTrace | None = None,
                 timings: Timings | None = None) -> dict[str, Any]:
    """The one builder of a record row: every field of FEATURES, nothing else."""
    trace = trace or SessionTrace()
    turns = trace.turns
    calls = [c for t in turns for c in t.tool_calls]
    consistent = bool(turns) and not trace.breaks
    tokens, mask, logprobs, versions = join_turns(turns) if consistent else ([], [], [], [])
    scored = outcome.reward is not None
    return {
        "rollout_id": job.rollout_id, "run_id": provenance.run_id, "task_id": job.task_id,
        "group_id": job.group_id, "sample_index": job.sample_index, "attempt": job.attempt,
        "node_id": trace.node_id, "task_difficulty": trace.labels[0],
        "task_category": trace.labels[1], "status": outcome.status,
        "stop_reason": outcome.stop_reason,
        "error": outcome.error,
        "reward": outcome.reward,
        "reward_info": {"tests_total": outcome.tests_total, "tests_failed": outcome.tests_failed,
                        "output": outcome.test_output} if scored else None,
        "final_diff": outcome.final_diff,
        "messages": [_message_row(m) for m in trace.messages],
        "turns": [t.row() for t in turns],
        "num_turns": len(turns), "num_tool_calls": len(calls),
        "num_invalid_tool_calls": sum(not c.valid for c in calls),
        "tool_call_issues": _issue_counts(turns),
        "prompt_tokens": sum(t.prompt_tokens for t in turns),
        "completion_tokens": sum(t.completion_tokens for t in turns),
        "cached_tokens": sum(t.cached_tokens for t in turns),
        "prefix_consistent": consistent, "prefix_breaks": [asdict(b) for b in trace.breaks],
        "policy_version": turns[0].policy_version if turns else 0,
        "policy_versions": sorted({v for t in turns for v in t.token_versions}),
        "stale": trace.stale,
        "token_ids": tokens, "loss_mask": mask, "logprobs": logprobs,
        "token_versions": versions,
        "timings": asdict(timings or Timings()), "provenance": provenance.stamp(),
    }


def error_record(job: Job, provenance: Provenance, error: str,
                 status: str = "infra_error") -> dict[str, Any]:
    """A rollout that produced no session record: its actor died (`infra_error`, retried), or
    its code raised (`error`, the traceback in `error`)."""
    return build_record(job, provenance, Outcome(status, "error", error))


def prefix_break(sequence: list[int], prompt: list[int]) -> int | None:
    """Where `prompt` stops extending `sequence` (the previous prompt + completion); None if
    it extends it."""
    if prompt[:len(sequence)] == sequence:
        return None
    return next((i for i, (a, b) in enumerate(zip(sequence, prompt, strict=False)) if a != b),
                min(len(sequence), len(prompt)))


def join_turns(turns: list[TurnRecord]
               ) -> tuple[list[int], list[int], list[float], list[int]]:
    """Turns whose prompts extend each other as one sequence: (token_ids, loss_mask, logprobs,
    token_versions). Prompt positions get mask 0, logprob 0.0 and version -1; sampled positions
    mask 1, their logprob and the policy version that sampled them."""
    tokens: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    for turn in turns:
        new = turn.prompt_token_ids[len(tokens):]
        n = len(turn.completion_token_ids)
        tokens += new + turn.completion_token_ids
        mask += [0] * len(new) + [1] * n
        logprobs += [0.0] * len(new) + list(turn.completion_logprobs)
        versions += [-1] * len(new) + turn.token_versions
    return tokens, mask, logprobs, versions


def _message_row(msg: dict[str, Any]) -> dict[str, Any]:
    return {"role": msg["role"], "content": msg.get("content") or "",
            "tool_calls": json.dumps(msg["tool_calls"]) if msg.get("tool_calls") else "",
            "tool_call_id": msg.get("tool_call_id", "")}


def _issue_counts(turns: list[TurnRecord]) -> dict[str, int]:
    """Per rollout: calls with each kind of problem, calls the parser dropped, tools that failed."""
    counts = dict.fromkeys(ToolTurn.ISSUE_KINDS, 0) | {"dropped": 0, "failed": 0}
    for turn in turns:
        counts["dropped"] += turn.dropped_calls
        for kind in turn.issues:
            counts[kind] += 1
        for call in turn.tool_calls:
            counts["failed"] += call.failed
            for kind in call.issues:
                counts[kind] += 1
    return counts

"""Re-score a run from its records alone: the rewards from the diffs, the logprobs by replay.

(a) Rewards: each record's `final_diff` is applied with `git apply` to a fresh copy of its task
    and the hidden tests run again; the reward must be the recorded one.
(b) Logprobs: each turn's prompt + completion goes back through a vLLM engine as one token-id
    prompt with `prompt_logprobs`; on the sampled positions the engine's logprob must match the
    recorded one within `tolerance`. This holds for `logprobs_mode=raw` records (the model's own
    distribution at temperature 1, which is what a replay computes); `processed` ones are
    compared only when sampled at temperature 1 with top-p 1 and no grammar.

Why a tolerance at all: the sampled logprob came from a decode step (one new token against
cached KV, batched with other sessions), the replay from one prefill over the whole sequence.
Same weights, but bf16 matmuls reduce in another order and round differently; on this CPU build
the differences measured on the tiny model are listed in the README (Records: rescoring).
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from envs import Environment

DEFAULT_TOLERANCE = 0.1  # nats, max |recorded - replayed| over sampled tokens (README)
PromptLogprobs = Callable[[list[int]], Awaitable[list[float | None]]]


@dataclass
class RewardCheck:
    rollout_id: str
    recorded: float
    rescored: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.recorded == self.rescored


@dataclass
class LogprobCheck:
    turns: int = 0
    diffs: list[float] = field(default_factory=list)  # |recorded - replayed| per sampled token
    max_abs: float = 0.0
    worst: tuple[str, int, int] | None = None  # rollout id, turn, position of the max diff
    skipped: int = 0  # turns not comparable (processed logprobs under a transform)

    @property
    def mean_abs(self) -> float:
        return statistics.fmean(self.diffs) if self.diffs else 0.0


def check_rewards(records: list[dict[str, Any]], env: Environment) -> list[RewardCheck]:
    checks = []
    for r in records:
        if r["reward"] is None:
            continue
        score = env.score_diff(r["task_id"], r["final_diff"])
        checks.append(RewardCheck(r["rollout_id"], r["reward"], score.reward,
                                  score.infra_error or ""))
    return checks


def comparable(turn: dict[str, Any]) -> bool:
    if turn["logprobs_mode"] == "raw":
        return True
    return (turn["temperature"] == 1.0 and turn["top_p"] == 1.0
            and turn["constraint"] in ("", "none"))


async def check_logprobs(records: list[dict[str, Any]], replay: PromptLogprobs,
                         max_turns: int | None = None) -> LogprobCheck:
    """`replay`: the served model's logprob of each token of a sequence (a front door's
    `prompt_logprobs`)."""
    out = LogprobCheck()
    for r in records:
        for turn in r["turns"]:
            if max_turns is not None and out.turns >= max_turns:
                return out
            if not comparable(turn):
                out.skipped += 1
                continue
            prompt, sampled = turn["prompt_token_ids"], turn["completion_token_ids"]
            replayed = await replay(prompt + sampled)
            out.turns += 1
            for k, (rec, rep) in enumerate(zip(turn["completion_logprobs"],
                                               replayed[len(prompt):], strict=True)):
                diff = abs(rec - rep)
                if diff > out.max_abs:
                    out.max_abs, out.worst = diff, (r["rollout_id"], turn["index"], k)
                out.diffs.append(diff)
    return out

"""Re-score a run from its records alone: the rewards from the diffs, the logprobs by a trainer's
recompute at the weights of each turn's version.

(a) Rewards: each record's `final_diff` is applied with `git apply` to a fresh copy of its task
    and the hidden tests run again; the reward must be the recorded one.
(b) Logprobs: each session goes through the checkpoint of each version its turns were sampled
    from (a float32 transformers forward over the whole sequence), and each turn's grammar
    mask is replayed from the record (rollout/rl/behaviour.py): a `behaviour` logprob must equal
    the masked recompute, a `raw` one the unmasked one, within the tolerances. A turn whose
    checkpoint digest is not its version's (or whose version the run did not keep) is named,
    not compared.

Why a tolerance at all: the sampled logprob came from a bf16 decode step (one new token
against cached KV, batched with other sessions), the recompute from a float32 forward over the
whole sequence. Same weights, other rounding; the figures measured on the tiny model are in the
README (RL: the behaviour-logprob contract).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envs import SandboxEnvironment
from rollout.rl.behaviour import Fidelity, SessionLogprobs, fidelity


@dataclass
class RewardCheck:
    rollout_id: str
    recorded: float
    rescored: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.recorded == self.rescored


def check_rewards(records: list[dict[str, Any]], env: SandboxEnvironment
                  ) -> list[RewardCheck]:
    checks = []
    for r in records:
        if r["reward"] is None:
            continue
        score = env.score_diff(r["task_id"], r["final_diff"])
        checks.append(RewardCheck(r["rollout_id"], r["reward"], score.reward,
                                  score.infra_error or ""))
    return checks


@dataclass
class Unscorable:
    """Turns that could not be re-scored, by why."""

    reasons: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, rollout_id: str) -> None:
        self.reasons.setdefault(reason, []).append(rollout_id)


def check_logprobs(records: list[dict[str, Any]], checkpoints: dict[int, tuple[str, str]],
                   load: Callable[[str], Any], replay: SessionLogprobs
                   ) -> tuple[Fidelity, Unscorable]:
    """`checkpoints`: version -> (folder, digest) of the weights the run kept; `load(folder)`
    a causal LM on them (loaded once per version). A record is re-scored if every one of its
    turns names a kept version whose digest is the one it recorded."""
    models: dict[int, Any] = {}

    def model_for(version: int) -> Any:
        if version not in models:
            models[version] = load(checkpoints[version][0])
        return models[version]

    out, skipped = Fidelity(), Unscorable()
    for record in records:
        why = _unscorable(record, checkpoints)
        if why:
            skipped.add(why, record["rollout_id"])
            continue
        fidelity([record], model_for, replay, out)
    return out, skipped


def _unscorable(record: dict[str, Any], checkpoints: dict[int, tuple[str, str]]) -> str:
    if not record["prefix_consistent"] or not record["turns"]:
        return "no whole history"
    for turn in record["turns"]:
        parts = turn.get("parts") or [{"version": turn["policy_version"],
                                       "checkpoint": turn.get("policy_checkpoint") or ""}]
        for part in parts:
            version, digest = int(part["version"]), part.get("checkpoint") or ""
            if version not in checkpoints:
                return f"version {version} not kept"
            if digest and digest != checkpoints[version][1]:
                return f"version {version}: the kept checkpoint is not the one recorded"
    return ""

"""A trainer's side of the behaviour-logprob contract: the masked logprobs of a record's sampled
tokens under the trainer's current weights, from the record alone.

Each sampled token was drawn from the engine's distribution after the turn's grammar mask, the
UTF-8 guard, the logit bias, temperature and top-p (its behaviour logprob is in the record,
`serving.logprobs=behaviour`). A trainer's importance ratio must divide the same quantity under
its own weights by that one; the unmasked log-softmax it would compute by default is off by the
log of the allowed mass at every constrained position. `SessionLogprobs` replays each turn's
masks (serving's `GrammarReplay`) and applies them to the trainer's logits: forced positions
give exactly 0 and no gradient.

    replay = SessionLogprobs(model_dir)
    logits = model(ids[None, :-1]).logits[0]           # the whole session, one forward
    current = replay.logprobs(record, logits)          # [completion tokens], differentiable
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rollout.rl.routing import replay_routing, session_experts


@dataclass(frozen=True)
class TurnMasks:
    """One turn's place in its session's sequence and what its tokens were sampled under."""

    start: int  # index of the turn's first sampled token in the session's token_ids
    token_ids: list[int]
    bitmasks: np.ndarray | None  # packed allowed sets, one row per token; None: unconstrained
    temperature: float
    top_p: float
    logit_bias: dict[int, float]

    @property
    def forced(self) -> np.ndarray:
        """Per token: whether exactly one token was allowed there."""
        if self.bitmasks is None:
            return np.zeros(len(self.token_ids), dtype=bool)
        counts = np.unpackbits(self.bitmasks.view(np.uint8), axis=1).sum(axis=1)
        return counts == 1


class SessionLogprobs:
    """Masked logprobs of whole sessions for one model folder (tokenizer, vocabulary)."""

    def __init__(self, model_dir: str | Path) -> None:
        from serving import GrammarReplay

        self.replay = GrammarReplay(model_dir)

    def turns(self, row: dict[str, Any]) -> list[TurnMasks]:
        """Each turn's masks, replayed from its recorded grammar over its recorded tokens; `row`
        is a record or a trainer-view row (rollout/rl/trainer_view.py)."""
        out = []
        sequence = row["token_ids"] if "token_ids" in row else row["input_ids"]
        for turn in row["turns"]:
            if "start" in turn:
                start, length = turn["start"], turn["length"]
            else:
                start, length = len(turn["prompt_token_ids"]), len(turn["completion_token_ids"])
            ids = list(sequence[start:start + length])
            grammar = turn.get("grammar") or ""
            out.append(TurnMasks(
                start=start, token_ids=ids,
                bitmasks=self.replay.bitmasks(grammar, ids) if grammar else None,
                temperature=float(turn["temperature"]), top_p=float(turn["top_p"]),
                logit_bias={int(k): float(v)
                            for k, v in json.loads(turn.get("logit_bias") or "{}").items()}))
        return out

    def logprobs(self, row: dict[str, Any], logits: Any,
                 turns: list[TurnMasks] | None = None) -> Any:
        """The masked logprob of every sampled token of `row` (a record or a trainer-view row),
        in sequence order (the loss mask's ones), from `logits` [sequence length - 1, vocab]:
        the trainer's logits for the session's tokens after the first, given what precedes
        each."""
        import torch

        parts = []
        for turn in turns if turns is not None else self.turns(row):
            rows = logits[turn.start - 1:turn.start - 1 + len(turn.token_ids)]
            parts.append(self.replay.masked_logprobs(rows, turn.bitmasks, turn.token_ids,
                                                     turn.temperature, turn.top_p,
                                                     turn.logit_bias))
        return torch.cat(parts) if parts else logits.new_zeros(0)


# The fidelity the behaviour logprobs are held to on CPU (a bf16 engine against a float32
# trainer forward at the same weights): mean and max |recorded - recomputed| over every sampled
# token, in nats.
FIDELITY_MEAN, FIDELITY_MAX = 0.005, 0.05


@dataclass
class TurnRecompute:
    """One turn's recorded logprobs beside a trainer's recompute at the weights of its version."""

    index: int
    version: int
    mode: str  # the turn's logprobs_mode: behaviour (compare `masked`) or raw (`unmasked`)
    recorded: Any  # tensor [tokens]
    masked: Any
    unmasked: Any
    forced: np.ndarray

    @property
    def expected(self) -> Any:
        """The recompute the recorded logprobs must equal."""
        return self.unmasked if self.mode == "raw" else self.masked


def session_logits(model: Any, record: dict[str, Any], routing: bool = True) -> Any:
    """`model`'s logits for the session's tokens after the first, given what precedes each;
    with `routing`, through the experts the engine routed each token to where the record has
    them (rollout/rl/routing.py)."""
    import torch

    ids = torch.tensor(record["token_ids"])
    experts = session_experts(record) if routing else None
    with replay_routing(model, experts[:len(ids) - 1]) if experts is not None \
            else contextlib.nullcontext():
        return model(ids[None, :-1]).logits[0].float()


def recompute(record: dict[str, Any], model_for: Callable[[int], Any],
              replay: SessionLogprobs, routing: bool = True) -> list[TurnRecompute]:
    """Each turn of `record` recomputed by `model_for(its policy version)` (a transformers
    causal LM; one forward over the session per version it holds; `routing`: replaying the
    recorded experts). A record whose history broke has nothing to recompute."""
    import torch

    if not record["prefix_consistent"] or not record["token_ids"]:
        return []
    masks = replay.turns(record)
    logits_of: dict[int, Any] = {}
    out = []
    for turn, masked_turn in zip(record["turns"], masks, strict=True):
        versions = torch.tensor(token_versions(turn))
        masked = torch.zeros(len(versions))
        unmasked = torch.zeros(len(versions))
        sampled = torch.tensor(masked_turn.token_ids)
        for version in sorted(set(versions.tolist())):  # each token by its own policy
            if version not in logits_of:
                with torch.no_grad():
                    logits_of[version] = session_logits(model_for(version), record, routing)
            logits = logits_of[version]
            rows = logits[masked_turn.start - 1:masked_turn.start - 1 + len(sampled)]
            here = versions == version
            masked[here] = replay.logprobs(record, logits, [masked_turn])[here]
            unmasked[here] = torch.log_softmax(rows, -1).gather(1, sampled[:, None])[:, 0][here]
        out.append(TurnRecompute(
            index=int(turn["index"]) if "index" in turn else len(out),
            version=int(turn["policy_version"]), mode=turn.get("logprobs_mode") or "behaviour",
            recorded=torch.tensor(turn["completion_logprobs"]), masked=masked,
            unmasked=unmasked, forced=masked_turn.forced))
    return out


def token_versions(turn: dict[str, Any]) -> list[int]:
    """The policy version of each of a recorded turn's sampled tokens (its parts; a turn
    recorded as one version has none)."""
    parts = turn.get("parts") or [{"version": turn["policy_version"],
                                   "tokens": len(turn["completion_token_ids"])}]
    return [int(p["version"]) for p in parts for _ in range(p["tokens"])]


@dataclass
class Fidelity:
    """How far recorded logprobs are from a trainer's recompute at the same weights: the
    recompute they must equal (masked for behaviour logprobs, unmasked for raw ones), and the
    unmasked one (what a trainer differentiating the plain log-softmax would have used)."""

    tokens: int = 0
    forced: int = 0  # positions where one token was allowed
    forced_nonzero: int = 0  # of those, behaviour logprobs recorded as other than 0
    masked: list[float] = field(default_factory=list)  # |recorded - its recompute|
    unmasked: list[float] = field(default_factory=list)  # |recorded - unmasked recompute|
    worst: tuple[str, int, int] | None = None  # rollout id, turn, position of the largest
    turns: int = 0

    def add(self, rollout_id: str, turn: TurnRecompute) -> None:
        diffs = (turn.expected - turn.recorded).abs()
        if diffs.numel() and (not self.masked or diffs.max().item() > max(self.masked)):
            self.worst = (rollout_id, turn.index, int(diffs.argmax()))
        self.turns += 1
        self.tokens += len(turn.recorded)
        forced = torch_bool(turn.forced)
        self.forced += int(forced.sum())
        if turn.mode != "raw":
            self.forced_nonzero += int((turn.recorded[forced] != 0).sum())
        self.masked += diffs.tolist()
        self.unmasked += (turn.unmasked - turn.recorded).abs().tolist()

    def summary(self) -> dict[str, Any]:
        def stats(xs: list[float]) -> tuple[float, float]:
            return (float(np.mean(xs)), float(np.max(xs))) if xs else (0.0, 0.0)

        (mean, top), (raw_mean, raw_top) = stats(self.masked), stats(self.unmasked)
        return {"turns": self.turns, "tokens": self.tokens, "forced": self.forced,
                "forced_nonzero": self.forced_nonzero, "mean_abs": mean, "max_abs": top,
                "worst": self.worst, "unmasked_mean_abs": raw_mean,
                "unmasked_max_abs": raw_top}

    def holds(self, mean: float = FIDELITY_MEAN, top: float = FIDELITY_MAX) -> bool:
        s = self.summary()
        return (self.tokens > 0 and s["mean_abs"] <= mean and s["max_abs"] <= top
                and not self.forced_nonzero)


def torch_bool(mask: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.asarray(mask, dtype=bool))


def fidelity(records: list[dict[str, Any]], model: Any | Callable[[int], Any],
             replay: SessionLogprobs, out: Fidelity | None = None,
             routing: bool = True) -> Fidelity:
    """Each record's recorded logprobs against a recompute: by `model` (a transformers causal
    LM at the weights that sampled them), or by `model(version)` for each turn's version;
    `routing`: through the recorded experts where there are any."""
    out = out or Fidelity()
    model_for = model if not hasattr(model, "forward") else (lambda version: model)
    for record in records:
        for turn in recompute(record, model_for, replay, routing):
            out.add(record["rollout_id"], turn)
    return out

"""MoE routing replay: a trainer's forward routes each token to the experts the engine routed it
to when it sampled (vLLM's `enable_return_routed_experts`, recorded per turn).

Two forwards at the same weights can still pick different experts for a token whose router
scores are close (bf16 against float32, batched against alone), and a different expert is a
different function: the trainer's logprob of a sampled token moves although nothing changed.
Replaying the recorded choice removes that: each MoE layer takes the recorded experts; their
weights still come from the trainer's own router scores, so the router keeps its gradient (the
"rollout routing replay" of the MoE RL literature).

    experts = session_experts(record)            # [tokens, moe layers, top-k] or None
    with replay_routing(model, experts[:-1]):    # the positions the forward computes
        logits = model(ids[None, :-1]).logits[0]
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np


def decode_experts(data: bytes, shape: list[int]) -> np.ndarray:
    """A turn's recorded experts (raw uint8 [positions, moe layers, top-k])."""
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def session_experts(record: dict[str, Any]) -> np.ndarray | None:
    """The experts of every position of the session's sequence, joined from its turns (each
    turn holds the positions it computed that the turns before it did not); None if a turn
    has none or they do not tile the sequence."""
    parts, covered = [], 0
    for turn in record["turns"]:
        if not turn.get("routed_experts"):
            return None
        start, experts = turn["routed_experts_start"], decode_experts(
            turn["routed_experts"], turn["routed_experts_shape"])
        if start > covered:
            return None
        parts.append(experts[covered - start:])
        covered = start + len(experts)
    if not parts:
        return None
    joined = np.concatenate(parts)
    return joined if len(joined) >= len(record["token_ids"]) - 1 else None


def _routers(model: Any) -> list[Any]:
    """The model's MoE routers in layer order (modules returning logits, weights, indices)."""
    return [m for m in model.modules()
            if type(m).__name__.endswith("TopkRouter") and hasattr(m, "top_k")]


@contextlib.contextmanager
def capture_routing(model: Any) -> Iterator[list[Any]]:
    """Within the block, each forward of `model` (one sequence) appends to the yielded list the
    experts its routers chose, uint8 [positions, layers, top-k]."""
    routers = _routers(model)
    seen: list[Any] = [None] * len(routers)
    out: list[Any] = []

    def hook(layer: int) -> Any:
        def record(module: Any, args: Any, result: Any) -> None:
            seen[layer] = result[2].detach().cpu().numpy().astype(np.uint8)
            if layer == len(routers) - 1:
                out.append(np.stack(seen, axis=1))
        return record

    handles = [r.register_forward_hook(hook(i)) for i, r in enumerate(routers)]
    try:
        yield out
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def replay_routing(model: Any, experts: np.ndarray) -> Iterator[None]:
    """Within the block, every MoE router of `model` (a transformers GLM-MoE family model)
    picks the experts of `experts` [positions, layers, top-k] for the positions of a batch of
    one sequence; the weights are its own scores of those experts, normalised and scaled as
    it would."""
    import torch

    routers = _routers(model)
    if experts.shape[1] != len(routers):
        raise ValueError(f"recorded experts for {experts.shape[1]} MoE layers, the model has "
                         f"{len(routers)}")

    def replayed(router: Any, layer: int) -> Any:
        def forward(hidden_states: Any) -> tuple[Any, Any, Any]:
            hidden = hidden_states.view(-1, router.hidden_dim)
            logits = torch.nn.functional.linear(hidden.float(), router.weight.float())
            scores = logits.sigmoid()
            index = torch.from_numpy(experts[:len(hidden), layer].astype(np.int64))
            weights = scores.gather(1, index)
            if router.norm_topk_prob:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
            return logits, weights * router.routed_scaling_factor, index
        return forward

    try:
        for layer, router in enumerate(routers):
            router.forward = replayed(router, layer)
        yield
    finally:
        for router in routers:
            router.__dict__.pop("forward", None)

"""The token masks an engine applied to a constrained turn, rebuilt from the turn's record.

A trainer that corrects for off-policy data needs the probability its current weights give each
sampled token under the same constraint the engine sampled it under: the grammar's mask, the
UTF-8 guard the project's engine plugin narrows it with (serving/engine/plugin.py, part 3), the
logit bias, then temperature and top-p. The record keeps the grammar's text and the bias of
every turn; this module walks the recorded tokens through the same xgrammar matcher and the
same guard, in the engine's order, and gives back the allowed set at each position. A position
with one allowed token is forced: its behaviour logprob is 0, and no gradient flows through it.

    replay = GrammarReplay(model_dir)
    masks = replay.bitmasks(turn["grammar"], turn["completion_token_ids"])  # packed, [n, words]
    logprobs = replay.masked_logprobs(logits, masks, turn["completion_token_ids"],
                                      turn["temperature"], turn["top_p"],
                                      json.loads(turn["logit_bias"]))

xgrammar (and with it torch and transformers) is imported here, never by the face of serving
that the job's actors load.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from serving.model_dir import engine_stop_ids
from serving.toolcall.utf8 import BETWEEN, Utf8Guard


class ReplayError(ValueError):
    """The recorded tokens do not fit the recorded grammar (a record from another grammar, or a
    corrupted one)."""


class GrammarReplay:
    """Allowed token sets of recorded turns, for one model folder (its tokenizer and vocab)."""

    def __init__(self, model_dir: str | Path, stop_ids: list[int] | None = None) -> None:
        import xgrammar as xgr
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        self.vocab_size = int(json.loads((self.model_dir / "config.json").read_text())
                              ["vocab_size"])
        tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        # as vLLM's xgrammar backend builds it (vllm/v1/structured_output/backend_xgrammar.py)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.stop_ids = engine_stop_ids(self.model_dir) if stop_ids is None else stop_ids
        self.words = (self.vocab_size + 31) // 32
        self.guard = Utf8Guard(info.decoded_vocab, self.words)
        self._xgr = xgr

    @functools.lru_cache(maxsize=64)  # noqa: B019 - one replay object per trainer
    def _compiled(self, grammar: str) -> Any:
        return self.compiler.compile_grammar(grammar)

    def bitmasks(self, grammar: str, token_ids: list[int]) -> np.ndarray:
        """The engine's token bitmask before each sampled token: int32 [len(token_ids), words],
        token i allowed when bit i % 32 of word i // 32 is set (xgrammar's packing)."""
        xgr = self._xgr
        matcher = xgr.GrammarMatcher(self._compiled(grammar),
                                     override_stop_tokens=self.stop_ids or None)
        out = xgr.allocate_token_bitmask(max(1, len(token_ids)), self.vocab_size).numpy()
        out = out[:len(token_ids)].copy()
        row = xgr.allocate_token_bitmask(1, self.vocab_size)
        state = BETWEEN
        for k, token in enumerate(token_ids):
            if matcher.is_terminated():
                raise ReplayError(f"token {k} ({token}) follows the grammar's end")
            matcher.fill_next_token_bitmask(row, 0)
            grammar_row = row.numpy()[0]
            # the plugin's guard: the grammar's mask narrowed to tokens that continue the
            # output as valid UTF-8, unless that leaves nothing (then the grammar's alone)
            guarded = grammar_row & self.guard.masks[max(state, BETWEEN)]
            out[k] = guarded if guarded.any() else grammar_row
            if not matcher.accept_token(token):
                raise ReplayError(f"token {k} ({token}) is not allowed by the grammar there")
            state = self.guard.next_state(state, token)
        return out

    def allowed(self, grammar: str, token_ids: list[int]) -> np.ndarray:
        """The allowed set before each sampled token: bool [len(token_ids), vocab_size]."""
        return unpack(self.bitmasks(grammar, token_ids), self.vocab_size)

    def masked_logprobs(self, logits: Any, bitmasks: np.ndarray | None, token_ids: list[int],
                        temperature: float = 1.0, top_p: float = 1.0,
                        logit_bias: dict[int, float] | None = None) -> Any:
        """`masked_logprobs` of rows whose allowed sets are `bitmasks` (None: unconstrained)."""
        import torch

        allowed = (torch.ones(logits.shape, dtype=torch.bool) if bitmasks is None
                   else torch.from_numpy(unpack(bitmasks, self.vocab_size)))
        return masked_logprobs(logits, allowed, token_ids, temperature, top_p, logit_bias)


def unpack(bitmasks: np.ndarray, vocab_size: int) -> np.ndarray:
    """xgrammar's packed int32 bitmask rows -> bool rows of `vocab_size`."""
    bits = np.unpackbits(bitmasks.view(np.uint8).reshape(len(bitmasks), -1), axis=1,
                         bitorder="little")
    return bits[:, :vocab_size].astype(bool)


def masked_logprobs(logits: Any, allowed: Any, token_ids: Any, temperature: float = 1.0,
                    top_p: float = 1.0, logit_bias: dict[int, float] | None = None) -> Any:
    """log p(token) under the distribution the engine samples from, given `logits` [n, vocab]
    (torch, the model's own at each sampled position) and `allowed` [n, vocab] (bool): the
    logit bias added, the disallowed tokens removed, temperature applied, top-p kept, then
    renormalised (vLLM's sampler order). Differentiable in `logits`; a forced position gives
    exactly 0 and no gradient. At temperature 0 the engine samples greedily: every token's
    behaviour logprob is 0."""
    import torch

    logits = logits.float()
    n, width = logits.shape
    allowed = torch.as_tensor(allowed, device=logits.device)
    if allowed.shape[1] < width:  # logits padded past the vocabulary: never allowed
        allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[1]))
    index = torch.as_tensor(token_ids, device=logits.device, dtype=torch.long)[:, None]
    if temperature < 1e-5:
        return torch.zeros(n, device=logits.device) + 0.0 * logits.gather(1, index)[:, 0]
    if logit_bias:
        bias = torch.zeros(width, device=logits.device)
        for token, value in logit_bias.items():
            bias[int(token)] = float(value)
        logits = logits + bias
    logits = logits.masked_fill(~allowed[:, :width], float("-inf")) / temperature
    if top_p < 1.0:
        logits = _top_p(logits, top_p)
    return torch.log_softmax(logits, dim=-1).gather(1, index)[:, 0]


def _top_p(logits: Any, top_p: float) -> Any:
    """vLLM's top-p: keep the smallest set of most likely tokens whose mass reaches `top_p`
    (the most likely token always kept)."""

    ordered, order = logits.sort(dim=-1, descending=False)
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1 - top_p
    drop[:, -1] = False
    return logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))

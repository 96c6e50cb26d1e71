"""A trainer's replay of a turn's masks equals what the engine masked with, and the masked
logprob it gives is the behaviour policy's, checked against independent oracles."""

import math
import random

import numpy as np
import pytest
import torch
import xgrammar as xgr
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rollfleet.paths import ROOT
from serving.tiny_model import ensure_tiny_glm
from serving.toolcall import build_grammar
from serving.toolcall.replay import (
    GrammarReplay,
    ReplayError,
    masked_logprobs,
    unpack,
)


@pytest.fixture(scope="module")
def model_dir():
    return ensure_tiny_glm(ROOT / ".cache" / "models")


@pytest.fixture(scope="module")
def replay(model_dir):
    return GrammarReplay(model_dir)


def _engine_walk(replay, tokenizer, guarded_grammar, grammar, seed, multibyte_bias=0.5):
    """A completion the engine's own guarded grammar admits, drawn at random from its masks
    (with a lean toward multi-byte tokens, where the UTF-8 guard acts), and the mask the
    engine filled before each token. The engine compiles the structural tag, as vLLM's front
    door sends it; the replay compiles the recorded EBNF."""
    rng = random.Random(seed)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=replay.vocab_size)
    compiled = xgr.GrammarCompiler(info, cache_enabled=False).compile_structural_tag(
        grammar.json())
    engine = guarded_grammar(vocab_size=replay.vocab_size, ctx=compiled,
                             matcher=xgr.GrammarMatcher(compiled,
                                                        override_stop_tokens=replay.stop_ids))
    vocab = info.decoded_vocab
    tokens, masks = [], []
    row = xgr.allocate_token_bitmask(1, replay.vocab_size)
    while not engine.is_terminated() and len(tokens) < 400:
        engine.fill_bitmask(row, 0)
        masks.append(row.numpy()[0].copy())
        allowed = np.flatnonzero(unpack(masks[-1][None], replay.vocab_size)[0])
        wide = [t for t in allowed if t < len(vocab) and any(b >= 0x80 for b in vocab[t])]
        pick = int(rng.choice(wide if wide and rng.random() < multibyte_bias else allowed))
        assert engine.accept_tokens("r", [pick])
        tokens.append(pick)
    return tokens, np.array(masks)


@pytest.mark.parametrize("choice", ["required", "auto"])
@pytest.mark.parametrize("seed", range(4))
def test_the_replayed_masks_are_the_engines_at_every_position(
        replay, tokenizer, guarded_grammar, tools, token_ids, choice, seed):
    grammar = build_grammar(tools, choice, False, False, 256, token_ids)
    tokens, engine_masks = _engine_walk(replay, tokenizer, guarded_grammar, grammar, seed)
    assert len(tokens) > 5
    replayed = replay.bitmasks(grammar.ebnf, tokens)
    assert replayed.shape == engine_masks.shape
    diff = np.flatnonzero((replayed != engine_masks).any(axis=1))
    assert diff.size == 0, f"first differing position {diff[:1]}"


def test_a_token_the_grammar_refuses_is_named(replay, tools, token_ids, tokenizer):
    grammar = build_grammar(tools, "required", False, False, 256, token_ids)
    ids = tokenizer.encode("<tool_call>nosuchtool", add_special_tokens=False)
    with pytest.raises(ReplayError, match=r"token 1 \("):
        replay.bitmasks(grammar.ebnf, ids)


def _oracle(logits, allowed, token, temperature, top_p, bias):
    """The behaviour logprob written out in plain Python over one position."""
    z = [(logits[i] + bias.get(i, 0.0)) / temperature for i in range(len(logits))
         if allowed[i]]
    ids = [i for i in range(len(logits)) if allowed[i]]
    m = max(z)
    p = [math.exp(v - m) for v in z]
    total = sum(p)
    p = [v / total for v in p]
    order = sorted(range(len(ids)), key=lambda k: z[k])  # vLLM sorts the logits, ascending
    kept, below = set(range(len(ids))), 0.0
    for k in order[:-1]:
        below += p[k]
        if below <= 1 - top_p:
            kept.discard(k)
    mass = sum(p[k] for k in kept)
    k = ids.index(token)
    return math.log(p[k] / mass) if k in kept else -math.inf


@settings(max_examples=60)
@given(st.data())
def test_masked_logprobs_are_the_behaviour_distributions(data):
    vocab = data.draw(st.integers(2, 12))
    logits = data.draw(st.lists(st.floats(-8, 8), min_size=vocab, max_size=vocab))
    allowed = data.draw(st.lists(st.booleans(), min_size=vocab, max_size=vocab))
    if not any(allowed):
        allowed[0] = True
    token = data.draw(st.sampled_from([i for i in range(vocab) if allowed[i]]))
    temperature = data.draw(st.sampled_from([0.5, 1.0, 1.7]))
    top_p = data.draw(st.sampled_from([0.3, 0.9, 1.0]))
    bias = data.draw(st.dictionaries(st.integers(0, vocab - 1), st.sampled_from([-100.0, 2.0]),
                                     max_size=2))
    kept = sorted((logits[i] + bias.get(i, 0.0)) / temperature
                  for i in range(vocab) if allowed[i])
    # tokens whose logits tie (in float32) may be kept in either order at the top-p boundary
    assume(all(b - a > 1e-4 for a, b in zip(kept, kept[1:], strict=False)))
    want = _oracle(logits, allowed, token, temperature, top_p, bias)
    got = masked_logprobs(torch.tensor([logits]), torch.tensor([allowed]), [token],
                          temperature, top_p, bias)[0].item()
    if want == -math.inf:
        assert got == -math.inf
    else:
        assert got == pytest.approx(want, abs=1e-4)


def test_a_forced_token_is_exactly_zero_with_no_gradient_and_greedy_is_a_point_mass():
    logits = torch.tensor([[1.0, 3.0, -2.0], [0.5, 0.1, 0.2]], requires_grad=True)
    allowed = torch.tensor([[False, True, False], [True, True, True]])
    out = masked_logprobs(logits, allowed, [1, 0])
    assert out[0].item() == 0.0 and out[1].item() < 0
    out[0].backward()
    assert logits.grad.abs().sum().item() == 0.0
    greedy = masked_logprobs(logits, allowed, [1, 2], temperature=0.0)
    assert greedy.tolist() == [0.0, 0.0]


def test_logits_padded_past_the_vocabulary_are_never_allowed():
    logits = torch.tensor([[0.0, 0.0, 50.0]])  # the padded column would take all the mass
    out = masked_logprobs(logits, torch.tensor([[True, True]]), [0])
    assert out.item() == pytest.approx(math.log(0.5))

"""The conformance set (tests/serving/data/toolsets: tools written after real agents' published
definitions) under the grammar as the engines run it: every walk's calls validate.

A walk samples uniformly among the tokens the guarded grammar allows (as random weights do,
only more evenly), with `required`, `auto` and each tool named; every call must parse with no
issue and validate against its tool's schema with the `jsonschema` library, formats asserted.
The same set is sampled through real engines by `scripts/bench_toolschemas.py`.
"""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import xgrammar as xgr
from jsonschema import Draft202012Validator

from serving.toolcall import build_grammar, parse_glm

TOOLSETS = sorted((Path(__file__).parents[1] / "data" / "toolsets").glob("*.json"))
BUDGET = 384  # tokens per turn: bounds shrink to fit, walks stay short


def test_the_set_is_forty_tools_or_more_from_named_sources():
    tools = [t for path in TOOLSETS for t in json.loads(path.read_text())["tools"]]
    assert len(tools) >= 40
    assert all(json.loads(path.read_text())["source"] for path in TOOLSETS)
    names = [t["function"]["name"] for t in tools]
    assert len(set(names)) == len(names)


def _choices(tools):
    return ["required", "auto"] + [
        {"type": "function", "function": {"name": t["function"]["name"]}}
                                   for t in tools]


@pytest.mark.parametrize("path", TOOLSETS, ids=lambda p: p.stem)
def test_every_sampled_call_validates(path, tokenizer, token_ids, guarded_grammar):
    tools = json.loads(path.read_text())["tools"]
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    stops = sorted({token_ids["<|observation|>"], token_ids["<|user|>"],
                    token_ids["<|endoftext|>"], tokenizer.eos_token_id})
    vocab = len(tokenizer)
    mask = xgr.allocate_token_bitmask(1, vocab)
    calls = 0
    for choice in _choices(tools):
        grammar = build_grammar(tools, choice, False, False, BUDGET, token_ids)
        compiled = compiler.compile_structural_tag(grammar.json())
        walk = guarded_grammar(vocab_size=vocab, ctx=compiled,
                               matcher=xgr.GrammarMatcher(compiled, override_stop_tokens=stops))
        rng = random.Random(json.dumps(choice))
        out: list[int] = []
        while not walk.is_terminated():
            walk.fill_bitmask(mask, 0)
            allowed = np.flatnonzero(np.unpackbits(mask.numpy().view(np.uint8),
                                                   bitorder="little")[:vocab])
            token = int(allowed[rng.randrange(len(allowed))])
            if token in stops:
                break
            assert walk.accept_tokens("walk", [token])
            out.append(token)
        assert len(out) <= BUDGET
        parsed = parse_glm([info.decoded_vocab[i] for i in out], tools, thinking=False)
        assert parsed.issues == []
        if choice != "auto":
            assert len(parsed.calls) == 1
        if isinstance(choice, dict):
            assert parsed.calls[0].name == choice["function"]["name"]
        for call in parsed.calls:
            schema = next(t for t in tools if t["function"]["name"] == call.name)
            validator = Draft202012Validator(schema["function"]["parameters"],
                                             format_checker=Draft202012Validator.FORMAT_CHECKER)
            assert call.issues == [], (call.name, call.issues, call.arguments)
            assert [e.message for e in validator.iter_errors(call.arguments)] == [], call
            calls += 1
    assert calls >= len(tools)

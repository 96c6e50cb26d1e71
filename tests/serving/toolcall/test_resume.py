"""A grammar resumed after the tokens a turn sampled before an update cut it (the engine
plugin's part 7) masks the next token exactly as the uncut turn's grammar would have."""

import types

import numpy as np
import pytest
import xgrammar as xgr

from serving.engine.plugin import GRAMMAR_PREFIX_ARG, resume_grammars
from serving.toolcall import build_grammar


@pytest.fixture(scope="module")
def resumed(guarded_grammar, tokenizer):
    """vLLM's StructuredOutputManager with the plugin's resume, over a stand-in compile that
    returns the engine's guarded grammar for the project's structural tag."""
    from vllm.v1.structured_output import StructuredOutputManager

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)

    def compile_tag(self, request):
        compiled = compiler.compile_structural_tag(request.tag)
        return guarded_grammar(vocab_size=len(tokenizer), matcher=xgr.GrammarMatcher(compiled),
                               ctx=compiled)

    original = StructuredOutputManager._create_grammar
    StructuredOutputManager._create_grammar = compile_tag
    resume_grammars()
    yield StructuredOutputManager._create_grammar
    StructuredOutputManager._create_grammar = original


def _mask(grammar, vocab):
    row = xgr.allocate_token_bitmask(1, vocab)
    grammar.fill_bitmask(row, 0)
    return row.numpy()[0]


def test_the_resumed_grammar_masks_as_the_uncut_one(resumed, tools, token_ids, tokenizer):
    tag = build_grammar(tools, "required", False, False, 256, token_ids).json()
    text = "<tool_call>bash<arg_key>command</arg_key><arg_value>ls é"  # mid-value, 2-byte char
    ids = tokenizer.encode(text, add_special_tokens=False)
    for cut in range(1, len(ids)):
        uncut = resumed(None, types.SimpleNamespace(
            tag=tag, request_id="a", sampling_params=types.SimpleNamespace(extra_args=None)))
        assert uncut.accept_tokens("a", ids[:cut])
        again = resumed(None, types.SimpleNamespace(
            tag=tag, request_id="b",
            sampling_params=types.SimpleNamespace(extra_args={GRAMMAR_PREFIX_ARG: ids[:cut]})))
        assert np.array_equal(_mask(again, len(tokenizer)), _mask(uncut, len(tokenizer))), cut


def test_a_prefix_the_grammar_refuses_fails_the_request(resumed, tools, token_ids, tokenizer):
    tag = build_grammar(tools, "required", False, False, 256, token_ids).json()
    wrong = tokenizer.encode("hello", add_special_tokens=False)
    with pytest.raises(ValueError, match="refuses the .* tokens it was to resume after"):
        resumed(None, types.SimpleNamespace(
            tag=tag, request_id="c",
            sampling_params=types.SimpleNamespace(extra_args={GRAMMAR_PREFIX_ARG: wrong})))

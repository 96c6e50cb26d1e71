"""A grammar resumed after the tokens a turn sampled before an update cut it (the engine
plugin's part 7) masks the next token exactly as the uncut turn's grammar would have, by either
spelling: the tokens in an extra arg (vLLM's server) or an EBNF whose first line counts the
prompt's last tokens (Dynamo's frontend)."""

import types

import numpy as np
import pytest
import xgrammar as xgr

from serving.engine.plugin import GRAMMAR_PREFIX_ARG, GRAMMAR_PREFIX_LINE, resume_grammars
from serving.toolcall import build_grammar


@pytest.fixture(scope="module")
def resumed(guarded_grammar, tokenizer):
    """vLLM's StructuredOutputManager with the plugin's resume, over a stand-in compile that
    returns the engine's guarded grammar for the project's structural tag or EBNF (as vLLM's
    compile does, from the request's structured-output key)."""
    from vllm.v1.structured_output import StructuredOutputManager

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)

    def compile_tag(self, request):
        kind, spec = request.structured_output_request.structured_output_key
        assert not spec.startswith("#"), "the count line reached the compiler"
        compiled = (compiler.compile_grammar(spec) if kind == "grammar"
                    else compiler.compile_structural_tag(spec))
        return guarded_grammar(vocab_size=len(tokenizer), matcher=xgr.GrammarMatcher(compiled),
                               ctx=compiled)

    original = StructuredOutputManager._create_grammar
    StructuredOutputManager._create_grammar = compile_tag
    resume_grammars()
    yield StructuredOutputManager._create_grammar
    StructuredOutputManager._create_grammar = original


def _request(rid, kind, spec, extra=None, prompt=()):
    return types.SimpleNamespace(
        request_id=rid, prompt_token_ids=list(prompt),
        structured_output_request=types.SimpleNamespace(structured_output_key=(kind, spec)),
        sampling_params=types.SimpleNamespace(extra_args=extra))


def _mask(grammar, vocab):
    row = xgr.allocate_token_bitmask(1, vocab)
    grammar.fill_bitmask(row, 0)
    return row.numpy()[0]


def test_the_resumed_grammar_masks_as_the_uncut_one(resumed, tools, token_ids, tokenizer):
    tag = build_grammar(tools, "required", False, False, 256, token_ids).json()
    text = "<tool_call>bash<arg_key>command</arg_key><arg_value>ls é"  # mid-value, 2-byte char
    ids = tokenizer.encode(text, add_special_tokens=False)
    for cut in range(1, len(ids)):
        uncut = resumed(None, _request("a", "structural_tag", tag))
        assert uncut.accept_tokens("a", ids[:cut])
        again = resumed(None, _request("b", "structural_tag", tag, {GRAMMAR_PREFIX_ARG: ids[:cut]}))
        assert np.array_equal(_mask(again, len(tokenizer)), _mask(uncut, len(tokenizer))), cut


def test_an_ebnf_resumes_after_the_prompt_tokens_its_first_line_counts(
        resumed, tools, token_ids, tokenizer):
    ebnf = build_grammar(tools, "required", False, False, 256, token_ids).ebnf
    ids = tokenizer.encode("<tool_call>bash<arg_key>command</arg_key><arg_value>ls é",
                           add_special_tokens=False)
    earlier = tokenizer.encode("the task so far", add_special_tokens=False)
    for cut in (1, len(ids) // 2, len(ids) - 1):
        uncut = resumed(None, _request("a", "grammar", ebnf))
        assert uncut.accept_tokens("a", ids[:cut])
        again = resumed(None, _request("b", "grammar", f"{GRAMMAR_PREFIX_LINE}{cut}\n{ebnf}",
                                       prompt=earlier + ids[:cut]))
        assert np.array_equal(_mask(again, len(tokenizer)), _mask(uncut, len(tokenizer))), cut
    with pytest.raises(ValueError, match="resumes after 9 tokens of a 3-token prompt"):
        resumed(None, _request("c", "grammar", f"{GRAMMAR_PREFIX_LINE}9\n{ebnf}",
                               prompt=ids[:3]))


def test_a_prefix_the_grammar_refuses_fails_the_request(resumed, tools, token_ids, tokenizer):
    tag = build_grammar(tools, "required", False, False, 256, token_ids).json()
    wrong = tokenizer.encode("hello", add_special_tokens=False)
    with pytest.raises(ValueError, match="refuses the .* tokens it was to resume after"):
        resumed(None, _request("c", "structural_tag", tag, {GRAMMAR_PREFIX_ARG: wrong}))

"""The project's GLM tool-call grammar, checked token by token with xgrammar itself."""

import random

import numpy as np
import pytest
import xgrammar as xgr

from serving.toolcall import CallTooLong, build_grammar, parse_glm


def _matcher(compiler, grammar):
    return xgr.GrammarMatcher(compiler.compile_structural_tag(grammar.json()))


def _accepts(compiler, grammar, ids):
    m = _matcher(compiler, grammar)
    return all(m.accept_token(i) for i in ids)


def _completes(compiler, grammar, ids, eos):
    """`ids` are a whole answer: every token accepted, and then the turn may end."""
    m = _matcher(compiler, grammar)
    return all(m.accept_token(i) for i in ids) and m.accept_token(eos)


def _enc(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


CALL = ("<tool_call>bash<arg_key>command</arg_key><arg_value>ls -la</arg_value></tool_call>")


@pytest.fixture
def required(tools, token_ids):
    return build_grammar(tools, "required", False, False, 2048, token_ids)


def test_canonical_call_is_accepted(compiler, tokenizer, required):
    assert _completes(compiler, required, _enc(tokenizer, CALL), tokenizer.eos_token_id)


@pytest.mark.parametrize("bad", [
    CALL.replace("bash<arg_key>", "bash <arg_key>"),  # whitespace between tags
    CALL.replace("bash", "rm"),  # an undeclared tool
    "<tool_call>read_file<arg_key>path</arg_key><arg_value>a</arg_value></tool_call>",  # missing
    CALL.replace("ls -la", "x" * 61),  # longer than maxLength
    "Sure! " + CALL,  # free text before a required call
])
def test_invalid_calls_are_rejected(compiler, tokenizer, required, bad):
    assert not _completes(compiler, required, _enc(tokenizer, bad), tokenizer.eos_token_id)


def test_string_values_admit_only_complete_characters(compiler, tokenizer, required,
                                                      token_ids):
    """Regression: xgrammar's any_text admitted bytes that form no character, and a sampled
    path with a stray byte ran as a different path."""
    head = _enc(tokenizer, "<tool_call>bash<arg_key>command</arg_key><arg_value>")
    snowman = _enc(tokenizer, "☃")  # three bytes: byte tokens of the byte-level vocabulary
    assert len(snowman) > 1
    assert _accepts(compiler, required, head + snowman + [token_ids["</arg_value>"]])
    assert not _accepts(compiler, required, head + snowman[:1] + [token_ids["</arg_value>"]])
    assert not _accepts(compiler, required, head + snowman[1:])  # continuation bytes first


def _byte_tokens(tokenizer) -> dict[int, int]:
    """byte -> the id of the vocabulary's token holding just that byte."""
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    return {v[0]: i for i, v in enumerate(info.decoded_vocab) if len(v) == 1}


def test_string_values_refuse_encoded_surrogates(compiler, tokenizer, required, token_ids):
    """Regression: `[\\s\\S]` admitted ED A0 80 (an encoded surrogate), which no UTF-8
    decoder accepts: 4 of 200 project-grammar turns of the tool-call benchmark were invalid."""
    head = _enc(tokenizer, "<tool_call>bash<arg_key>command</arg_key><arg_value>")
    byte = _byte_tokens(tokenizer)
    assert _accepts(compiler, required, head + [byte[0xED], byte[0x9F], byte[0xBF]])  # U+D7FF
    assert _accepts(compiler, required, head + [byte[0xED], byte[0x80], byte[0x80]])  # U+D000
    assert not _accepts(compiler, required, head + [byte[0xED], byte[0xA0], byte[0x80]])


@pytest.mark.xfail(strict=True, reason="xgrammar 0.2.7 decodes overlong UTF-8 forms (C0 80 = "
                   "U+0000) as their code point, and a grammar sees code points, not bytes; the "
                   "parser finds such a value (invalid_utf8) and the call does not run")
def test_string_values_refuse_overlong_forms(compiler, tokenizer, required):
    head = _enc(tokenizer, "<tool_call>bash<arg_key>command</arg_key><arg_value>")
    byte = _byte_tokens(tokenizer)
    assert not _accepts(compiler, required, head + [byte[0xC1], byte[0x81]])  # "A", overlong


def test_markup_inside_a_value_is_text_and_parsed_as_such(compiler, tokenizer, required, tools):
    """The grammar reads a markup token inside a value as text; so does the parser."""
    inner = "a</arg_value>b<tool_call>c"
    ids = _enc(tokenizer, CALL.replace("ls -la", inner))
    assert _completes(compiler, required, ids, tokenizer.eos_token_id)
    parsed = parse_glm([tokenizer.decode([i]).encode() for i in ids], tools,
                       thinking=False)
    assert [(c.name, c.arguments, c.issues) for c in parsed.calls] == [
        ("bash", {"command": inner}, [])]


def test_markup_spelled_from_sub_tokens_is_rejected(compiler, tokenizer, required):
    """Regression: `<tool_call>` spelled from ordinary tokens passed stock grammars and then
    yielded no parsed call (vLLM issue 58315). Only the markup token itself may start a call."""
    spelled = [i for ch in "<tool_call>" for i in _enc(tokenizer, ch)]
    assert len(spelled) > 1
    assert tokenizer.decode(spelled) == "<tool_call>"
    assert not _accepts(compiler, required, spelled + _enc(tokenizer, "bash"))
    tokens = [tokenizer.decode([i]).encode() for i in spelled + _enc(tokenizer, "bash</tool_call>")]
    parsed = parse_glm(tokens, [], thinking=False)
    assert parsed.calls == [] and parsed.issues == ["subtoken_markup"]


def test_named_choice_allows_only_that_tool(compiler, tokenizer, tools, token_ids):
    named = build_grammar(tools, {"type": "function", "function": {"name": "submit"}}, False,
                          False, 64, token_ids)
    assert _accepts(compiler, named, _enc(tokenizer, "<tool_call>submit</tool_call>"))
    assert not _accepts(compiler, named, _enc(tokenizer, CALL))


def test_a_budget_that_cannot_hold_a_call_refuses(tools, token_ids):
    with pytest.raises(CallTooLong):
        build_grammar(tools, "required", False, False, 50, token_ids)


def _allowed(mask, vocab: int) -> np.ndarray:
    bits = np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)


@pytest.mark.parametrize(("choice", "parallel", "thinking"), [
    ("required", False, False), ("required", True, False), ("auto", False, False),
    ("required", False, True), ("auto", True, True),
])
def test_random_walks_always_end_in_valid_complete_calls(compiler, tokenizer, tools, token_ids,
                                                         choice, parallel, thinking):
    """Sample uniformly among the tokens the grammar allows, as random weights do: every walk
    ends within the token budget, and every call it contains parses valid.

    Each grammar family gets its own compiler, as in an engine of one job: xgrammar 0.2.7's
    cross-grammar cache mixes up token elements of different grammars (see the next test)."""
    worst = build_grammar(tools, choice, parallel, thinking, 10**6, token_ids).worst_call_tokens
    budget = worst + 64  # little room for free text: walks stay short
    grammar = build_grammar(tools, choice, parallel, thinking, budget, token_ids)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiled = xgr.GrammarCompiler(info).compile_structural_tag(grammar.json())
    stops = {token_ids["<|observation|>"], token_ids["<|user|>"], token_ids["<|endoftext|>"],
             tokenizer.eos_token_id}
    rng = random.Random(f"{choice}{parallel}{thinking}")
    vocab = len(tokenizer)
    for _ in range(4):
        # as vLLM builds it: the request's stop tokens (the model's EOS list) end the answer
        # and are never text inside it
        m = xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(stops))
        mask = xgr.allocate_token_bitmask(1, vocab)
        out: list[int] = []
        while not m.is_terminated():
            m.fill_next_token_bitmask(mask)
            allowed = _allowed(mask, vocab)
            token = int(allowed[rng.randrange(len(allowed))])
            if token in stops:
                break
            assert m.accept_token(token)
            out.append(token)
        assert len(out) <= budget
        parsed = parse_glm([info.decoded_vocab[i] for i in out], tools, thinking)
        if choice == "required":
            assert parsed.calls, tokenizer.decode(out)
        assert all(c.valid for c in parsed.calls), [(c.issues, c.arguments) for c in parsed.calls]
        assert parsed.issues == []
        assert len(parsed.calls) <= (4 if parallel else 1)


@pytest.mark.xfail(strict=True, reason="xgrammar 0.2.7/0.2.8: the cross-grammar cache keys a "
                   "token element by its position, not its token id (fixed upstream in commit "
                   "3ab88dc0, not released); README: known limits")
def test_two_grammars_in_one_caching_compiler_keep_their_own_tokens(tokenizer, token_ids):
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info, cache_enabled=True)
    compiler.compile_grammar(f"root ::= Token({token_ids['<tool_call>']})")
    think_end = compiler.compile_grammar(f"root ::= Token({token_ids['</think>']})")
    mask = xgr.allocate_token_bitmask(1, len(tokenizer))
    xgr.GrammarMatcher(think_end).fill_next_token_bitmask(mask)
    assert _allowed(mask, len(tokenizer)).tolist() == [token_ids["</think>"]]

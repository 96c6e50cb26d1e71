"""The UTF-8 guard: after any bytes, only tokens that continue them as valid UTF-8."""

import functools
import itertools

import numpy as np
import pytest
import xgrammar as xgr
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.toolcall import build_grammar
from serving.toolcall.utf8 import BETWEEN, INVALID, Utf8Guard


def _valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.fixture(scope="module")
def byte_guard():
    """A vocabulary of the 256 single bytes."""
    return Utf8Guard([bytes([b]) for b in range(256)], 8)


def _walk(guard, data: bytes) -> int:
    state = BETWEEN
    for b in data:
        state = int(guard.after[state, b])
        if state == INVALID:
            return INVALID
    return state


def test_every_one_to_four_byte_string_is_judged_as_python_decodes_it(byte_guard):
    """Exhaustive over 1-3 bytes, and over every lead byte followed by the boundary values
    of each continuation position for 4 bytes: complete and valid iff Python decodes it."""
    edges = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
    cases = [bytes([a]) for a in range(256)]
    cases += [bytes([a, b]) for a in range(256) for b in range(256)]
    cases += [bytes([a, b, c]) for a in range(0xC0, 256) for b in range(0x70, 0xC1)
              for c in edges]
    cases += [bytes([a, b, c, d]) for a in range(0xE0, 256) for b in edges for c in edges
              for d in edges]
    for data in cases:
        state = _walk(byte_guard, data)
        if _valid_utf8(data):
            assert state == BETWEEN, data.hex()
        elif state == BETWEEN:
            pytest.fail(f"{data.hex()} is not UTF-8 yet passed")
        elif state != INVALID:  # inside a sequence: some continuation must complete it
            assert any(_valid_utf8(data + bytes([x])) or _walk(byte_guard, data + bytes([x]))
                       not in (INVALID, BETWEEN) for x in range(0x80, 0xC0)), data.hex()


def test_overlong_forms_are_refused(byte_guard):
    for overlong in (b"\xc0\x80", b"\xc1\x81", b"\xe0\x80\x80", b"\xe0\x9f\xbf",
                     b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xed\xa0\x80",
                     b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80"):
        assert _walk(byte_guard, overlong) == INVALID, overlong.hex()


def test_masks_are_packed_as_xgrammar_packs_them(byte_guard):
    """Bit b % 32 of word b // 32: after E0 only A0..BF may follow."""
    after_e0 = int(byte_guard.after[BETWEEN, 0xE0])
    bits = np.unpackbits(byte_guard.masks[after_e0].view(np.uint8), bitorder="little")
    assert np.flatnonzero(bits[:256]).tolist() == list(range(0xA0, 0xC0))


def test_a_grammar_of_characters_refuses_overlong_forms_once_guarded(
        compiler, tokenizer, tools, token_ids, guarded_grammar):
    """xgrammar alone admits C1 81 (an overlong "A") in a string value
    (test_grammar.py::test_string_values_refuse_overlong_forms, a strict xfail); the engine's
    guarded mask does not."""
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    byte = {v[0]: i for i, v in enumerate(info.decoded_vocab) if len(v) == 1}
    grammar = build_grammar(tools, "required", False, False, 2048, token_ids)
    compiled = compiler.compile_structural_tag(grammar.json())
    guarded = guarded_grammar(vocab_size=len(tokenizer), matcher=xgr.GrammarMatcher(compiled),
                              ctx=compiled)
    head = tokenizer.encode("<tool_call>bash<arg_key>command</arg_key><arg_value>",
                            add_special_tokens=False)
    assert guarded.accept_tokens("r", head)
    mask = xgr.allocate_token_bitmask(1, len(tokenizer))
    guarded.fill_bitmask(mask, 0)
    allowed = set(np.flatnonzero(np.unpackbits(mask.numpy().view(np.uint8),
                                               bitorder="little")[:len(tokenizer)]))
    assert byte[0xC1] not in allowed and byte[0xC0] not in allowed
    assert byte[0xC3] in allowed and byte[ord("A")] in allowed
    assert guarded.accept_tokens("r", [byte[0xE0]])  # then only A0..BF
    guarded.fill_bitmask(mask, 0)
    allowed = set(np.flatnonzero(np.unpackbits(mask.numpy().view(np.uint8),
                                               bitorder="little")[:len(tokenizer)]))
    assert byte[0x80] not in allowed and byte[0x9F] not in allowed and byte[0xA0] in allowed
    guarded.rollback(1)  # spec decoding's rollback takes the guard's state back too
    guarded.fill_bitmask(mask, 0)
    allowed = set(np.flatnonzero(np.unpackbits(mask.numpy().view(np.uint8),
                                               bitorder="little")[:len(tokenizer)]))
    assert byte[ord("A")] in allowed


# -- properties against an oracle that knows no byte range: Python's own codec -----------------

@functools.cache
def _proper_prefixes() -> frozenset[bytes]:
    """Every proper, non-empty prefix of a character's UTF-8 form, as Python's encoder writes
    each code point it accepts (it refuses surrogates; nothing above U+10FFFF exists)."""
    out = set()
    for cp in range(0x80, 0x110000):
        try:
            encoded = chr(cp).encode("utf-8")
        except UnicodeEncodeError:
            continue
        out.update(encoded[:n] for n in range(1, len(encoded)))
    return frozenset(out)


def _completable(data: bytes) -> bool:
    """Some bytes appended make `data` valid UTF-8: it decodes, or it is valid up to a last
    character cut short (UTF-8 is prefix-free, so at most one split can fit)."""
    return any(_valid_utf8(data[:len(data) - n]) and data[len(data) - n:] in _proper_prefixes()
               for n in range(1, min(3, len(data)) + 1)) or _valid_utf8(data)


_EDGE_POINTS = [0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xD7FF, 0xE000, 0xFFFF, 0x10000,
                0x3FFFF, 0x40000, 0xFFFFF, 0x100000, 0x10FFFF]
_EDGE_BYTES = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
               0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]
_char_bytes = st.one_of(st.sampled_from(_EDGE_POINTS), st.integers(0, 0x10FFFF)).filter(
    lambda cp: not 0xD800 <= cp < 0xE000).map(lambda cp: chr(cp).encode("utf-8"))
# Tokens of 1-4 bytes: whole characters, pieces of one (truncated heads, stray tails), bytes
# at the edges of UTF-8's ranges, and any bytes at all.
_token = st.one_of(
    _char_bytes,
    st.tuples(_char_bytes, st.integers(1, 3)).map(lambda t: t[0][:t[1]]),
    st.tuples(_char_bytes, st.integers(1, 3)).map(lambda t: t[0][t[1]:]).filter(bool),
    st.lists(st.sampled_from(_EDGE_BYTES), min_size=1, max_size=4).map(bytes),
    st.binary(min_size=1, max_size=4),
)


@st.composite
def _completable_prefix(draw) -> bytes:
    """Valid text, then perhaps the head of one more character: bytes a decoder may still
    accept."""
    head = b"".join(draw(st.lists(_char_bytes, max_size=3)))
    return head + draw(_char_bytes)[:draw(st.integers(0, 3))]


# Every head of the edge characters (none, E0, ED, F4 8F, ...): checked in every example.
_EDGE_HEADS = sorted({chr(cp).encode("utf-8")[:n] for cp in _EDGE_POINTS for n in range(4)})


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=200)
@given(vocab=st.lists(_token, min_size=1, max_size=40), prefix=_completable_prefix(),
       cuts=st.lists(st.integers(0, 16), max_size=4), spare_words=st.integers(0, 1))
def test_the_mask_after_any_prefix_allows_exactly_the_completable_tokens(
        vocab, prefix, cuts, spare_words):
    """The engine ANDs the grammar's mask with masks[state]: a token must be allowed iff the
    output's bytes plus the token can still become valid UTF-8, whatever tokens the output was
    cut into. Bits past the vocabulary stay set (the grammar's mask decides those)."""
    pieces = _split(prefix, cuts)
    walks = [(prefix, range(len(pieces)))]
    walks += [(head, [len(pieces) + i]) for i, head in enumerate(_EDGE_HEADS)]  # b"" is a token
    first = len(pieces) + len(_EDGE_HEADS)
    guard = Utf8Guard(pieces + _EDGE_HEADS + vocab, (first + len(vocab) + 31) // 32 + spare_words)
    for output, tokens in walks:
        state = BETWEEN
        for i in tokens:
            state = guard.next_state(state, i)
        assert (state == BETWEEN) == _valid_utf8(output), output.hex()
        bits = np.unpackbits(guard.masks[state].view(np.uint8), bitorder="little").astype(bool)
        expected = [_completable(output + token) for token in vocab]
        assert bits[first:first + len(vocab)].tolist() == expected, output.hex()
        assert bits[first + len(vocab):].all()


@settings(max_examples=300)
@given(tokens=st.lists(_token, min_size=1, max_size=12))
def test_a_walk_over_any_tokens_marks_invalid_where_the_bytes_stop_being_utf8(tokens):
    """next_state follows any output, guarded or not (where the masks share no token the
    grammar's own mask is used): INVALID at the token after which no bytes could make the
    output since the last restart valid, then afresh; BETWEEN iff those bytes decode."""
    guard = Utf8Guard(tokens, (len(tokens) + 31) // 32)
    state, since = BETWEEN, b""
    for i, token in enumerate(tokens):
        state, since = guard.next_state(state, i), since + token
        if not _completable(since):
            assert state == INVALID, since.hex()
            since = b""
        else:
            assert (state == BETWEEN) == _valid_utf8(since), since.hex()
    # A token outside the vocabulary (padding) changes nothing but the restart.
    assert guard.next_state(state, len(tokens)) == (BETWEEN if state == INVALID else state)


def test_a_vocabulary_of_no_tokens_narrows_nothing():
    """Every bit of the mask past the vocabulary (xgrammar's padding) stays allowed."""
    guard = Utf8Guard([], mask_width=2)
    assert guard.masks.shape == (8, 2) and (guard.masks == -1).all()
    assert guard.next_state(BETWEEN, 0) == BETWEEN

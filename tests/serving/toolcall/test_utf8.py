"""The UTF-8 guard: after any bytes, only tokens that continue them as valid UTF-8."""

import numpy as np
import pytest
import xgrammar as xgr

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

"""UTF-8 as RFC 3629 draws it, one token at a time: which tokens may follow the bytes so far.

xgrammar 0.2.7 reads a value's bytes leniently: an overlong form (`C1 81` for "A", `E0 80 80`,
`F0 80 80 80`) passes as the code point it spells, so a grammar of characters admits byte
strings that no UTF-8 decoder accepts (measured: 6 invalid calls of 111 in one eval sweep). The
engine therefore narrows the grammar's token mask with this guard (serving/engine/plugin.py): it
follows the output's position in a UTF-8 sequence and allows next only the tokens whose bytes
continue it validly, i.e. no byte outside a sequence that never occurs in UTF-8 (80-BF, C0, C1,
F5-FF), and after each lead byte only its continuation range (E0: A0-BF, ED: 80-9F, F0: 90-BF,
F4: 80-8F, others 80-BF).
"""

from __future__ import annotations

import numpy as np

INVALID = -1
# A state is where the output stands: 0 between characters, else inside a sequence, named by
# the range the next byte must fall in and how many continuation bytes follow it.
_STATES = [(0, 0, 0), (0x80, 0xBF, 0), (0x80, 0xBF, 1), (0x80, 0xBF, 2),
           (0xA0, 0xBF, 1), (0x80, 0x9F, 1), (0x90, 0xBF, 2), (0x80, 0x8F, 2)]
BETWEEN, LAST, TWO_LEFT, THREE_LEFT, AFTER_E0, AFTER_ED, AFTER_F0, AFTER_F4 = range(8)
_LEADS = {**{b: LAST for b in range(0xC2, 0xE0)}, 0xE0: AFTER_E0, 0xED: AFTER_ED,
          **{b: TWO_LEFT for b in (*range(0xE1, 0xED), 0xEE, 0xEF)}, 0xF0: AFTER_F0,
          **{b: THREE_LEFT for b in range(0xF1, 0xF4)}, 0xF4: AFTER_F4}


def _byte_table() -> np.ndarray:
    """next_state[state, byte]."""
    table = np.full((len(_STATES), 256), INVALID, dtype=np.int8)
    table[BETWEEN, :0x80] = BETWEEN
    for byte, state in _LEADS.items():
        table[BETWEEN, byte] = state
    for state, (lo, hi, left) in enumerate(_STATES[1:], start=1):
        table[state, lo:hi + 1] = (BETWEEN, LAST, TWO_LEFT)[left]
    return table


class Utf8Guard:
    """For a vocabulary (each token's bytes): the state after each token from each state, and
    per state the tokens allowed, packed as xgrammar packs a token bitmask (int32 words, token
    i at bit i % 32 of word i // 32)."""

    def __init__(self, token_bytes: list[bytes], mask_width: int) -> None:
        bytes_table = _byte_table()
        longest = max((len(b) for b in token_bytes), default=0)
        matrix = np.full((len(token_bytes), longest), -1, dtype=np.int16)
        for i, data in enumerate(token_bytes):
            matrix[i, :len(data)] = np.frombuffer(data, dtype=np.uint8)
        self.after = np.empty((len(_STATES), len(token_bytes)), dtype=np.int8)
        for start in range(len(_STATES)):
            state = np.full(len(token_bytes), start, dtype=np.int8)
            for pos in range(longest):
                live = (matrix[:, pos] >= 0) & (state != INVALID)
                state[live] = bytes_table[state[live], matrix[live, pos]]
            self.after[start] = state
        allowed = np.ones((len(_STATES), mask_width * 32), dtype=bool)
        allowed[:, :len(token_bytes)] = self.after != INVALID
        bits = np.packbits(allowed.reshape(len(_STATES), -1, 32), axis=2, bitorder="little")
        self.masks = bits.view(np.int32).reshape(len(_STATES), mask_width)

    def next_state(self, state: int, token: int) -> int:
        """The state after `token` (a token outside the vocabulary changes nothing; after an
        invalid sequence a decoder starts afresh)."""
        state = BETWEEN if state == INVALID else state
        return int(self.after[state, token]) if token < self.after.shape[1] else state

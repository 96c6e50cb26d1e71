"""Token id -> the exact bytes it stands for, from a byte-level BPE tokenizer file.

Front doors that detokenize for the client (Dynamo's) report a token's bytes after a lossy
UTF-8 decode, so a character split across tokens comes back as U+FFFD pieces. Parsing tool
calls needs the sampled bytes themselves.
"""

from __future__ import annotations

from tokenizers import Tokenizer


def _byte_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the others are
    shifted past 255 in order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    alphabet, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(256 + shifted)] = byte
            shifted += 1
    return alphabet


class TokenBytes:
    """`table[token_id]` -> bytes; special tokens map to their text."""

    def __init__(self, tok: Tokenizer) -> None:
        alphabet = _byte_alphabet()
        special = {t.content for t in tok.get_added_tokens_decoder().values()}
        self.table: dict[int, bytes] = {}
        for text, token_id in tok.get_vocab(with_added_tokens=True).items():
            if text in special or any(c not in alphabet for c in text):
                self.table[token_id] = text.encode()
            else:
                self.table[token_id] = bytes(alphabet[c] for c in text)

    def __getitem__(self, token_id: int) -> bytes:
        return self.table[token_id]

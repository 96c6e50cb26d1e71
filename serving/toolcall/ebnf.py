"""The pieces every value grammar is written with: sets of characters, literals and rules.

Values are written in one of two contexts: `raw` (a GLM string argument, the characters as
they are) or `json` (inside a JSON string: `"` and `\\` escaped, control characters only as
their short escapes). A character set never holds a surrogate: no UTF-8 decoder accepts one.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
# JSON's short escapes; other control characters need \\uXXXX, which the grammar never writes
SHORT_ESCAPES = {0x08: "b", 0x09: "t", 0x0A: "n", 0x0C: "f", 0x0D: "r", 0x22: '"', 0x5C: "\\"}


class UnsupportedSchema(ValueError):
    """A schema keyword (or pattern construct) the grammar cannot enforce; names it."""

    def __init__(self, keyword: str, why: str) -> None:
        super().__init__(f"the tool schema's {keyword!r} cannot be enforced: {why}")
        self.keyword = keyword


def _utf8_len(cp: int) -> int:
    return 1 if cp < 0x80 else 2 if cp < 0x800 else 3 if cp < 0x10000 else 4


@dataclass(frozen=True)
class CharSet:
    """Code points as sorted, disjoint, inclusive ranges."""

    ranges: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def of(*ranges: tuple[int, int]) -> CharSet:
        spans = sorted((lo, hi) for lo, hi in ranges if lo <= hi)
        merged: list[list[int]] = []
        for lo, hi in spans:
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        out: list[tuple[int, int]] = []
        for lo, hi in merged:  # surrogates are no characters
            if hi < SURROGATES[0] or lo > SURROGATES[1]:
                out.append((lo, hi))
                continue
            if lo < SURROGATES[0]:
                out.append((lo, SURROGATES[0] - 1))
            if hi > SURROGATES[1]:
                out.append((SURROGATES[1] + 1, hi))
        return CharSet(tuple(out))

    @staticmethod
    def chars(text: str) -> CharSet:
        return CharSet.of(*((ord(c), ord(c)) for c in text))

    def __or__(self, other: CharSet) -> CharSet:
        return CharSet.of(*self.ranges, *other.ranges)

    def __sub__(self, other: CharSet) -> CharSet:
        out: list[tuple[int, int]] = []
        for lo, hi in self.ranges:
            for olo, ohi in other.ranges:
                if ohi < lo or olo > hi:
                    continue
                if olo > lo:
                    out.append((lo, olo - 1))
                lo = max(lo, ohi + 1)
                if lo > hi:
                    break
            if lo <= hi:
                out.append((lo, hi))
        return CharSet.of(*out)

    def __contains__(self, cp: int) -> bool:
        return any(lo <= cp <= hi for lo, hi in self.ranges)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def max_bytes(self, json: bool) -> int:
        """The most bytes one of these characters takes when written in the context."""
        if not self.ranges:
            return 0
        widest = _utf8_len(self.ranges[-1][1])
        if json and any(cp in self for cp in SHORT_ESCAPES):
            widest = max(widest, 2)
        return widest

    def ebnf(self, json: bool) -> str:
        """One character of the set, as an EBNF expression for the context."""
        plain = self - CONTROL - CharSet.chars('"\\') if json else self
        options = [_char_class(plain)] if plain else []
        if json:
            options += [literal("\\" + SHORT_ESCAPES[cp]) for cp in sorted(SHORT_ESCAPES)
                        if cp in self]
        if not options:
            raise UnsupportedSchema("pattern", "a character set with no character that can "
                                    "be written")
        return options[0] if len(options) == 1 else "(" + " | ".join(options) + ")"


ANY = CharSet.of((0, MAX_CODE_POINT))
CONTROL = CharSet.of((0, 0x1F))
# The characters a raw (GLM) string argument may hold: every code point but the surrogates.
TEXT = ANY


def _code(cp: int) -> str:
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def _char_class(chars: CharSet) -> str:
    parts = []
    for lo, hi in chars.ranges:
        # xgrammar 0.2.7 drops U+D000-U+D7FF from a range that crosses U+D000 (checked on every
        # code point), so such a range is written as two
        for a, b in ((lo, min(hi, 0xCFFF)), (max(lo, 0xD000), hi)) if lo < 0xD000 <= hi else (
                (lo, hi),):
            parts.append(_code(a) if a == b else f"{_code(a)}-{_code(b)}")
    return "[" + "".join(parts) + "]"


def literal(text: str) -> str:
    """`text` as an EBNF string literal (matched exactly)."""
    out = []
    for ch in text:
        cp = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif cp < 0x20 or cp == 0x7F:
            out.append(_code(cp))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class Rules:
    """Named EBNF rules, each body written once; `grammar(root)` is the whole grammar."""

    def __init__(self) -> None:
        self.bodies: dict[str, str] = {}  # body -> name

    def rule(self, body: str) -> str:
        if body not in self.bodies:
            self.bodies[body] = f"r{len(self.bodies)}"
        return self.bodies[body]

    def grammar(self, root: str) -> str:
        lines = [f"root ::= {root}"]
        lines += [f"{name} ::= {body}" for body, name in self.bodies.items()]
        return "\n".join(lines)


def repeat(expr: str, low: int, high: int) -> str:
    """`expr` low..high times; "" when high is 0."""
    if high <= 0:
        return ""
    if low == high == 1:
        return expr
    return f"{expr}{{{low},{high}}}" if low != high else f"{expr}{{{low}}}"


def sequence(*exprs: str) -> str:
    parts = [e for e in exprs if e]
    return " ".join(parts) if parts else '""'


def choice(*exprs: str) -> str:
    options = list(dict.fromkeys(e for e in exprs))
    return options[0] if len(options) == 1 else "(" + " | ".join(options) + ")"

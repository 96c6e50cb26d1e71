"""A JSON Schema `pattern` as a bounded grammar: the strings the whole pattern matches.

JSON Schema patterns match anywhere in a string; the grammar emits strings that the whole
pattern matches, a subset, so every emitted string is valid. The validator that judges them
(`jsonschema`, i.e. Python's `re`) reads `\\d`, `\\w` and `\\s` as Unicode classes: positive
uses emit their ASCII members (a subset), negated ones leave out every Unicode member (so the
complement is a subset too). Unbounded quantifiers get a cap, chosen so that the value fits its
bound. Lookarounds, back-references and inner anchors are refused, named.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

from serving.toolcall.ebnf import ANY, MAX_CODE_POINT, CharSet, Rules, UnsupportedSchema, choice
from serving.toolcall.ebnf import repeat as ebnf_repeat
from serving.toolcall.ebnf import sequence as ebnf_sequence

DIGITS = CharSet.of((0x30, 0x39))
WORD = CharSet.of((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE = CharSet.chars(" \t\n\r\f\v")
LINE_ENDS = CharSet.chars("\n\r\u2028\u2029")  # what ECMA's `.` leaves out (Python's: \n)


@functools.cache
def _unicode_class(name: str) -> CharSet:
    """Every code point Python's `re` puts in \\d, \\w or \\s."""
    test = {"d": lambda c: unicodedata.category(c) == "Nd",
            "w": lambda c: bool(re.match(r"\w", c)),
            "s": lambda c: bool(re.match(r"\s", c))}[name]
    spans: list[tuple[int, int]] = []
    for cp in range(MAX_CODE_POINT + 1):
        if 0xD800 <= cp <= 0xDFFF or not test(chr(cp)):
            continue
        if spans and spans[-1][1] == cp - 1:
            spans[-1] = (spans[-1][0], cp)
        else:
            spans.append((cp, cp))
    return CharSet.of(*spans)


@dataclass(frozen=True)
class Chars:
    narrow: CharSet  # what the grammar emits for it
    wide: CharSet  # everything the validator may count as it (for complements)


@dataclass(frozen=True)
class Seq:
    items: tuple


@dataclass(frozen=True)
class Alt:
    options: tuple


@dataclass(frozen=True)
class Repeat:
    node: object
    low: int
    high: int | None  # None: unbounded, capped when emitted


_CLASS_ESCAPES = {"d": (DIGITS, "d"), "w": (WORD, "w"), "s": (SPACE, "s")}
_CHAR_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}


def _escape_chars(letter: str) -> Chars:
    lower = letter.lower()
    if lower in _CLASS_ESCAPES:
        ascii_set, name = _CLASS_ESCAPES[lower]
        if letter == lower:
            return Chars(ascii_set, _unicode_class(name))
        return Chars(ANY - _unicode_class(name), ANY - ascii_set)
    return _literal(_CHAR_ESCAPES.get(letter, letter))


def _literal(ch: str) -> Chars:
    one = CharSet.chars(ch)
    return Chars(one, one)


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.text, self.i = pattern, 0

    def fail(self, why: str) -> UnsupportedSchema:
        return UnsupportedSchema("pattern", f"{why} in {self.text!r}")

    def peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def take(self) -> str:
        ch = self.peek()
        self.i += 1
        return ch

    def parse(self):
        node = self.alternation()
        if self.i != len(self.text):
            raise self.fail(f"unexpected {self.peek()!r} at {self.i}")
        return node

    def alternation(self):
        options = [self.sequence()]
        while self.peek() == "|":
            self.take()
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self):
        items = []
        while self.peek() and self.peek() not in "|)":
            items.append(self.quantified(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def quantified(self, node):
        ch = self.peek()
        if ch in ("*", "+", "?"):
            self.take()
            node = Repeat(node, 0 if ch != "+" else 1, 1 if ch == "?" else None)
        elif ch == "{" and re.match(r"\{\d+(,\d*)?\}", self.text[self.i:]):
            body = self.text[self.i + 1:self.text.index("}", self.i)]
            self.i += len(body) + 2
            low, _, high = body.partition(",")
            node = Repeat(node, int(low), int(high) if high else (None if "," in body
                                                                   else int(low)))
        else:
            return node
        if self.peek() == "?":  # lazy: the same strings
            self.take()
        if self.peek() in ("*", "+", "?", "{"):
            raise self.fail("a quantifier of a quantifier")
        return node

    def atom(self):
        ch = self.take()
        if ch == "(":
            if self.text.startswith("?:", self.i):
                self.i += 2
            elif self.text.startswith(("?<", "?P<"), self.i) and not self.text.startswith(
                    ("?<=", "?<!"), self.i):
                self.i = self.text.index(">", self.i) + 1
            elif self.peek() == "?":
                raise self.fail("a lookaround or inline flag")
            node = self.alternation()
            if self.take() != ")":
                raise self.fail("an unclosed group")
            return node
        if ch == "[":
            return self.char_class()
        if ch == ".":
            return Chars(ANY - LINE_ENDS, ANY - CharSet.chars("\n"))
        if ch in "^$":
            raise self.fail("an anchor inside the pattern")
        if ch == "\\":
            return self.escape()
        if ch in ")*+?":
            raise self.fail(f"a stray {ch!r}")
        return _literal(ch)

    def escape(self) -> Chars:
        letter = self.take()
        if not letter:
            raise self.fail("a trailing backslash")
        if letter in "bB" or letter.isdigit() and letter != "0":
            raise self.fail(f"\\{letter} (a word boundary or back-reference)")
        if letter in "ux":
            width = 4 if letter == "u" else 2
            digits = self.text[self.i:self.i + width]
            if not re.fullmatch(f"[0-9a-fA-F]{{{width}}}", digits):
                raise self.fail(f"a malformed \\{letter} escape")
            self.i += width
            return _literal(chr(int(digits, 16)))
        if letter in "pPk":
            raise self.fail(f"\\{letter} (Unicode properties or named references)")
        return _escape_chars(letter)

    def char_class(self) -> Chars:
        negated = self.peek() == "^"
        if negated:
            self.take()
        narrow, wide = CharSet(), CharSet()
        first = True
        while True:
            ch = self.take()
            if not ch:
                raise self.fail("an unclosed character class")
            if ch == "]" and not first:
                break
            first = False
            item = self.escape() if ch == "\\" else _literal(ch)
            if self.peek() == "-" and self.text[self.i + 1:self.i + 2] not in ("]", ""):
                self.take()
                end_ch = self.take()
                end = self.escape() if end_ch == "\\" else _literal(end_ch)
                lo, hi = _single(item, self), _single(end, self)
                if lo > hi:
                    raise self.fail("a character range out of order")
                item = Chars(CharSet.of((lo, hi)), CharSet.of((lo, hi)))
            narrow, wide = narrow | item.narrow, wide | item.wide
        return Chars(ANY - wide, ANY - narrow) if negated else Chars(narrow, wide)


def _single(chars: Chars, parser: _Parser) -> int:
    if len(chars.narrow.ranges) != 1 or chars.narrow.ranges[0][0] != chars.narrow.ranges[0][1]:
        raise parser.fail("a class escape as a range bound")
    return chars.narrow.ranges[0][0]


def parse(pattern: str):
    """The pattern's tree, its `^`/`$` anchors taken off (the whole string must match)."""
    body = pattern[1:] if pattern.startswith("^") else pattern
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    return _Parser(body).parse()


def lengths(node, cap: int) -> tuple[int, int]:
    """Fewest and most characters of a match, unbounded repeats taken up to `cap` more."""
    if isinstance(node, Chars):
        return 1, 1
    if isinstance(node, Seq):
        parts = [lengths(item, cap) for item in node.items]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if isinstance(node, Alt):
        parts = [lengths(option, cap) for option in node.options]
        return min(p[0] for p in parts), max(p[1] for p in parts)
    low, high = lengths(node.node, cap)
    most = node.high if node.high is not None else node.low + cap
    return low * node.low, high * most


def max_bytes(node, json: bool) -> int:
    """The most bytes one character of the pattern takes when written."""
    if isinstance(node, Chars):
        return node.narrow.max_bytes(json)
    children = (node.items if isinstance(node, Seq) else node.options
                if isinstance(node, Alt) else (node.node,))
    return max((max_bytes(child, json) for child in children), default=0)


def emit(node, cap: int, rules: Rules, json: bool) -> str:
    if isinstance(node, Chars):
        if not node.narrow:
            raise UnsupportedSchema("pattern", "a character class that nothing can match")
        return node.narrow.ebnf(json)
    if isinstance(node, Seq):
        return ebnf_sequence(*(emit(item, cap, rules, json) for item in node.items))
    if isinstance(node, Alt):
        return choice(*(emit(option, cap, rules, json) for option in node.options))
    high = node.high if node.high is not None else node.low + cap
    inner = rules.rule(emit(node.node, cap, rules, json))
    return ebnf_repeat(inner, node.low, high) or '""'


def fit_cap(node, min_chars: int, max_chars: int, what: str) -> int:
    """The largest cap for unbounded repeats that keeps every match within
    [min_chars, max_chars] characters; UnsupportedSchema where no cap does."""
    fewest, _ = lengths(node, 0)
    if fewest < min_chars:
        raise UnsupportedSchema(what, f"minLength {min_chars} together with a pattern that "
                                f"matches strings of {fewest} characters")
    cap = max_chars
    while cap > 0 and lengths(node, cap)[1] > max_chars:
        cap //= 2
    if lengths(node, cap)[1] > max_chars:
        raise UnsupportedSchema(what, f"the pattern's matches can be longer than the "
                                f"{max_chars} characters allowed")
    return cap

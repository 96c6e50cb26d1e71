"""A mutation: one text edit on an exact span of a source file, so it can be reversed.

Spans are (line, column) pairs in characters, lines from 1, as in the original file. Applying
replaces `original` by `replacement` there and leaves every other byte alone; reverting puts
`original` back, which is the plain text edit a solver (or a model) makes.
"""

from __future__ import annotations

from dataclasses import dataclass


class MutationError(ValueError):
    """The source at the mutation's span is not what the mutation expects."""


@dataclass(frozen=True)
class Mutation:
    op: str
    start: tuple[int, int]
    end: tuple[int, int]
    original: str
    replacement: str

    def apply(self, source: str) -> str:
        """The mutant of `source`; raises MutationError if the span's text differs."""
        lo, hi = offset(source, *self.start), offset(source, *self.end)
        if source[lo:hi] != self.original:
            raise MutationError(f"expected {self.original!r} at line {self.start[0]}, "
                                f"found {source[lo:hi]!r}")
        return source[:lo] + self.replacement + source[hi:]

    def revert(self, mutant: str) -> str:
        """The original of `mutant` (the text `apply` produced)."""
        lo = offset(mutant, *self.start)
        hi = lo + len(self.replacement)
        if mutant[lo:hi] != self.replacement:
            raise MutationError(f"expected {self.replacement!r} at line {self.start[0]}, "
                                f"found {mutant[lo:hi]!r}")
        return mutant[:lo] + self.original + mutant[hi:]

    def to_json(self) -> dict:
        return {"op": self.op, "start": list(self.start), "end": list(self.end),
                "original": self.original, "replacement": self.replacement}

    @classmethod
    def from_json(cls, obj: dict) -> Mutation:
        return cls(op=str(obj["op"]), start=_pos(obj["start"]), end=_pos(obj["end"]),
                   original=str(obj["original"]), replacement=str(obj["replacement"]))


def _pos(value: object) -> tuple[int, int]:
    if (not isinstance(value, list | tuple) or len(value) != 2
            or not all(isinstance(v, int) and v >= 0 for v in value) or value[0] < 1):
        raise ValueError(f"bad position {value!r}: want [line >= 1, column >= 0]")
    return (value[0], value[1])


def offset(text: str, line: int, col: int) -> int:
    """Index in `text` of (line, col); lines end at '\\n' only, as in the stdlib's files."""
    pos = 0
    for _ in range(line - 1):
        pos = text.find("\n", pos) + 1
        if pos == 0:
            raise MutationError(f"line {line} is past the end of the file")
    end = text.find("\n", pos)
    if col > (len(text) if end < 0 else end) - pos:
        raise MutationError(f"column {col} is past the end of line {line}")
    return pos + col

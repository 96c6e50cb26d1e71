"""GLM tool calls read from the sampled tokens themselves, with every problem counted.

The input is the completion as the server sampled it, the bytes of each token (a token may hold
part of a character), so markup is recognized only where the model sampled the markup TOKEN: a
`<tool_call>` spelled from ordinary sub-tokens is reported (`subtoken_markup`), never silently
turned into a call or silently dropped. A value whose sampled bytes are not valid UTF-8 makes its
call invalid (`invalid_utf8`): the call that would run is not the call that was sampled. The
token that ended the turn (`<|observation|>`, ...) is not content: it belongs to the sequence,
not to what the assistant said.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rollfleet.toolschema import problem_kinds
from serving.toolcall.ebnf import UnsupportedSchema
from serving.toolcall.grammar import (
    CALL_END,
    CALL_START,
    KEY_END,
    KEY_START,
    MARKUP,
    OTHER_STOPS,
    THINK_END,
    TURN_END,
    VALUE_END,
    VALUE_START,
    tool_parameters,
)
from serving.toolcall.values import raw_text

ISSUE_KINDS = ("malformed", "unknown_tool", "missing_argument", "extra_argument", "wrong_type",
               "cut_off", "subtoken_markup", "invalid_utf8")
TURN_ENDS = (TURN_END, *OTHER_STOPS)


@dataclass
class ParsedCall:
    name: str
    arguments: dict[str, Any]
    issues: list[str] = field(default_factory=list)  # kinds from ISSUE_KINDS

    @property
    def valid(self) -> bool:
        return not self.issues


@dataclass
class ParsedTurn:
    content: str
    reasoning: str
    calls: list[ParsedCall]
    issues: list[str]  # turn-level problems (subtoken markup outside any call)


class _Cut(Exception):
    pass


def parse_glm(token_bytes: list[bytes], tools: list[dict], thinking: bool) -> ParsedTurn:
    tokens = [_Piece(b) for b in token_bytes]
    if tokens and any(tokens[-1] == end for end in TURN_ENDS):
        tokens.pop()
    schemas = {t["function"]["name"]: t for t in tools}
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[ParsedCall] = []
    i = 0
    ends = [k for k, t in enumerate(tokens) if t == THINK_END]
    if thinking and ends:
        reasoning, i = tokens[:ends[0]], ends[0] + 1
    while i < len(tokens):
        if tokens[i] == CALL_START:
            call, i = _parse_call(tokens, i + 1, schemas)
            calls.append(call)
        else:
            content.append(tokens[i])
            i += 1
    text = _text(content)
    issues = ["subtoken_markup"] if any(m in text for m in MARKUP) else []
    return ParsedTurn(text, _text(reasoning), calls, issues)


class _Piece(bytes):
    """One token's bytes; equal to a markup string only if it is exactly that token."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return bytes(self) == other.encode()
        return bytes.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = bytes.__hash__


def _text(pieces: list[bytes]) -> str:
    """For people: bytes that form no character show as U+FFFD."""
    return b"".join(pieces).decode("utf-8", errors="replace")


def _read_until(tokens: list[_Piece], i: int, stops: tuple[str, ...],
                issues: list[str]) -> tuple[str, str, int]:
    """Text up to the first stop token: (text, stop, index after it); _Cut at the end."""
    start = i
    while i < len(tokens):
        for stop in stops:
            if tokens[i] == stop:
                data = b"".join(tokens[start:i])
                try:
                    return data.decode("utf-8"), stop, i + 1
                except UnicodeDecodeError:
                    if "invalid_utf8" not in issues:
                        issues.append("invalid_utf8")
                    return data.decode("utf-8", errors="replace"), stop, i + 1
        i += 1
    raise _Cut()


def _parse_call(tokens: list[_Piece], i: int, tools: dict[str, dict]) -> tuple[ParsedCall, int]:
    raw: dict[str, str] = {}
    issues: list[str] = []
    name = ""
    try:
        name, stop, i = _read_until(tokens, i, (KEY_START, CALL_END), issues)
        name = name.strip()
        if stop == KEY_START:
            clean = _clean_arguments(tokens, i)
            raw, i = clean if clean is not None else _loose_arguments(tokens, i, issues)
    except _Cut:
        issues.append("cut_off")
        i = len(tokens)
    if name not in tools:
        return ParsedCall(name, dict(raw), issues + ["unknown_tool"]), i
    arguments, problems = _typed_arguments(raw, tools[name])
    if "cut_off" in issues:  # its missing arguments follow from the cut; count the cause once
        problems = []
    return ParsedCall(name, arguments, issues + problems), i


def _find(tokens: list[_Piece], i: int, markup: str) -> int | None:
    return next((k for k in range(i, len(tokens)) if tokens[k] == markup), None)


def _clean_arguments(tokens: list[_Piece], i: int) -> tuple[dict[str, str], int] | None:
    """Arguments from just after an `<arg_key>` through `</tool_call>`, read as the grammar reads
    them: a value is any text, markup tokens included, and ends at the `</arg_value>` after which
    the call goes on well-formed (the next `<arg_key>` or `</tool_call>`). None if no such
    reading exists (the loose reading then says what is wrong)."""
    k = _find(tokens, i, KEY_END)
    if k is None or k + 1 >= len(tokens) or tokens[k + 1] != VALUE_START:
        return None
    try:
        key = b"".join(tokens[i:k]).decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    start = j = k + 2
    while (j := _find(tokens, j, VALUE_END)) is not None:
        after = tokens[j + 1] if j + 1 < len(tokens) else None
        if after in (CALL_END, KEY_START):
            try:
                value = b"".join(tokens[start:j]).decode("utf-8")
            except UnicodeDecodeError:
                return None  # every longer reading holds the same undecodable bytes
            if after == CALL_END:
                return {key: value}, j + 2
            rest = _clean_arguments(tokens, j + 2)
            if rest is not None and key not in rest[0]:
                return {key: value, **rest[0]}, rest[1]
        j += 1
    return None


def _loose_arguments(tokens: list[_Piece], i: int,
                     issues: list[str]) -> tuple[dict[str, str], int]:
    """Arguments that do not parse cleanly: read up to each markup token, counting problems."""
    raw: dict[str, str] = {}
    stop = KEY_START
    while stop == KEY_START:
        key, _, i = _read_until(tokens, i, (KEY_END,), issues)
        if i >= len(tokens):
            raise _Cut()
        if tokens[i] != VALUE_START:
            issues.append("malformed")
            _, stop, i = _read_until(tokens, i, (CALL_END,), issues)
            break
        value, _, i = _read_until(tokens, i + 1, (VALUE_END,), issues)
        raw[key.strip()] = value
        if i < len(tokens) and tokens[i] not in (KEY_START, CALL_END):
            issues.append("malformed")
        _, stop, i = _read_until(tokens, i, (KEY_START, CALL_END), issues)
    return raw, i


def check_call(name: str, arguments: str, tools: list[dict]) -> list[str]:
    """Issues of a call in OpenAI shape (JSON arguments), e.g. one the server's parser made."""
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    if name not in schemas:
        return ["unknown_tool"]
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return ["malformed"]
    if not isinstance(args, dict):
        return ["malformed"]
    return problem_kinds(args, schemas[name])


def _typed_arguments(raw: dict[str, str], tool: dict) -> tuple[dict[str, Any], list[str]]:
    """Values are raw text for string arguments and JSON otherwise, as in GLM's format (and
    as the grammar writes them: serving/toolcall/values.raw_text)."""
    root = tool["function"].get("parameters") or {}
    try:
        props = tool_parameters(tool).get("properties") or {}
    except UnsupportedSchema:
        props = root.get("properties") or {}
    args: dict[str, Any] = {}
    for key, text in raw.items():
        try:
            is_text = raw_text(props.get(key, {}), root)
        except UnsupportedSchema:
            is_text = False
        if is_text:
            args[key] = text
            continue
        try:
            args[key] = json.loads(text)
        except json.JSONDecodeError:
            args[key] = text  # a string in an untyped or union slot, or malformed JSON
    return args, problem_kinds(args, root)

"""One argument's value grammar from its JSON Schema, and the most tokens it can take.

Any schema that OpenAI function calling accepts compiles: every type, type lists, `enum`,
`const`, `anyOf`/`oneOf`/`allOf`, `$ref`/`$defs` (recursion expanded to a depth), `format`,
`pattern`, optional properties, arrays and tuples. What the schema leaves unbounded gets a bound
from `Caps` (characters of a string, items of an array, digits of a number), so that a whole
call has a worst case the turn's token budget can hold; a declared bound larger than the cap is
tightened to it. The grammar admits a subset of what the schema does, never more: every value it
emits validates. A keyword it cannot enforce (`not`, `if`, `multipleOf` 3, overlapping `oneOf`,
...) is an UnsupportedSchema naming it.

A GLM call writes a string argument as it is and any other as JSON (`raw_text`); inside JSON,
strings are escaped, with no `\\uXXXX` escapes (so no surrogate can be spelled) and no whitespace.
The worst case counts bytes: a token holds at least one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from serving.toolcall import regex
from serving.toolcall.ebnf import TEXT, Rules, UnsupportedSchema, choice, literal, repeat, sequence

# Assertions no grammar here enforces: a schema using one is refused with its name.
REFUSED = ("not", "if", "then", "else", "dependentSchemas", "dependentRequired",
           "patternProperties", "propertyNames", "contains", "minContains", "maxContains",
           "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef")
# `format`s written as patterns; each emits only strings Python's `jsonschema` FORMAT_CHECKER
# accepts (days 01-28, so that every date exists; years from 1000, as Python's dates have no
# year 0). Other formats are annotations, as in JSON Schema itself.
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LABEL = r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?"
_DATE = r"[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
_HOUR = r"([01][0-9]|2[0-3])"
_TIME = rf"{_HOUR}:[0-5][0-9]:[0-5][0-9](\.[0-9]{{1,6}})?(Z|[+-]{_HOUR}:[0-5][0-9])"
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "email": rf"[a-z0-9._+-]{{1,32}}@{_LABEL}(\.{_LABEL}){{1,2}}",
    "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "ipv4": rf"{_OCTET}(\.{_OCTET}){{3}}",
    "ipv6": r"[0-9a-f]{1,4}(:[0-9a-f]{1,4}){7}",
    "hostname": rf"{_LABEL}(\.{_LABEL}){{0,3}}",
    "uri": rf"https?://{_LABEL}(\.{_LABEL}){{0,3}}(/[A-Za-z0-9._~-]{{1,24}}){{0,4}}",
    "uri-reference": r"(/[A-Za-z0-9._~-]{1,24}){1,4}",
}
MAP_KEY = r"[A-Za-z_][A-Za-z0-9_.-]{0,31}"  # the key of a free-form map's one entry


@dataclass(frozen=True)
class Caps:
    """The bounds the project sets where a schema sets none (or a larger one)."""

    string: int = 4096  # characters of one string
    items: int = 16  # elements of one array
    int_digits: int = 15  # digits before a number's point (JSON-safe integers)
    frac_digits: int = 9  # digits after it
    depth: int = 3  # expansions of a recursive $ref, and nesting of schema-less values

    def halved(self) -> Caps:
        return replace(self, string=self.string // 2, items=max(1, self.items // 2),
                       int_digits=max(6, self.int_digits // 2),
                       frac_digits=max(3, self.frac_digits // 2))


class _TooDeep(Exception):
    """A recursive $ref past the depth cap: the branch that reached it is left out."""


def resolve(schema: Any, root: dict) -> Any:
    """`schema` with a local `$ref` replaced by its target (sibling keywords kept)."""
    if not isinstance(schema, dict) or "$ref" not in schema:
        return schema
    ref = schema["$ref"]
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise UnsupportedSchema("$ref", f"only local references (#/...) resolve, not {ref!r}")
    target: Any = root
    for part in filter(None, ref[1:].split("/")):
        key = part.replace("~1", "/").replace("~0", "~")
        try:
            target = target[int(key)] if isinstance(target, list) else target[key]
        except (KeyError, IndexError, ValueError, TypeError):
            raise UnsupportedSchema("$ref", f"{ref!r} points at nothing") from None
    siblings = {k: v for k, v in schema.items() if k != "$ref"}
    return merge_schemas(target, siblings) if siblings else target


def raw_text(schema: Any, root: dict) -> bool:
    """Whether a GLM call writes this argument as it is (a string) rather than as JSON."""
    schema = resolve(schema, root)
    return isinstance(schema, dict) and schema.get("type") == "string"


class ValueGrammar:
    """Compiles the value schemas of one tool (whose parameters are `root`) into rules."""

    def __init__(self, root: dict, caps: Caps, rules: Rules | None = None) -> None:
        self.root, self.caps = root, caps
        self.rules = rules or Rules()

    def argument(self, schema: Any) -> tuple[str, int]:
        """(EBNF expression, worst bytes) of one argument's value as GLM writes it."""
        try:
            if raw_text(schema, self.root):
                return self._raw_string(resolve(schema, self.root))
            return self.value(schema, 0)
        except _TooDeep:
            raise UnsupportedSchema("$ref", "a recursive reference with no way to end within "
                                    f"{self.caps.depth} levels") from None

    # -- any JSON value ----------------------------------------------------------------------

    def value(self, schema: Any, depth: int) -> tuple[str, int]:
        if schema is True or schema == {}:
            return self._any(self.caps.depth)
        if schema is False:
            raise UnsupportedSchema("false", "a schema that admits nothing")
        if not isinstance(schema, dict):
            raise UnsupportedSchema("schema", f"{schema!r} is not a JSON Schema")
        if "$ref" in schema:
            if depth >= self.caps.depth:
                raise _TooDeep()
            return self.value(resolve(schema, self.root), depth + 1)
        refused = [k for k in REFUSED if k in schema]
        if refused:
            raise UnsupportedSchema(refused[0], "no grammar enforces it")
        if "allOf" in schema:
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            merged = rest
            for part in schema["allOf"]:
                merged = merge_schemas(merged, resolve(part, self.root))
            return self.value(merged, depth)
        if "const" in schema:
            return self._literals([schema["const"]])
        if "enum" in schema:
            return self._literals(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._alternatives(schema, key, depth)
        options = [self._typed(kind, schema, depth) for kind in _kinds(schema)]
        return choice(*(o[0] for o in options)), max(o[1] for o in options)

    def _typed(self, kind: str, schema: dict, depth: int) -> tuple[str, int]:
        if kind == "null":
            return '"null"', 4
        if kind == "boolean":
            return '("true" | "false")', 5
        if kind in ("integer", "number"):
            return self._number(schema, kind == "integer")
        if kind == "string":
            return self._json_string(schema)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "object":
            return self._object(schema, depth)
        raise UnsupportedSchema("type", f"unknown type {kind!r}")

    def _literals(self, values: list) -> tuple[str, int]:
        if not values:
            raise UnsupportedSchema("enum", "an empty enum admits nothing")
        texts = [json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in values]
        return choice(*(literal(t) for t in texts)), max(len(t.encode()) for t in texts)

    def _alternatives(self, schema: dict, key: str, depth: int) -> tuple[str, int]:
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
        alternatives = [merge_schemas(rest, resolve(a, self.root)) for a in schema[key]]
        if key == "oneOf" and not _disjoint(alternatives):
            raise UnsupportedSchema("oneOf", "its alternatives may both match one value (give "
                                    "them distinct types, or a required property with "
                                    "distinct const values)")
        options = []
        for alternative in alternatives:
            try:
                options.append(self.value(alternative, depth))
            except _TooDeep:
                continue
        if not options:
            raise _TooDeep()
        return choice(*(o[0] for o in options)), max(o[1] for o in options)

    def _any(self, depth: int) -> tuple[str, int]:
        """A value whose schema says nothing: a scalar, or (nested up to the depth cap) an
        array of them."""
        options = [self._json_string({}), self._number({}, False), ('("true" | "false")', 5),
                   ('"null"', 4)]
        if depth > 0:
            inner = self.rules.rule(choice(*(o[0] for o in options)))
            worst = max(o[1] for o in options)
            options.append(self._array_of(inner, worst, 0, self.caps.items))
        return choice(*(o[0] for o in options)), max(o[1] for o in options)

    # -- strings -----------------------------------------------------------------------------

    def _bounds(self, schema: dict) -> tuple[int, int]:
        low = int(schema.get("minLength", 0))
        high = min(int(schema.get("maxLength", self.caps.string)), self.caps.string)
        return low, max(low, high)

    def _pattern(self, schema: dict) -> tuple[Any, str] | None:
        if "pattern" in schema and "format" in schema and schema["format"] in FORMATS:
            raise UnsupportedSchema("format", "format and pattern together")
        if "pattern" in schema:
            return regex.parse(schema["pattern"]), "pattern"
        if schema.get("format") in FORMATS:
            return regex.parse(FORMATS[schema["format"]]), "format"
        return None

    def _raw_string(self, schema: dict) -> tuple[str, int]:
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            texts = [v for v in values if isinstance(v, str)]
            if not texts:
                raise UnsupportedSchema("enum", "a string argument with no string in its enum")
            return choice(*(literal(t) for t in texts)), max(len(t.encode()) for t in texts)
        return self._characters(schema, json_context=False)

    def _json_string(self, schema: dict) -> tuple[str, int]:
        body, worst = self._characters(schema, json_context=True)
        return sequence('"\\""', body, '"\\""'), worst + 2

    def _characters(self, schema: dict, json_context: bool) -> tuple[str, int]:
        low, high = self._bounds(schema)
        found = self._pattern(schema)
        if found is None:
            char = self.rules.rule(TEXT.ebnf(json_context))
            return repeat(char, low, high) or '""', high * TEXT.max_bytes(json_context)
        node, keyword = found
        own = regex.lengths(node, 0)[1]
        if own == regex.lengths(node, self.caps.string)[1]:
            # a pattern with no open repeat keeps its own length (a date, a uuid)
            high = min(int(schema.get("maxLength", own)), own)
        cap = regex.fit_cap(node, low, high, keyword)
        expr = regex.emit(node, cap, self.rules, json_context)
        return expr, regex.lengths(node, cap)[1] * regex.max_bytes(node, json_context)

    # -- numbers -----------------------------------------------------------------------------

    def _number(self, schema: dict, integer: bool) -> tuple[str, int]:
        frac = 0 if integer else self.caps.frac_digits
        step = schema.get("multipleOf")
        if step is not None:
            # 1 is enforced (integers). A fractional step is not: validators check it in
            # floating point, so `jsonschema` rejects 2.49 as a multiple of 0.01 (measured).
            if Fraction(str(step)) != 1:
                raise UnsupportedSchema("multipleOf", f"{step} (only 1 is enforced: a "
                                        "fractional step is checked in floating point, where "
                                        "2.49 is no multiple of 0.01)")
            frac = 0
        low, high = _interval(schema)
        options: list[tuple[str, int]] = []
        for digits in range(frac + 1):
            scale = 10 ** digits
            limit = 10 ** (self.caps.int_digits + digits) - 1
            first = -limit if low is None else _ceil_past(low[0] * scale, low[1])
            last = limit if high is None else _floor_past(high[0] * scale, high[1])
            first, last = max(first, -limit), min(last, limit)
            if first <= last:
                options += _decimals(first, last, digits)
        if not options:
            raise UnsupportedSchema("minimum", "no number lies within its minimum and maximum")
        return (self.rules.rule(choice(*(o[0] for o in options))),
                max(o[1] for o in options))

    # -- arrays and objects --------------------------------------------------------------------

    def _array(self, schema: dict, depth: int) -> tuple[str, int]:
        low = int(schema.get("minItems", 0))
        high = max(low, min(int(schema.get("maxItems", self.caps.items)), self.caps.items))
        items = schema.get("items", True)
        prefix = schema.get("prefixItems", [])
        if isinstance(items, list):  # the older tuple form
            prefix, items = items, schema.get("additionalItems", True)
        if schema.get("uniqueItems") and high > 1:
            if low > 1:
                raise UnsupportedSchema("uniqueItems", "two or more items that must differ")
            high = 1
        if items is False:
            high = min(high, len(prefix))
        if low > high:
            raise UnsupportedSchema("minItems", "more items than the schema allows")
        if not prefix:
            try:
                inner, worst = self.value(items, depth)
            except _TooDeep:
                if low:
                    raise
                return '"[]"', 2
            return self._array_of(self.rules.rule(inner), worst, low, high)
        elements = [self.value(s, depth) for s in prefix]
        if high > len(prefix):
            rest = self.value(items, depth)
            elements += [rest] * (high - len(prefix))
        options = []
        for n in range(low, high + 1):
            parts = ['"["']
            for i in range(n):
                parts += ['","'] if i else []
                parts.append(self.rules.rule(elements[i][0]))
            options.append(sequence(*parts, '"]"'))
        return choice(*options), 2 + sum(w + 1 for _, w in elements[:high])

    def _array_of(self, item: str, worst: int, low: int, high: int) -> tuple[str, int]:
        if high == 0:
            return '"[]"', 2
        more = repeat(f'("," {item})', max(0, low - 1), high - 1)
        body = sequence(item, more)
        body = body if low else f"({body})?"
        return sequence('"["', body, '"]"'), 2 + high * (worst + 1)

    def _object(self, schema: dict, depth: int) -> tuple[str, int]:
        props = dict(schema.get("properties") or {})
        required = list(schema.get("required") or [])
        extra = schema.get("additionalProperties", True)
        for name in required:
            props.setdefault(name, extra if isinstance(extra, dict) else {})
        if not props:
            return self._map(schema, extra, depth)
        if int(schema.get("minProperties", 0)) > len(required):
            raise UnsupportedSchema("minProperties", "more properties than are required")
        most = schema.get("maxProperties")
        if most is not None and most < len(required):
            raise UnsupportedSchema("maxProperties", "fewer properties than are required")
        members: list[tuple[str, int, bool]] = []  # (expression, worst, required)
        optional_left = None if most is None else most - len(required)
        for name, sub in props.items():
            is_required = name in required
            if not is_required and optional_left is not None:
                if optional_left <= 0:
                    continue
                optional_left -= 1
            key = json.dumps(name, ensure_ascii=False)
            try:
                expr, worst = self.value(sub, depth)
            except _TooDeep:
                if is_required:
                    raise
                continue
            members.append((sequence(literal(key + ":"), self.rules.rule(expr)),
                            len(key.encode()) + 1 + worst, is_required))
        return sequence('"{"', self._members(members), '"}"'), (
            2 + sum(w + 1 for _, w, _ in members))

    def _members(self, members: list[tuple[str, int, bool]]) -> str:
        """Members in order, optional ones omissible, one comma between two present ones."""
        first, after = "", ""  # the rest of the members, with no comma before / with one
        for expr, _, is_required in reversed(members):
            with_comma = sequence('","', expr, after)
            if is_required:
                first, after = sequence(expr, after), with_comma
            else:
                first = choice(sequence(expr, after), first or '""')
                after = choice(with_comma, after or '""')
            first, after = self.rules.rule(first), self.rules.rule(after)
        return first

    def _map(self, schema: dict, extra: Any, depth: int) -> tuple[str, int]:
        """A free-form object: `{}`, or one entry (two could repeat a key, which JSON reads
        as one)."""
        if extra is False or int(schema.get("maxProperties", 1)) < 1:
            return '"{}"', 2
        try:
            value, worst = self.value(extra if isinstance(extra, dict) else True, depth)
        except _TooDeep:
            return '"{}"', 2
        key = regex.emit(regex.parse(MAP_KEY), 0, self.rules, json=True)
        entry = sequence('"\\""', key, '"\\":"', self.rules.rule(value))
        if int(schema.get("minProperties", 0)) >= 1:
            return sequence('"{"', entry, '"}"'), 37 + worst
        return sequence('"{"', f"({entry})?", '"}"'), 37 + worst


def _kinds(schema: dict) -> list[str]:
    kinds = schema.get("type")
    if isinstance(kinds, str):
        return [kinds]
    if isinstance(kinds, list) and kinds:
        return list(dict.fromkeys(kinds))
    implied = []  # no type: the kinds its keywords speak of, else any
    if {"properties", "required", "additionalProperties", "minProperties"} & set(schema):
        implied.append("object")
    if {"items", "prefixItems", "minItems", "maxItems"} & set(schema):
        implied.append("array")
    if {"minLength", "maxLength", "pattern", "format"} & set(schema):
        implied.append("string")
    if {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & set(schema):
        implied.append("number")
    return implied or ["string", "number", "boolean", "null"]


def merge_schemas(a: Any, b: Any) -> dict:
    """Two schemas that must both hold, as one (properties merged, bounds tightened)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        raise UnsupportedSchema("allOf", "a part that is not a schema object")
    out = dict(a)
    for key, value in b.items():
        if key not in out or out[key] == value:
            out[key] = value
        elif key == "properties":
            out[key] = {**out[key], **{k: {"allOf": [out[key][k], v]} if k in out[key] else v
                                       for k, v in value.items()}}
        elif key == "required":
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key == "type":
            left = set(out[key]) if isinstance(out[key], list) else {out[key]}
            right = set(value) if isinstance(value, list) else {value}
            both = sorted(left & right) or sorted(
                {"integer"} if {"integer", "number"} <= left | right else set())
            if not both:
                raise UnsupportedSchema("allOf", f"types {out[key]} and {value} never meet")
            out[key] = both[0] if len(both) == 1 else both
        elif key.startswith("min") or key in ("minimum", "exclusiveMinimum"):
            out[key] = max(out[key], value)
        elif key.startswith("max") or key in ("maximum", "exclusiveMaximum"):
            out[key] = min(out[key], value)
        elif key in ("description", "title", "default", "examples", "$comment"):
            continue
        else:
            raise UnsupportedSchema("allOf", f"two different values of {key!r}")
    return out


def _json_kinds(schema: dict) -> set[str] | None:
    """The JSON kinds a schema can produce (integer counted as number); None if any."""
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if values is not None:
        return {_kind_of(v) for v in values}
    kinds = schema.get("type")
    if kinds is None:
        return None
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return {"number" if k == "integer" else k for k in kinds}


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _disjoint(alternatives: list[dict]) -> bool:
    """Whether no value can match two of the alternatives: distinct kinds, or objects that
    each require one property whose const values differ."""
    kinds = [_json_kinds(a) for a in alternatives]
    if all(k is not None for k in kinds) and all(
            not (kinds[i] & kinds[j]) for i in range(len(kinds)) for j in range(i)):
        return True
    tags = [_tag(a) for a in alternatives]
    for name in set.intersection(*(set(t) for t in tags)) if tags else ():
        values = [tags[i][name] for i in range(len(tags))]
        if all(not (values[i] & values[j]) for i in range(len(values)) for j in range(i)):
            return True
    return False


def _tag(schema: dict) -> dict[str, set[str]]:
    """Required properties of an object schema that are fixed to const/enum values."""
    out = {}
    for name in schema.get("required") or []:
        sub = (schema.get("properties") or {}).get(name)
        if isinstance(sub, dict) and ("const" in sub or "enum" in sub):
            values = [sub["const"]] if "const" in sub else sub["enum"]
            out[name] = {json.dumps(v, sort_keys=True) for v in values}
    return out


def _interval(schema: dict) -> tuple[tuple[Fraction, bool] | None, tuple[Fraction, bool] | None]:
    """The tightest (bound, exclusive) below and above; 2020-12 and draft-4 spellings both."""
    lows, highs = [], []
    for key, found in (("minimum", lows), ("exclusiveMinimum", lows), ("maximum", highs),
                       ("exclusiveMaximum", highs)):
        value = schema.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue  # a draft-4 exclusive flag is read with its bound
        flag = schema.get("exclusive" + key[0].upper() + key[1:]) is True
        found.append((Fraction(str(value)), key.startswith("exclusive") or flag))
    low = max(lows, key=lambda b: (b[0], b[1])) if lows else None
    high = min(highs, key=lambda b: (b[0], not b[1])) if highs else None
    return low, high


def _ceil_past(value: Fraction, exclusive: bool) -> int:
    n = math.ceil(value)
    return n + 1 if exclusive and n == value else n


def _floor_past(value: Fraction, exclusive: bool) -> int:
    n = math.floor(value)
    return n - 1 if exclusive and n == value else n


def _decimals(first: int, last: int, digits: int) -> list[tuple[str, int]]:
    """(EBNF sequence, its length) for the numbers n / 10^digits, first <= n <= last, written
    with exactly `digits` digits after the point (none: an integer)."""
    out = []
    if last >= 0:
        out += _unsigned(max(first, 0), last, digits)
    if first < 0:
        out += [(sequence('"-"', s), n + 1) for s, n in _unsigned(max(1, -last), -first, digits)]
    return out


def _unsigned(first: int, last: int, digits: int) -> list[tuple[str, int]]:
    out = []
    narrowest = digits + 1
    for width in range(max(len(str(first)), narrowest), max(len(str(last)), narrowest) + 1):
        low = max(first, 10 ** (width - 1) if width > narrowest else 0)
        high = min(last, 10 ** width - 1)
        if low > high:
            continue
        for spans in _fixed_width(str(low).zfill(width), str(high).zfill(width)):
            parts = [f'"{a}"' if a == b else f"[{a}-{b}]" for a, b in spans]
            if digits:
                parts.insert(width - digits, '"."')
            out.append((sequence(*parts), width + (1 if digits else 0)))
    return out


def _fixed_width(low: str, high: str) -> list[list[tuple[int, int]]]:
    """Digit ranges per position covering low..high (strings of one width, low <= high)."""
    if not low:
        return [[]]
    a, b, n = int(low[0]), int(high[0]), len(low) - 1
    if a == b:
        return [[(a, a), *rest] for rest in _fixed_width(low[1:], high[1:])]
    out = []
    start, end = a, b
    if low[1:] != "0" * n:
        out += [[(a, a), *rest] for rest in _fixed_width(low[1:], "9" * n)]
        start = a + 1
    tail = []
    if high[1:] != "9" * n:
        tail = [[(b, b), *rest] for rest in _fixed_width("0" * n, high[1:])]
        end = b - 1
    if start <= end:
        out.append([(start, end), *[(0, 9)] * n])
    return out + tail

"""The one schema checker (rollfleet/toolschema.py) over generated schemas and arguments.

The subset generated is what the project's tools and grammar support (serving/toolcall/
values.py): object parameters with typed properties (string with length, pattern or one of
values.FORMATS; integer and number with bounds; boolean; null; type lists), `enum`, `const`,
arrays and tuples (`prefixItems`), `anyOf`, `$ref` into `$defs`, `required` and
`additionalProperties`. None of values.REFUSED.
"""

import datetime
import json
import string

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from envs.tools import ToolCallError, check_arguments
from rollfleet.toolschema import (
    ASSERTED_FORMATS,
    SchemaProblem,
    _format_checker,
    problem_kinds,
    schema_problems,
)
from serving.toolcall.parser import check_call
from serving.toolcall.values import FORMATS

_NAMES = ["a", "b", "c", "d", "f"]
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from([1.0, 2.5, -0.5]),
                    st.sampled_from(["", "x", "ab", "2024-02-28", "192.168.0.1"]))
_json = st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(_NAMES), inner, max_size=3)),
    max_leaves=6)


def _leaf() -> st.SearchStrategy[dict]:
    bound = st.integers(-3, 3)
    return st.one_of(
        st.builds(lambda lo, hi: {"type": "string", "minLength": lo, "maxLength": hi},
                  st.integers(0, 2), st.integers(0, 3)),
        st.sampled_from([{"type": "string", "pattern": "^[a-z]{1,2}$"},
                         *({"type": "string", "format": f} for f in FORMATS)]),
        st.builds(lambda lo, hi: {"type": "integer", "minimum": lo, "maximum": hi}, bound, bound),
        st.builds(lambda lo: {"type": "number", "exclusiveMinimum": lo}, bound),
        st.sampled_from([{"type": "boolean"}, {"type": "null"}, {"type": ["string", "null"]},
                         {"enum": ["x", 1, None]}, {"const": 2.5}, {"$ref": "#/$defs/small"}]),
    )


_member = st.recursive(_leaf(), lambda inner: st.one_of(
    st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, inner,
              st.integers(0, 2)),
    st.builds(lambda first: {"type": "array", "prefixItems": [first], "items": False}, inner),
    st.lists(inner, min_size=2, max_size=2).map(lambda two: {"anyOf": two})), max_leaves=3)


@st.composite
def _parameters(draw) -> dict:
    properties = draw(st.fixed_dictionaries({n: _member for n in _NAMES[:3]}))
    properties["f"] = {"type": "string", "format": draw(st.sampled_from(sorted(FORMATS)))}
    return {"type": "object", "properties": properties,
            "required": draw(st.lists(st.sampled_from(_NAMES), unique=True, max_size=3)),
            "additionalProperties": draw(st.booleans()),
            "$defs": {"small": {"type": "integer", "maximum": 1}}}


def _value(schema: dict) -> st.SearchStrategy:
    """Values near `schema`: mostly of its shape, often valid, sometimes any JSON at all."""
    kind = schema.get("type")
    if "enum" in schema or "const" in schema:
        near = st.sampled_from(schema.get("enum", [schema.get("const")]))
    elif "anyOf" in schema:
        near = st.one_of(*map(_value, schema["anyOf"]))
    elif "prefixItems" in schema:
        near = st.tuples(_value(schema["prefixItems"][0])).map(list)
    elif kind == "array":
        near = st.lists(_value(schema["items"]), max_size=3)
    elif kind == "string" and "format" in schema:
        near = st.one_of(st.from_regex(FORMATS[schema["format"]], fullmatch=True),
                         st.sampled_from(["2024-02-30", "24:00:00Z", "a-.b", "1.2.3.256", "x"]))
    elif kind == "string":
        near = st.text("ab", max_size=4)
    elif kind in ("integer", "number") or "$ref" in schema:
        near = st.one_of(st.integers(-4, 4), st.sampled_from([0.5, 2.0, -3.0]))
    else:
        near = _scalar
    return st.one_of(near, _json)


@st.composite
def _arguments(draw, parameters: dict):
    """An object of some declared keys with values near their schemas, perhaps more keys."""
    keys = draw(st.lists(st.sampled_from(_NAMES), unique=True, max_size=4))
    properties = parameters["properties"]
    return {k: draw(_value(properties[k]) if k in properties else _json) for k in keys}


@settings(max_examples=400)
@given(case=_parameters().flatmap(lambda p: st.tuples(st.just(p), st.one_of(
    _arguments(p), _json))))
def test_the_checker_is_jsonschema_2020_12_with_formats_asserted(case):
    """The parser and the tools both promise what `jsonschema` (draft 2020-12, the grammar's
    formats asserted) says: the same verdict and one problem per error it reports, for every schema
    of a run (the checkers are cached by schema: two schemas must never share one)."""
    parameters, arguments = case
    reference = Draft202012Validator(parameters,
                                     format_checker=Draft202012Validator.FORMAT_CHECKER)
    assert len(schema_problems(arguments, parameters)) == len(list(
        reference.iter_errors(arguments)))


def _is_integer(v) -> bool:
    """JSON Schema's integer: a number with no fractional part (1.0 is one), never a bool."""
    return not isinstance(v, bool) and isinstance(v, int | float) and float(v).is_integer()


_FLAT = {"s": ({"type": "string", "maxLength": 2}, lambda v: isinstance(v, str) and len(v) <= 2),
         "i": ({"type": "integer", "minimum": 0}, lambda v: _is_integer(v) and v >= 0),
         "n": ({"type": ["number", "null"]},
               lambda v: v is None or not isinstance(v, bool) and isinstance(v, int | float)),
         "e": ({"enum": ["x", "y"]}, lambda v: v in ("x", "y"))}


@settings(max_examples=300)
@given(names=st.lists(st.sampled_from(sorted(_FLAT)), unique=True, max_size=4),
       required=st.lists(st.sampled_from(sorted(_FLAT)), unique=True, max_size=4),
       closed=st.booleans(),
       arguments=st.one_of(_json, st.dictionaries(st.sampled_from([*_FLAT, "z"]), _json),
                           st.dictionaries(st.sampled_from([*_FLAT, "z"]), st.one_of(
                               _scalar, st.sampled_from([0.0, 3.0, -1.0, True, "xyz"])))))
def test_problem_kinds_follow_the_keys_and_values_of_the_arguments(names, required, closed,
                                                                   arguments):
    """The record counts a call's issues by kind: a required key absent is missing, a key
    outside a closed schema is extra, a value its property refuses (or arguments that are not
    an object) is a wrong type; each kind iff the arguments show it."""
    parameters = {"type": "object", "properties": {n: _FLAT[n][0] for n in names},
                  "required": required, "additionalProperties": not closed}
    expected = set()
    if not isinstance(arguments, dict):
        expected.add("wrong_type")
    else:
        if set(required) - set(arguments):
            expected.add("missing_argument")
        if closed and set(arguments) - set(names):
            expected.add("extra_argument")
        if any(not _FLAT[k][1](v) for k, v in arguments.items() if k in names):
            expected.add("wrong_type")
    assert set(problem_kinds(arguments, parameters)) == expected


# -- formats: an oracle per format written from its RFC, on strings near the format ------------

def _time_ok(h, m, s, off) -> bool:
    return h < 24 and m < 60 and s < 60 and (off == "Z" or int(off[1:3]) < 24
                                             and int(off[4:]) < 60)


def _date_ok(y, mo, d) -> bool:
    try:
        datetime.date(y, mo, d)
        return True
    except ValueError:
        return False


_two = st.integers(0, 99).map("{:02d}".format)
_offset = st.one_of(st.just("Z"), st.builds("{}{}:{}".format, st.sampled_from("+-"), _two, _two))
_second = _two.filter(lambda s: s != "60")  # a leap second: valid or not by the date, left out
_time = st.tuples(_two, _two, _second, _offset)
_date = st.tuples(st.integers(1, 9999), st.integers(0, 13), st.integers(0, 32))
_label = st.text(string.ascii_lowercase + string.digits + "-", min_size=0, max_size=8)


@st.composite
def _near_format(draw) -> tuple[str, str, bool]:
    """A format, a string shaped like it with fields in or out of range, and whether the
    RFC behind the format accepts it."""
    fmt = draw(st.sampled_from(["date", "time", "date-time", "ipv4", "hostname", "uuid"]))
    if fmt in ("time", "date-time"):
        h, m, s, off = draw(_time)
        text, ok = f"{h}:{m}:{s}{off}", _time_ok(int(h), int(m), int(s), off)
        if fmt == "date-time":
            y, mo, d = draw(_date)
            text, ok = f"{y:04d}-{mo:02d}-{d:02d}T{text}", ok and _date_ok(y, mo, d)
        return fmt, text, ok
    if fmt == "date":
        y, mo, d = draw(_date)
        return fmt, f"{y:04d}-{mo:02d}-{d:02d}", _date_ok(y, mo, d)
    if fmt == "ipv4":
        octets = draw(st.lists(st.integers(0, 300), min_size=3, max_size=5))
        padded = draw(st.booleans())
        text = ".".join(f"{o:03d}" if padded else str(o) for o in octets)
        return fmt, text, len(octets) == 4 and all(o < 256 for o in octets) and (
            not padded or all(o >= 100 for o in octets))
    if fmt == "uuid":
        groups = draw(st.lists(st.integers(3, 13), min_size=4, max_size=6))
        text = "-".join("a" * n for n in groups)
        return fmt, text, groups == [8, 4, 4, 4, 12]
    labels = draw(st.lists(_label, min_size=1, max_size=3)) + ["ex" + draw(_label)]
    return fmt, ".".join(labels), all(
        0 < len(x) < 64 and x[0] != "-" and x[-1] != "-" for x in labels)


@settings(max_examples=300)
@given(case=_near_format())
def test_a_format_is_asserted_as_its_rfc_says(case):
    """`format` constrains arguments only if the checker asserts it: a time of 25:00, a
    13th month or a label ending in '-' must be refused, else the grammar's promise (every
    value it emits validates) and the record's counts of wrong calls mean nothing for that
    format."""
    fmt, text, ok = case
    assert (schema_problems(text, {"type": "string", "format": fmt}) == []) == ok, text


@settings(max_examples=200)
@given(case=st.sampled_from(sorted(FORMATS)).flatmap(
    lambda f: st.tuples(st.just(f), st.from_regex(FORMATS[f], fullmatch=True))))
def test_every_string_a_format_pattern_emits_passes_the_checker(case):
    """values.FORMATS writes each format as a pattern the grammar emits from: each such
    string must pass the checker, or the engine emits calls the record counts as wrong."""
    fmt, text = case
    assert schema_problems(text, {"type": "string", "format": fmt}) == [], text


_ALL_FORMATS = sorted(Draft202012Validator.FORMAT_CHECKER.checkers)


@settings(max_examples=200)
@given(fmt=st.sampled_from(_ALL_FORMATS), text=st.one_of(
    st.text(max_size=6), st.sampled_from(["(", "a b", "2024-02-28", "P1D", "#fff", "/a/b"])))
def test_only_the_formats_the_grammar_writes_are_asserted(fmt, text):
    """A format the grammar does not write as a pattern is an annotation (values.py): the
    grammar emits any string for it, so the checker asserting it would count the engine's
    own calls as wrong (regex, idn-hostname, uri-template, duration, ...)."""
    assert set(ASSERTED_FORMATS) == set(FORMATS)
    valid = fmt not in FORMATS or Draft202012Validator.FORMAT_CHECKER.conforms(text, fmt)
    assert (schema_problems(text, {"type": "string", "format": fmt}) == []) == valid


# -- the environment and the server judge a call alike ------------------------------------------

@settings(max_examples=300)
@given(case=_parameters().flatmap(lambda p: st.tuples(st.just(p), st.one_of(
    _arguments(p).map(json.dumps), _json.map(json.dumps),
    st.sampled_from(["", "{", "{}", "NaN", '{"a": NaN}', '{"a": 1, "a": "x"}', "[]", "null"])))))
def test_the_environment_runs_exactly_the_calls_the_server_finds_valid(case):
    """rollfleet/toolschema.py: a call is valid in one place (the server's check of a parsed
    call) exactly when it is valid in the other (the environment's check before it runs it)."""
    parameters, arguments = case
    tools = [{"type": "function", "function": {"name": "t", "parameters": parameters}}]
    try:
        check_arguments("t", arguments, parameters)
        runs = True
    except ToolCallError:
        runs = False
    assert runs == (check_call("t", arguments, tools) == [])


def test_a_problem_s_message_names_the_path_of_the_value_at_fault():
    """A nested value's problem starts with its path, segments joined by '/'; one about the
    arguments as a whole is the validator's words alone."""
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {
        "type": "object", "properties": {"b": {"type": "string"}}}}}, "required": ["a"]}
    [deep] = schema_problems({"a": [{"b": "x"}, {"b": 3}]}, schema)
    assert deep.kind == "wrong_type" and deep.message == "a/1/b: 3 is not of type 'string'"
    [top] = schema_problems({}, schema)
    assert top == SchemaProblem("missing_argument", "'a' is a required property")


def test_the_format_checker_asserts_draft_2020_12_s_checkers_of_the_formats_it_names():
    """Built alone: exactly ASSERTED_FORMATS, each draft 2020-12's (its `time` wants an offset,
    draft 3's does not); a format it does not name conforms, as an annotation."""
    checker = _format_checker()
    assert sorted(checker.checkers) == sorted(ASSERTED_FORMATS)
    assert checker.conforms("12:30:00Z", "time") and not checker.conforms("12:30:00", "time")
    assert not checker.conforms("not an email", "email")
    assert checker.conforms("#zz", "color")

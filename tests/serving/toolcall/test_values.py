"""Value grammars from JSON Schema: what they admit, their bounds, what they refuse by name."""

import json

import pytest
import xgrammar as xgr

from serving.toolcall import UnsupportedSchema
from serving.toolcall.values import Caps, ValueGrammar


def _admits(compiler, tokenizer, schema, root=None, caps=None):
    """A function text -> whether the argument grammar of `schema` admits exactly `text`."""
    values = ValueGrammar(root or {"properties": {"x": schema}}, caps or Caps())
    compiled = compiler.compile_grammar(values.rules.grammar(values.argument(schema)[0]))

    def admits(text: str) -> bool:
        m = xgr.GrammarMatcher(compiled)
        ok = all(m.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False))
        return ok and m.accept_token(tokenizer.eos_token_id)
    return admits


def test_integer_ranges_are_exact(compiler, tokenizer):
    admits = _admits(compiler, tokenizer, {"type": "integer", "minimum": -12,
                                           "exclusiveMaximum": 37})
    for n in range(-40, 60):
        assert admits(str(n)) == (-12 <= n < 37), n
    assert not admits("007") and not admits("-0") and not admits("1.0")


def test_an_unbounded_integer_gets_fifteen_digits(compiler, tokenizer):
    admits = _admits(compiler, tokenizer, {"type": "integer"})
    assert admits("9" * 15) and admits("-" + "9" * 15) and admits("0")
    assert not admits("9" * 16)


@pytest.mark.parametrize(("schema", "inside", "outside"), [
    ({"type": "number", "minimum": -0.5, "maximum": 0.5},
     ["-0.5", "0", "0.25", "0.499999999", "-0.1"], ["0.51", "-0.6", "1", ".5", "0.5000000001"]),
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 4, "multipleOf": 1},
     ["1", "4", "3"], ["0", "0.5", "4.01", "-1"]),
    ({"type": "number", "minimum": 0.01, "maximum": 1000000},
     ["0.01", "1000000", "999999.99"], ["0.009", "1000000.1", "0"]),
])
def test_number_ranges_are_exact(compiler, tokenizer, schema, inside, outside):
    admits = _admits(compiler, tokenizer, schema)
    assert all(admits(x) for x in inside), [x for x in inside if not admits(x)]
    assert not any(admits(x) for x in outside), [x for x in outside if admits(x)]


def test_strings_json_and_raw(compiler, tokenizer):
    raw = _admits(compiler, tokenizer, {"type": "string", "maxLength": 5})
    assert raw('a"b\\c') and raw("日本語") and not raw("abcdef")
    nested = _admits(compiler, tokenizer, {"type": "array", "items": {"type": "string",
                                                                      "maxLength": 3}})
    assert nested('["a\\"b","\\n"]') and not nested('["a"b"]') and not nested('["\\u0041"]')
    assert not nested('["abcd"]') and nested("[]")


def test_unbounded_strings_and_arrays_take_the_caps(compiler, tokenizer):
    caps = Caps(string=4, items=2)
    admits = _admits(compiler, tokenizer, {"type": "array", "items": {"type": "string"}},
                     caps=caps)
    assert admits('["abcd","x"]') and not admits('["abcde"]') and not admits('["a","b","c"]')


def test_objects_keep_order_optional_members_and_no_extras(compiler, tokenizer):
    admits = _admits(compiler, tokenizer, {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"},
        "c": {"type": "null"}}, "required": ["b"]})
    for text in ('{"b":true}', '{"a":1,"b":false}', '{"b":true,"c":null}',
                 '{"a":0,"b":true,"c":null}'):
        assert admits(text), text
    for text in ('{"a":1}', '{"b":true,"a":1}', '{"b":true,"d":1}', '{"a":1,,"b":true}',
                 '{"b":true,}', '{ "b":true}'):
        assert not admits(text), text


def test_refs_unions_and_discriminated_one_of(compiler, tokenizer):
    root = {"$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}},
                            "required": ["x"], "additionalProperties": False}}}
    admits = _admits(compiler, tokenizer, {"anyOf": [{"$ref": "#/$defs/P"}, {"type": "null"}]},
                     root=root)
    assert admits('{"x":3}') and admits("null") and not admits('{"y":3}')
    shapes = {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"const": "b"}, "n": {"type": "integer"}},
         "required": ["kind", "n"]}]}
    admits = _admits(compiler, tokenizer, shapes)
    assert admits('{"kind":"a"}') and admits('{"kind":"b","n":1}') and not admits('{"kind":"c"}')


def test_recursion_ends_at_the_depth_cap(compiler, tokenizer):
    node = {"type": "object", "properties": {"c": {"type": "array", "items": {
        "$ref": "#/$defs/N"}}}, "additionalProperties": False}
    root = {"$defs": {"N": node}}
    admits = _admits(compiler, tokenizer, {"$ref": "#/$defs/N"}, root=root, caps=Caps(depth=2))
    assert admits('{"c":[{"c":[]}]}') and admits("{}")
    assert not admits('{"c":[{"c":[{"c":[]}]}]}')


@pytest.mark.parametrize(("fmt", "good", "bad"), [
    ("date", "2024-02-28", "2024-02-30"), ("date-time", "2024-02-28T23:59:59Z", "2024-02-28"),
    ("time", "12:00:00+02:00", "24:00:00Z"), ("uuid", "12345678-9abc-def0-1234-56789abcdef0",
                                              "12345678-9abc-def0-1234"),
    ("ipv4", "192.168.0.1", "192.168.0.256"), ("email", "a.b@example.com", "a.b.example.com"),
])
def test_formats_admit_what_their_checker_accepts(compiler, tokenizer, fmt, good, bad):
    from jsonschema import Draft202012Validator

    admits = _admits(compiler, tokenizer, {"type": "string", "format": fmt})
    assert admits(good) and not admits(bad)
    Draft202012Validator({"format": fmt},
                         format_checker=Draft202012Validator.FORMAT_CHECKER).validate(good)


def test_patterns_match_whole_and_unicode_classes_stay_subsets(compiler, tokenizer):
    admits = _admits(compiler, tokenizer, {"type": "string", "pattern": "^[A-Z]{1,5}$"})
    assert admits("ABC") and not admits("abc") and not admits("ABCDEF") and not admits("")
    no_digits = _admits(compiler, tokenizer, {"type": "string", "pattern": r"^[^\d]{1,3}$"})
    assert no_digits("ab") and not no_digits("a1") and not no_digits("a٣")  # Arabic-Indic 3
    word = _admits(compiler, tokenizer, {"type": "string", "pattern": r"^\w+$", "maxLength": 4})
    assert word("a_1") and not word("a-b") and not word("abcde")


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"not": {"type": "string"}}, "not"),
    ({"type": "object", "properties": {"a": {}}, "if": {"required": ["a"]}}, "if"),
    ({"type": "number", "multipleOf": 0.25}, "multipleOf"),
    ({"type": "number", "multipleOf": 0.01}, "multipleOf"),
    ({"type": "integer", "multipleOf": 3}, "multipleOf"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, "oneOf"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties"),
    ({"type": "string", "pattern": "(?=a)b"}, "pattern"),
    ({"type": "string", "pattern": "(a)\\1"}, "pattern"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "uniqueItems": True},
     "uniqueItems"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "minimum"),
    ({"$ref": "https://example.com/schema"}, "$ref"),
])
def test_what_cannot_be_enforced_is_refused_by_name(schema, keyword):
    with pytest.raises(UnsupportedSchema, match=json.dumps(keyword).replace("$", r"\$")[1:-1]) \
            as refused:
        ValueGrammar({"properties": {"x": schema}}, Caps()).argument(schema)
    assert refused.value.keyword == keyword

"""MCP tool schemas become strict, bounded OpenAI tools where they can; calls are checked."""

import pytest

from envs.tools import ToolCallError
from envs.vf.schemas import INT_RANGE, strict_parameters, tool_spec

READ = {"type": "object", "title": "readArguments",
        "properties": {"path": {"type": "string", "title": "Path"},
                       "start": {"anyOf": [{"type": "integer"}, {"type": "null"}],
                                 "default": None},
                       "times": {"type": "integer", "default": 1}},
        "required": ["path"]}


def test_optional_parameters_become_required_nullable_and_bounded():
    params, optional, strict = strict_parameters(READ, 50)
    assert strict and optional == {"start", "times"}
    assert params["required"] == ["path", "start", "times"]
    assert params["additionalProperties"] is False and "title" not in params
    assert params["properties"] == {
        "path": {"type": "string", "maxLength": 50},
        "start": {"type": ["integer", "null"], **INT_RANGE},
        "times": {"type": ["integer", "null"], **INT_RANGE}}
    assert "default" in READ["properties"]["times"]  # the server's schema is left alone


def test_unions_of_plain_types_merge_and_keep_their_bounds_under_the_cap():
    line = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 9}, {"type": "null"}]}
    text = {"anyOf": [{"type": "string", "maxLength": 80}, {"type": "integer"}]}
    enum = {"anyOf": [{"type": "string", "enum": ["a"]}, {"type": "null"}]}
    twice = {"anyOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}
    schema = {"type": "object", "required": ["line", "text", "enum", "twice"],
              "properties": {"line": line, "text": text, "enum": enum, "twice": twice}}
    props = strict_parameters(schema, 50)[0]["properties"]
    assert props["line"] == {"type": ["integer", "null"], "minimum": 1, "maximum": 9}
    assert props["text"] == {"type": ["string", "integer"], "maxLength": 50, **INT_RANGE}
    assert props["enum"] == enum and props["twice"] == twice  # not plain: left as they are


def test_nested_objects_stay_as_given_and_not_strict():
    nested = {"type": "object", "properties": {"opts": {"type": "object", "properties": {}}},
              "required": []}
    params, optional, strict = strict_parameters(nested, 50)
    assert not strict and not optional and params == nested
    assert "strict" not in tool_spec("srv", "t", "d", nested, 50).schema["function"]


def test_names_follow_verifiers_harnesses():
    assert tool_spec("counter", "add", "d", READ, 50).name == "counter_add"
    spec = tool_spec("", "bash", "Run it.", READ, 50)
    assert spec.name == "bash" and spec.server == "" and spec.tool == "bash"
    assert spec.schema["function"]["strict"] is True
    assert spec.schema["function"]["description"] == "Run it."


def test_arguments_drop_nulls_of_optional_parameters_only():
    spec = tool_spec("", "read", "", READ, 50)
    assert spec.arguments('{"path": "a", "start": null, "times": 2}') == {"path": "a", "times": 2}
    assert spec.arguments({"path": "a", "start": 3, "times": None}) == {"path": "a", "start": 3}


@pytest.mark.parametrize("raw, message", [
    ("{not json", "not JSON"),
    ('{"path": "a"}', "'start' is a required property"),
    ('{"path": 1, "start": null, "times": null}', "is not of type 'string'"),
    ('{"path": "a", "start": null, "times": null, "x": 1}', "Additional properties"),
    ('{"path": "%s", "start": null, "times": null}' % ("a" * 51), "is too long"),
])
def test_malformed_arguments_are_refused(raw, message):
    with pytest.raises(ToolCallError, match=message):
        tool_spec("", "read", "", READ, 50).arguments(raw)

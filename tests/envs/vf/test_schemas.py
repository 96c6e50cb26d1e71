"""MCP tool schemas become strict OpenAI tools where they can; calls are checked against them."""

import pytest

from envs.tools import ToolCallError
from envs.vf.schemas import strict_parameters, tool_spec

READ = {"type": "object", "title": "readArguments",
        "properties": {"path": {"type": "string"},
                       "start": {"anyOf": [{"type": "integer"}, {"type": "null"}],
                                 "default": None},
                       "times": {"type": "integer", "default": 1}},
        "required": ["path"]}


def test_optional_parameters_become_required_and_nullable():
    params, optional, strict = strict_parameters(READ)
    assert strict and optional == {"start", "times"}
    assert params["required"] == ["path", "start", "times"]
    assert params["additionalProperties"] is False
    assert params["properties"]["times"] == {"type": ["integer", "null"]}
    assert params["properties"]["start"] == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert "default" in READ["properties"]["times"]  # the server's schema is left alone


def test_nested_objects_stay_as_given_and_not_strict():
    nested = {"type": "object", "properties": {"opts": {"type": "object", "properties": {}}},
              "required": []}
    params, optional, strict = strict_parameters(nested)
    assert not strict and not optional and params == nested
    spec = tool_spec("srv", "t", "d", nested)
    assert "strict" not in spec.schema["function"]


def test_names_follow_verifiers_harnesses():
    assert tool_spec("counter", "add", "d", READ).name == "counter_add"
    spec = tool_spec("", "bash", "Run it.", READ)
    assert spec.name == "bash" and spec.server == "" and spec.tool == "bash"
    assert spec.schema["function"]["strict"] is True
    assert spec.schema["function"]["description"] == "Run it."


def test_arguments_drop_nulls_of_optional_parameters_only():
    spec = tool_spec("", "read", "", READ)
    assert spec.arguments('{"path": "a", "start": null, "times": 2}') == {"path": "a", "times": 2}
    assert spec.arguments({"path": "a", "start": 3, "times": None}) == {"path": "a", "start": 3}


@pytest.mark.parametrize("raw, message", [
    ("{not json", "not JSON"),
    ('{"path": "a"}', "'start' is a required property"),
    ('{"path": 1, "start": null, "times": null}', "is not of type 'string'"),
    ('{"path": "a", "start": null, "times": null, "x": 1}', "Additional properties"),
])
def test_malformed_arguments_are_refused(raw, message):
    with pytest.raises(ToolCallError, match=message):
        tool_spec("", "read", "", READ).arguments(raw)

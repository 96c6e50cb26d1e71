"""verifiers' MCP tools as the rollout job's OpenAI tools: strict mode wherever it fits.

Strict mode wants every property required and no others. An optional parameter becomes a
required, nullable one, and a null for it is dropped before the call, so the tool server uses its
own default. The rollout job's tool-call grammar bounds the length of every value, so a union of
plain types (`anyOf`, as pydantic writes `int | None`) becomes one typed schema, numbers without
a range get a 32-bit one, and strings are capped at `max_string` characters (the rollout env's
`max_file_chars`: what the model may send, whatever the server would take). pydantic's generated
titles are dropped. Schemas with nested objects or references stay as the server gave them (not
strict). Names follow verifiers' own harnesses: `<server>_<tool>`, or the bare tool name for a
server without a prefix.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from envs.tools import check_arguments

INT_RANGE = {"minimum": -(2**31 - 1), "maximum": 2**31 - 1}


@dataclass(frozen=True)
class ToolSpec:
    name: str  # what the model calls
    server: str  # the MCP server's name in the rollout ("" for unprefixed servers)
    tool: str  # the tool's name on that server
    schema: dict[str, Any]  # the OpenAI tool
    optional: frozenset[str]  # nullable stand-ins for optional parameters: null means omitted

    def arguments(self, raw: str | dict) -> dict[str, Any]:
        """Parse and check a call's arguments; raises ToolCallError for malformed ones."""
        raw = check_arguments(self.name, raw, self.schema["function"]["parameters"])
        return {k: v for k, v in raw.items() if not (v is None and k in self.optional)}


def tool_spec(server: str, tool: str, description: str, input_schema: dict,
              max_string: int) -> ToolSpec:
    name = f"{server}_{tool}" if server else tool
    parameters, optional, strict = strict_parameters(input_schema, max_string)
    function: dict[str, Any] = {"name": name, "description": description, "parameters": parameters}
    if strict:
        function["strict"] = True
    return ToolSpec(name, server, tool, {"type": "function", "function": function}, optional)


def strict_parameters(schema: dict[str, Any],
                      max_string: int) -> tuple[dict[str, Any], frozenset[str], bool]:
    """(parameters, optional names made nullable, whether the result is strict-mode ready)."""
    schema = copy.deepcopy(schema)
    properties = schema.get("properties", {})
    if schema.get("type") != "object" or "$defs" in schema or _nested(properties):
        return schema, frozenset(), False
    required = set(schema.get("required", []))
    optional = frozenset(name for name in properties if name not in required)
    for name, prop in properties.items():
        prop = _merged(prop)
        prop.pop("title", None)
        if name in optional:
            prop.pop("default", None)
            prop = _nullable(prop)
        properties[name] = _bounded(prop, max_string)
    schema.pop("title", None)
    schema["properties"] = properties
    schema["required"] = list(properties)
    schema["additionalProperties"] = False
    return schema, optional, True


def _merged(prop: dict[str, Any]) -> dict[str, Any]:
    """`anyOf` of plain, distinct types as one schema with a type list. Lossless: each type's
    keywords (`maximum`, `maxLength`, ...) only ever apply to values of that type."""
    branches = prop.get("anyOf")
    if not branches or not all(isinstance(b.get("type"), str) for b in branches):
        return prop
    kinds = [b["type"] for b in branches]
    keys = [k for b in branches for k in b if k != "type"]
    if len(set(kinds)) < len(kinds) or len(set(keys)) < len(keys) or "enum" in keys:
        return prop
    merged = {k: v for k, v in prop.items() if k != "anyOf"}
    for branch in branches:
        merged.update({k: v for k, v in branch.items() if k != "type"})
    merged["type"] = kinds[0] if len(kinds) == 1 else kinds
    return merged


def _bounded(prop: dict[str, Any], max_string: int) -> dict[str, Any]:
    """Numbers without a range get a 32-bit one; strings at most `max_string` characters."""
    kinds = prop.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "integer" in kinds or "number" in kinds:
        prop = {**INT_RANGE, **prop}
    if "string" in kinds and "enum" not in prop:
        prop["maxLength"] = min(prop.get("maxLength", max_string), max_string)
    return prop


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    if "anyOf" in prop:
        if {"type": "null"} not in prop["anyOf"]:
            prop["anyOf"] = [*prop["anyOf"], {"type": "null"}]
    elif isinstance(prop.get("type"), str):
        prop["type"] = [prop["type"], "null"]
    elif isinstance(prop.get("type"), list) and "null" not in prop["type"]:
        prop["type"] = [*prop["type"], "null"]
    return prop


def _nested(node: Any) -> bool:
    """Whether a schema fragment holds an object type or a reference anywhere inside."""
    if isinstance(node, dict):
        kind = node.get("type")
        if "$ref" in node or kind == "object" or (isinstance(kind, list) and "object" in kind):
            return True
        return any(_nested(v) for v in node.values())
    if isinstance(node, list):
        return any(_nested(v) for v in node)
    return False

"""verifiers' MCP tools as the rollout job's OpenAI tools: strict mode wherever it fits.

Strict mode wants every property required and no others. An optional parameter becomes a
required, nullable one, and a null for it is dropped before the call, so the tool server uses its
own default. Schemas with nested objects or references stay as the server gave them (not strict).
Names follow verifiers' own harnesses: `<server>_<tool>`, or the bare tool name for a server
without a prefix.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from envs.tools import ToolCallError


@dataclass(frozen=True)
class ToolSpec:
    name: str  # what the model calls
    server: str  # the MCP server's name in the rollout ("" for unprefixed servers)
    tool: str  # the tool's name on that server
    schema: dict[str, Any]  # the OpenAI tool
    optional: frozenset[str]  # nullable stand-ins for optional parameters: null means omitted

    def arguments(self, raw: str | dict) -> dict[str, Any]:
        """Parse and check a call's arguments; raises ToolCallError for malformed ones."""
        if isinstance(raw, str):
            try:
                raw = json.loads(raw or "{}")
            except json.JSONDecodeError as exc:
                raise ToolCallError(f"arguments of {self.name} are not JSON: {exc}") from None
        try:
            jsonschema.validate(raw, self.schema["function"]["parameters"])
        except jsonschema.ValidationError as exc:
            raise ToolCallError(f"arguments of {self.name} do not match its schema: "
                                f"{exc.message}") from None
        return {k: v for k, v in raw.items() if not (v is None and k in self.optional)}


def tool_spec(server: str, tool: str, description: str, input_schema: dict) -> ToolSpec:
    name = f"{server}_{tool}" if server else tool
    parameters, optional, strict = strict_parameters(input_schema)
    function: dict[str, Any] = {"name": name, "description": description, "parameters": parameters}
    if strict:
        function["strict"] = True
    return ToolSpec(name, server, tool, {"type": "function", "function": function}, optional)


def strict_parameters(schema: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str], bool]:
    """(parameters, optional names made nullable, whether the result is strict-mode ready)."""
    schema = copy.deepcopy(schema)
    properties = schema.get("properties", {})
    if schema.get("type") != "object" or "$defs" in schema or _nested(properties):
        return schema, frozenset(), False
    required = set(schema.get("required", []))
    optional = frozenset(name for name in properties if name not in required)
    for name in optional:
        properties[name].pop("default", None)
        properties[name] = _nullable(properties[name])
    schema["properties"] = properties
    schema["required"] = list(properties)
    schema["additionalProperties"] = False
    return schema, optional, True


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

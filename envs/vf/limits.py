"""Our tool schemas onto MCP tool functions: the served tools get our descriptions and limits.

An MCP server derives a tool's JSON schema from its Python signature. `WorkspaceToolset` hands
verifiers' registration this adapter, which puts each parameter's length and range limits from
`envs.tools.tool_schemas` (they depend on the env config) into the signature as pydantic
constraints, and our description in place of the docstring. The served tools then advertise,
and enforce, what the rollout job's own tools do.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, get_type_hints

from pydantic import Field

FIELDS = {"maxLength": "max_length", "minLength": "min_length", "minimum": "ge", "maximum": "le"}


class LimitedTools:
    """Stands in for the MCP server during `Toolset.register`, adding tools with our schemas."""

    def __init__(self, mcp: Any, schemas: list[dict]) -> None:
        self.mcp = mcp
        self.schemas = {s["function"]["name"]: s["function"] for s in schemas}

    def add_tool(self, fn: Callable, name: str | None = None, description: str | None = None,
                 **kwargs: Any) -> Any:
        ours = self.schemas[name or fn.__name__]
        return self.mcp.add_tool(constrained(fn, ours["parameters"]["properties"]), name=name,
                                 description=ours["description"], **kwargs)


def constrained(fn: Callable, properties: dict[str, dict]) -> Callable:
    """`fn` with each parameter's JSON-schema limits from `properties` in its annotation."""
    hints = get_type_hints(inspect.unwrap(fn))
    signature = inspect.signature(fn)
    params = []
    for param in signature.parameters.values():
        limits = {FIELDS[k]: v for k, v in properties.get(param.name, {}).items() if k in FIELDS}
        if limits:
            param = param.replace(annotation=Annotated[hints[param.name], Field(**limits)])
        params.append(param)
    fn.__signature__ = signature.replace(parameters=params)
    return fn

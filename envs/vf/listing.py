"""The tools a taskset's servers advertise, read without starting any server.

A Toolset registers its tools with `add_tool` on what it is given; handed the MCP SDK's tool
manager (the one inside every MCP server), it yields the names and JSON schemas the live server
will advertise. Toolsets that only learn their tools at run time (proxies of other servers)
cannot be listed this way; they are refused with their name.
"""

from __future__ import annotations

import verifiers.v1 as vf
from mcp.server.mcpserver.tools import ToolManager

from envs.task import EnvError
from envs.vf.schemas import ToolSpec, tool_spec


def list_tools(toolsets: list[vf.Toolset], max_string: int) -> dict[str, ToolSpec]:
    """Every toolset's tools by the name the model calls; see `tool_spec` for `max_string`."""
    specs: dict[str, ToolSpec] = {}
    for toolset in toolsets:
        manager = ToolManager()
        try:
            toolset.register(manager)
        except Exception as exc:  # noqa: BLE001 - any failure means: not listable offline
            raise EnvError(f"cannot list the tools of {type(toolset).__name__} without "
                           f"running it: {exc}") from None
        for tool in manager.list_tools():
            spec = tool_spec(toolset.server_name, tool.name, tool.description or "",
                             tool.parameters, max_string)
            if spec.name in specs:
                raise EnvError(f"two tool servers offer a tool named {spec.name!r}")
            specs[spec.name] = spec
    return specs

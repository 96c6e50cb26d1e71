"""verifiers' own tool-calling chat loop (the `null` harness), run by this interpreter.

The stock harnesses build their program's Python environment with uv from the package index on
first use; there is no network here, and this venv already holds every package the program
declares (openai, mcp, httpx, httpx2, tenacity, certifi). So the program runs as it is, with
`sys.executable`, in a local subprocess runtime. The loop offers the model only the task's MCP
tools: our tools, with our names.
"""

from __future__ import annotations

import hashlib
import sys

import verifiers.v1 as vf
from verifiers.v1.harnesses.null import NullHarness


class LocalChatHarness(NullHarness):
    async def setup(self, runtime: vf.Runtime) -> None:
        _require_host(runtime)

    async def launch(self, ctx: vf.ModelContext, trace: vf.Trace, runtime: vf.Runtime,
                     endpoint: str, secret: str, mcp_urls: dict[str, str], data: vf.TaskData,
                     tool_interception_url: str | None = None) -> vf.ProgramResult:
        _require_host(runtime)
        return await super().launch(ctx, trace, _HostPython(runtime), endpoint, secret,
                                    mcp_urls, data, tool_interception_url)


def _require_host(runtime: vf.Runtime) -> None:
    if runtime.type != "subprocess":
        raise ValueError(f"this harness runs its program with the host's Python; it needs the "
                         f"subprocess runtime, not {runtime.type!r} "
                         "(--env.agent.runtime.type subprocess)")


class _HostPython:
    """The runtime as the chat-program launcher uses it, with scripts run by `sys.executable`."""

    def __init__(self, runtime: vf.Runtime) -> None:
        self.runtime = runtime

    async def write(self, path: str, data: bytes) -> None:
        await self.runtime.write(path, data)

    async def prepare_uv_script(self, script: str | bytes, env: dict[str, str] | None = None,
                                *, activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        name = f".vf-program-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self.runtime.write(name, data)  # relative: the program runs in the workdir
        return [sys.executable, name]

    async def run_program(self, argv: list[str], env: dict[str, str]) -> vf.ProgramResult:
        return await self.runtime.run_program(argv, env)

"""Our tools as a verifiers tool server: one rollout's sandboxed workspace, driven over MCP.

verifiers starts one server process per rollout (`python -m envs.vf.toolset`). The server opens
an `Episode` of our environment for the rollout's task, runs each call through `Episode.call`,
and publishes the workspace's changes in the rollout state, so the reward can score them after
the server is gone. Tool names, descriptions and limits are those of `envs.tools.tool_schemas`.
"""

from __future__ import annotations

import asyncio
import atexit
import signal

import verifiers.v1 as vf

from envs.environment import EnvConfig, Episode
from envs.tools import tool_schemas
from envs.vf.limits import LimitedTools
from envs.vf.registry import environment_for
from envs.vf.state import WorkspaceState


class WorkspaceToolsConfig(vf.ToolsetConfig):
    env: EnvConfig = EnvConfig()


class WorkspaceToolset(vf.Toolset[WorkspaceToolsConfig, WorkspaceState]):
    TOOL_PREFIX = None  # bare names: the model sees the tools the rollout job offers

    def __init__(self, config: WorkspaceToolsConfig) -> None:
        super().__init__(config)
        self._episode: Episode | None = None

    def register(self, mcp: object) -> None:
        env = self.config.env
        super().register(LimitedTools(mcp, tool_schemas(env.max_command_chars,
                                                        env.max_file_chars)))

    async def setup_task(self, task: vf.TaskData) -> None:
        env = environment_for(self.config.env)
        self._episode = await asyncio.to_thread(env.episode, task.id)
        atexit.register(self._episode.close)
        # uvicorn re-raises the SIGTERM that stopped it once it is down; dying of it would skip
        # atexit and leave the session's mount and cgroup behind until the next start-up.
        signal.signal(signal.SIGTERM, _exit_on_signal)

    @vf.tool
    async def bash(self, command: str) -> str:
        return await self._call("bash", command=command)

    @vf.tool
    async def read_file(self, path: str, start_line: int | None = None,
                        end_line: int | None = None) -> str:
        return await self._call("read_file", path=path, start_line=start_line,
                                end_line=end_line)

    @vf.tool
    async def write_file(self, path: str, content: str) -> str:
        return await self._call("write_file", path=path, content=content)

    @vf.tool
    async def str_replace(self, path: str, old_text: str, new_text: str) -> str:
        return await self._call("str_replace", path=path, old_text=old_text, new_text=new_text)

    @vf.tool
    async def search(self, text: str) -> str:
        return await self._call("search", text=text)

    @vf.tool
    async def run_tests(self) -> str:
        return await self._call("run_tests")

    @vf.tool
    async def submit(self) -> str:
        return await self._call("submit")

    async def _call(self, name: str, **arguments: object) -> str:
        if self._episode is None:
            raise RuntimeError("this tool server has no task: it serves one rollout")
        result = await asyncio.to_thread(self._episode.call, name, arguments)
        changes = await asyncio.to_thread(self._episode.workspace.changes)
        self.state.diff, self.state.refused = changes.diff, changes.refused or ""
        self.state.submitted = self.state.submitted or result.submitted
        return result.output


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    WorkspaceToolset.run()

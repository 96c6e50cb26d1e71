"""One rollout of a verifiers task, driven call by call by the rollout job's session.

verifiers' `Rollout` boots the task's world as for any harness: the runtime, `Task.setup`, the
interception server (whose state channel the tool servers use) and the tool servers. Then, where
a harness would launch a program, the session is the agent: each `call` goes to the task's tool
servers over MCP, and the task's trace-level `@stop`s decide whether the episode is over.
`score` closes the rollout: tool servers down, `Task.finalize`, rewards and metrics, runtime
torn down. The trace holds no model turns (the session talks to the model itself), so rewards
that grade the conversation see none; rewards that grade the runtime or state work as usual.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import verifiers.v1 as vf
from verifiers.v1.harnesses.utils.mcp import MCPConnection, mcp_content_to_chat_content
from verifiers.v1.rollout import Rollout, RolloutTimeouts
from verifiers.v1.session import RolloutLimits, call_hook, hook_boundary

from envs.environment import SandboxError
from envs.scoring import Score
from envs.tools import ToolCallError, ToolResult
from envs.workspace import truncate

if TYPE_CHECKING:
    from envs.vf.environment import VerifiersEnvironment

SETUP_TIMEOUT_S = 180.0  # runtime, task setup and tool servers (about 5 s each)
OVER = "the episode is over"


class _SessionHarness(vf.Harness[vf.HarnessConfig]):
    """Launches nothing: it only receives the tool servers' URLs for the session."""

    EXECUTES_CODE = False
    NEEDS_CONTAINER = False
    SUPPORTS_MCP = True
    mcp_urls: dict[str, str] | None = None

    async def session(self, ctx: vf.ModelContext, trace: vf.Trace, runtime: vf.Runtime,
                      endpoint: str, secret: str, mcp_urls: dict[str, str], data: vf.TaskData,
                      tool_interception_url: str | None = None) -> vf.HarnessSession:
        self.mcp_urls = dict(mcp_urls)
        return await super().session(ctx, trace, runtime, endpoint, secret, mcp_urls, data,
                                     tool_interception_url)

    async def launch(self, *args, **kwargs) -> vf.ProgramResult:
        raise RuntimeError("the rollout job's session is the agent; nothing is launched")


class VerifiersEpisode:
    def __init__(self, env: VerifiersEnvironment, task_id: str) -> None:
        self.env, self.task_id = env, task_id
        self.task = env.tasks[task_id]
        self.harness = _SessionHarness(vf.HarnessConfig(id="rollfleet-session"))
        self.servers: dict[str, MCPConnection] = {}
        self.stops = [fn for fn in self.task.hooks("stop")
                      if hook_boundary(fn, allow_trace=True) is vf.Trace]
        self._mcp = AsyncExitStack()
        self._score: Score | None = None
        self._infra_error: str | None = None
        self._closed = False
        try:
            self.env.loop.run(self._open(), SETUP_TIMEOUT_S)
        except SandboxError:
            raise
        except TimeoutError:
            raise SandboxError(f"task {task_id}: rollout setup took over "
                               f"{SETUP_TIMEOUT_S} s") from None
        except Exception as exc:  # noqa: BLE001 - shared tool servers, interception: infra
            raise SandboxError(f"task {task_id}: rollout setup failed: {exc}") from None

    @property
    def trace(self) -> vf.Trace:
        return self.rollout.trace

    async def _open(self) -> None:
        cfg = self.env.cfg
        self.rollout = Rollout(
            task=self.task, agent_config=vf.AgentConfig(runtime=self.env.runtime),
            harness=self.harness, ctx=self.env.ctx, runtime_config=self.env.runtime,
            timeouts=RolloutTimeouts(finalize=cfg.score_timeout_s, scoring=cfg.score_timeout_s),
            limits=RolloutLimits(), shared_tools=await self.env.shared_tools())
        await self.rollout.open()
        if self.rollout.failure is not None:
            await self.rollout.abort()
            raise SandboxError(f"task {self.task_id}: rollout setup failed: "
                               f"{type(self.rollout.failure).__name__}: {self.rollout.failure}")
        for name, url in (self.harness.mcp_urls or {}).items():
            server = MCPConnection({"url": url, "timeout": cfg.tool_timeout_s})
            self._mcp.push_async_callback(server.aclose)
            self.servers[name] = server

    def call(self, name: str, arguments: str | dict) -> ToolResult:
        if self._closed or self._score is not None or not self.rollout.ok:
            return ToolResult(f"error: {OVER}", ok=False, error=OVER)
        spec = self.env.specs.get(name)
        try:
            if spec is None:
                raise ToolCallError(f"unknown tool {name!r}; tools: {sorted(self.env.specs)}")
            args = spec.arguments(arguments)
        except ToolCallError as exc:
            return ToolResult(output=f"error: {exc}", ok=False, error=str(exc))
        try:
            output, failed, stopped = self.env.loop.run(
                self._call(spec.server, spec.tool, args), self.env.cfg.tool_timeout_s + 10)
        except TimeoutError:
            return ToolResult(f"error: {name} timed out", ok=True, failed=True)
        except Exception as exc:  # noqa: BLE001 - the tool server itself broke: not the agent's
            self._infra_error = f"tool server failed on {name}: {type(exc).__name__}: {exc}"
            return ToolResult(f"error: {self._infra_error}", ok=True, failed=True)
        return ToolResult(truncate(output, self.env.cfg.max_output_chars), ok=True,
                          failed=failed, submitted=stopped)

    async def _call(self, server: str, tool: str, args: dict) -> tuple[str, bool, bool]:
        result = await self.servers[server].run(lambda client: client.call_tool(tool, args))
        content = mcp_content_to_chat_content(result.content)
        output = content if isinstance(content, str) else json.dumps(content)
        return output, bool(result.is_error), await self._stopped()

    async def _stopped(self) -> bool:
        """The task's trace-level `@stop`s, run as verifiers runs them before each model turn."""
        for stop in self.stops:
            if await call_hook(stop, {vf.Trace: self.trace}):
                self.trace.stop(stop.__name__)
                return True
        return False

    def score(self) -> Score:
        """Ends the rollout (verifiers scores once, at its close); later calls repeat it."""
        if self._score is None and self._closed:
            return Score(0.0, 0, 0, "", infra_error="the episode was closed before scoring")
        if self._score is None:
            limit = 2 * self.env.cfg.score_timeout_s + 30
            try:
                trace = self.env.loop.run(self._finish(), limit)
            except TimeoutError:
                self._score = Score(0.0, 0, 0, "", infra_error=f"scoring took over {limit} s")
            else:
                self._score = score_of(trace, self._infra_error)
        return self._score

    async def _finish(self) -> vf.Trace:
        await self._mcp.aclose()
        return await self.rollout.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._score is None:  # never scored: free everything without finalizing
            self.env.loop.run(self._abort(), SETUP_TIMEOUT_S)

    async def _abort(self) -> None:
        await self._mcp.aclose()
        await self.rollout.abort()

    def __enter__(self) -> VerifiersEpisode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def score_of(trace: vf.Trace, infra_error: str | None = None) -> Score:
    """The trace's rewards as our Score; the breakdown goes to `output` as JSON.

    Metrics named `tests_total` / `tests_failed` and a text `trace.info["diff"]` fill the
    matching Score fields. A trace error (setup, tool server, scoring) is an infra error, never
    a reward of 0.
    """
    error = trace.last_error
    if error is not None:
        infra_error = infra_error or f"{error.type}: {error.message}"
    breakdown = {
        "rewards": {k: None if r is None else {"score": r.score, "weight": r.weight}
                    for k, r in trace.rewards.items()},
        "metrics": trace.metrics, "stop_condition": trace.stop_condition,
        "errors": [f"{e.type}: {e.message}" for e in trace.errors]}
    diff = trace.info.get("diff")
    return Score(reward=trace.reward, tests_total=int(trace.metrics.get("tests_total") or 0),
                 tests_failed=int(trace.metrics.get("tests_failed") or 0),
                 output=json.dumps(breakdown), diff=diff if isinstance(diff, str) else "",
                 infra_error=infra_error)

"""Any verifiers v1 Taskset as an environment of the rollout job.

The `envs.Environment` Protocol, as the project's `SandboxEnvironment` has it: `tasks` (id ->
verifiers Task), `prompt(task)`, `tools` (OpenAI schemas of the taskset's MCP tools) and
`episode(task_id)`, whose `call` / `score` /
`close` drive one verifiers rollout (see `envs.vf.episode`). Tools run where the taskset's
toolsets place them: with the local subprocess runtime used here, on this host, without our
sandbox (our own taskset runs them in our sandbox).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.mcp import SharedToolServer, serve_shared

from envs.environment import EnvConfig
from envs.task import EnvError
from envs.vf.episode import VerifiersEpisode
from envs.vf.listing import list_tools
from envs.vf.loader import load_taskset
from envs.vf.loop import BackgroundLoop

log = logging.getLogger("envs")
# The session calls the model itself; the interception server must never reach one.
NO_MODEL = vf.EvalClientConfig(base_url="http://127.0.0.1:9/v1", api_key_var="ROLLFLEET_NONE")


class VerifiersEnvironment:
    def __init__(self, cfg: EnvConfig, taskset: vf.Taskset) -> None:
        self.cfg, self.taskset = cfg, taskset
        self.tasks = _select(cfg, _tasks_by_id(cfg, taskset))
        if not self.tasks:
            raise EnvError(f"environment {cfg.name}: no usable tasks")
        self.runtime = vf.SubprocessConfig()
        self.ctx = vf.ModelContext(model=cfg.name, client=NO_MODEL)
        first = next(iter(self.tasks.values()))
        self.shared_toolsets = type(taskset).toolsets(taskset.config)
        self.specs = list_tools([*self.shared_toolsets, *first.toolsets(first.config)],
                                cfg.max_file_chars)
        self.tools = [spec.schema for spec in self.specs.values()]
        self.loop = BackgroundLoop(f"vf-{cfg.name}")
        self._shared: dict[str, SharedToolServer] | None = None
        self._shared_stack = AsyncExitStack()
        self._shared_lock: asyncio.Lock | None = None

    def labels(self, task_id: str) -> tuple[str, str]:
        """(difficulty, category) of a task, for records and reports (our RollfleetData rows
        carry a difficulty; other tasksets' rows may not)."""
        data = self.tasks[task_id].data
        return str(getattr(data, "difficulty", "unknown")), str(getattr(data, "suite", ""))

    def prompt(self, task: vf.Task) -> list[dict]:
        data = task.data
        messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        if isinstance(data.prompt, str):
            return [*messages, {"role": "user", "content": data.prompt}]
        return [*messages, *(message_to_wire(m) for m in data.prompt or [])]

    def episode(self, task_id: str) -> VerifiersEpisode:
        return VerifiersEpisode(self, task_id)

    async def shared_tools(self) -> dict[str, SharedToolServer]:
        """The taskset-wide tool servers, started with the first episode, kept until close."""
        self._shared_lock = self._shared_lock or asyncio.Lock()
        async with self._shared_lock:
            if self._shared is None:
                self._shared = await self._shared_stack.enter_async_context(
                    serve_shared(self.shared_toolsets, harness_is_local=True))
        return self._shared

    def close(self) -> None:
        """Stop the shared tool servers and the loop (episodes close themselves)."""
        if not self.loop.loop.is_closed():
            self.loop.run(self._shared_stack.aclose(), 60)
            self.loop.close()

    def __enter__(self) -> VerifiersEnvironment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_verifiers_env(cfg: EnvConfig,
                       taskset_config: Mapping[str, Any] | None = None) -> VerifiersEnvironment:
    """`envs.load` for `env.suite: verifiers`: `env.tasks_path` names the taskset
    (`package.module:Class`, or a verifiers taskset id), `taskset_config` sets its fields."""
    if not cfg.tasks_path:
        raise EnvError("env.suite=verifiers needs env.tasks_path: the taskset, as "
                       "package.module:Class or a verifiers taskset id")
    log.warning("verifiers taskset %s: its tool servers run as local subprocesses; only tools "
                "that use the rollfleet sandbox (envs.vf.taskset's do) are isolated",
                cfg.tasks_path)
    return VerifiersEnvironment(cfg, load_taskset(cfg.tasks_path, taskset_config))


def _tasks_by_id(cfg: EnvConfig, taskset: vf.Taskset) -> dict[str, vf.Task]:
    """Tasks keyed by their data's `id`, else `name`, else position."""
    if not taskset.bounded:
        if not cfg.max_tasks:
            raise EnvError(f"environment {cfg.name}: the taskset is infinite; set max_tasks")
        taskset = taskset.take(cfg.max_tasks)
    tasks: dict[str, vf.Task] = {}
    for task in taskset:
        task_id = task.data.id or task.data.name or str(task.data.idx)
        if task_id in tasks:
            raise EnvError(f"environment {cfg.name}: two tasks have the id {task_id!r}")
        tasks[task_id] = task
    return tasks


def _select(cfg: EnvConfig, tasks: dict[str, vf.Task]) -> dict[str, vf.Task]:
    """`task_ids` and `max_tasks` as `envs.SandboxEnvironment` applies them (ids sorted)."""
    ids = sorted(tasks)
    if cfg.task_ids is not None:
        unknown = sorted(set(cfg.task_ids) - set(ids))
        if unknown:
            raise EnvError(f"environment {cfg.name}: unknown task ids {unknown}")
        ids = [i for i in ids if i in set(cfg.task_ids)]
    return {i: tasks[i] for i in (ids[: cfg.max_tasks] if cfg.max_tasks else ids)}

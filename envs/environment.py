"""An environment: a set of tasks, the tools an agent gets, and episodes that run them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from envs.scoring import Score, score_repo
from envs.task import EnvError, Task, load_task_dir
from envs.tools import ToolBox, ToolResult, tool_schemas
from envs.workspace import Workspace

log = logging.getLogger(__name__)
BUILTIN_SUITES = Path(__file__).parent / "tasks"

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a Python repository. Explore the code with "
    "the tools, change the files that are wrong, run the visible tests, and call submit when "
    "the bug is fixed. Hidden tests decide whether the fix is right."
)


@dataclass(frozen=True)
class EnvConfig:
    name: str = "mini_swe"
    tasks_dir: str | None = None  # null: the built-in suite named `name`
    task_ids: list[str] | None = None  # null: every task
    system_prompt: str = SYSTEM_PROMPT
    tool_timeout_s: float = 30.0
    score_timeout_s: float = 120.0
    max_output_chars: int = 4000
    max_command_chars: int = 400
    max_file_chars: int = 4000
    scratch_dir: str | None = None  # where session copies live; null: the system temp folder
    on_bad_task: str = "skip"  # skip | fail


class Episode:
    """One session's view of a task: its own workspace and toolbox, scored at the end."""

    def __init__(self, env: Environment, task: Task) -> None:
        self.env, self.task = env, task
        self.workspace = Workspace(task.repo_dir, root=env.scratch, prefix=f"{task.task_id}-")
        self.toolbox = ToolBox(self.workspace, env.tools, env.cfg.tool_timeout_s,
                               env.cfg.max_output_chars)

    def call(self, name: str, arguments: str | dict) -> ToolResult:
        return self.toolbox.call(name, arguments)

    def score(self) -> Score:
        return score_repo(self.task, self.workspace.path, self.env.scratch,
                          self.env.cfg.score_timeout_s, self.env.cfg.max_output_chars)

    def close(self) -> None:
        self.workspace.close()

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Environment:
    def __init__(self, cfg: EnvConfig) -> None:
        self.cfg = cfg
        self.scratch = Path(cfg.scratch_dir) if cfg.scratch_dir else None
        self.tools = tool_schemas(cfg.max_command_chars, cfg.max_file_chars)
        self.tasks = {t.task_id: t for t in self._load_tasks()}
        if not self.tasks:
            raise EnvError(f"environment {cfg.name}: no usable tasks")

    def _load_tasks(self) -> list[Task]:
        root = Path(cfg_dir) if (cfg_dir := self.cfg.tasks_dir) else BUILTIN_SUITES / self.cfg.name
        if not root.is_dir():
            raise EnvError(f"environment {self.cfg.name}: task folder {root} does not exist")
        tasks = []
        for path in sorted(p for p in root.iterdir() if p.is_dir()):
            try:
                tasks.append(load_task_dir(path))
            except EnvError as exc:
                if self.cfg.on_bad_task == "fail":
                    raise
                log.warning("skipping bad task: %s", exc)
        if self.cfg.task_ids is not None:
            unknown = sorted(set(self.cfg.task_ids) - {t.task_id for t in tasks})
            if unknown:
                raise EnvError(f"environment {self.cfg.name}: unknown task ids {unknown}")
            tasks = [t for t in tasks if t.task_id in set(self.cfg.task_ids)]
        return tasks

    def prompt(self, task: Task) -> list[dict]:
        return [{"role": "system", "content": self.cfg.system_prompt},
                {"role": "user", "content": task.statement}]

    def episode(self, task_id: str) -> Episode:
        return Episode(self, self.tasks[task_id])

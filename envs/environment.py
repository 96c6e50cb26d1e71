"""An environment: a set of tasks, the tools an agent gets, and episodes that run them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from envs.lease import scratch_root, sweep
from envs.sandbox import SandboxFailure, SandboxPolicy
from envs.scoring import Score, score_changes
from envs.suites import SUITES, load_suite
from envs.task import EnvError, Task
from envs.tools import ToolBox, ToolResult, tool_schemas
from envs.workspace import Changes, StartingTrees, Workspace

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a Python repository. Explore the code with "
    "the tools, change the files that are wrong, run the visible tests, and call submit when "
    "the bug is fixed. Hidden tests decide whether the fix is right."
)


REWARDS = ("hidden_tests", "first_call")


class SandboxError(EnvError):
    """The session's sandbox could not be set up: an infrastructure failure, not a reward."""


@dataclass(frozen=True)
class EnvConfig:
    name: str = "mini_swe"  # the environment's name, as its conf/env option
    # which tasks (Environments page): mini, stdlib, swebench, verifiers
    suite: str = field(default="mini", metadata={"choices": SUITES})
    # The suite's data; null: its built-in tasks. verifiers: package.module:Class or a vf-eval id.
    tasks_path: str | None = None
    taskset: dict = field(default_factory=dict)  # verifiers: the taskset's own config fields
    task_ids: list[str] | None = None  # null: every task
    max_tasks: int | None = None  # the first N tasks (in id order) after task_ids
    system_prompt: str = SYSTEM_PROMPT  # the first message of every session
    tool_timeout_s: float = 30.0  # a tool call's wall clock; its process group is killed at it
    score_timeout_s: float = 120.0  # scoring's wall clock (the hidden tests' run)
    max_output_chars: int = 4000  # a tool's output is cut to this, with a marker
    max_command_chars: int = 200  # maxLength of bash's command argument
    max_file_chars: int = 500  # maxLength of the file tools' text arguments
    # where session folders live; null: /dev/shm if it is a tmpfs with 1 GiB free, else the
    # system temp folder (envs.lease.scratch_root)
    scratch_dir: str | None = None
    # a bad task row: skipped (reported with its id), or the job fails
    on_bad_task: str = field(default="skip", metadata={"choices": ("skip", "fail")})
    sandbox: dict = field(default_factory=dict)  # SandboxPolicy fields
    # hidden_tests: the task's hidden tests grade the final changes; first_call: 1.0 when the
    # session's first tool call names `reward_tool` (a reward random weights can learn to earn:
    # the RL example, conf/experiment/rl_loop.yaml)
    reward: str = field(default="hidden_tests", metadata={"choices": REWARDS})
    reward_tool: str = "run_tests"  # reward=first_call: the tool whose call, first, earns 1.0


class Episode(Protocol):
    """One session's view of a task: run its tool calls, score it, let it go. The project's
    sandboxed episodes and verifiers' (envs/vf/episode.py) are both."""

    def call(self, name: str, arguments: str | dict) -> ToolResult: ...

    def score(self) -> Score: ...

    def close(self) -> None: ...


class Environment(Protocol):
    """What a session needs of an environment: its tasks, the tools an agent gets, the first
    messages, and an episode per task. `SandboxEnvironment` (below) and verifiers'
    (envs/vf/environment.py) are both; `envs.load` returns the configured one."""

    tasks: dict[str, Any]
    tools: list[dict]

    def labels(self, task_id: str) -> tuple[str, str]: ...

    def prompt(self, task: Any) -> list[dict]: ...

    def episode(self, task_id: str) -> Episode: ...


class SandboxEpisode:
    """One session's view of a task: its own sandboxed workspace, scored afresh at the end."""

    def __init__(self, env: SandboxEnvironment, task: Task) -> None:
        self.env, self.task = env, task
        try:
            policy = replace(env.policy, mask=(*env.policy.mask, *task.repo.masked_paths()))
            start = env.trees.get(task.task_id, task.repo.materialize)
            self.workspace = Workspace(task.repo.materialize, root=env.scratch,
                                       prefix=f"{task.task_id}-", policy=policy, start=start)
        except OSError as exc:
            raise SandboxError(f"task {task.task_id}: sandbox could not start: {exc}") from None
        self.calls: list[str] = []  # the names of the calls run, in order
        self.toolbox = ToolBox(self.workspace, env.tools, env.cfg.tool_timeout_s,
                               env.cfg.max_output_chars,
                               task.repo.visible_test_argv(self.workspace.python()))

    def call(self, name: str, arguments: str | dict) -> ToolResult:
        self.calls.append(name)
        try:
            return self.toolbox.call(name, arguments)
        except SandboxFailure as exc:
            raise SandboxError(f"task {self.task.task_id}: sandbox failed: {exc}") from None

    def score(self) -> Score:
        if self.env.cfg.reward == "first_call":
            first = self.calls[0] if self.calls else ""
            return Score(1.0 if first == self.env.cfg.reward_tool else 0.0, 0, 0,
                         f"[first call: {first or 'none'}; rewarded: {self.env.cfg.reward_tool}]",
                         self.workspace.changes().diff)
        return score_changes(self.task, self.workspace.changes(), self.env.scratch,
                             self.env.cfg.score_timeout_s, self.env.policy,
                             self.env.cfg.max_output_chars)

    def close(self) -> None:
        self.workspace.close()

    def __enter__(self) -> SandboxEpisode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SandboxEnvironment:
    """The project's tasks, each episode in a sandboxed workspace of its own."""

    def __init__(self, cfg: EnvConfig) -> None:
        self.cfg = cfg
        self.scratch = scratch_root(cfg.scratch_dir)
        try:
            self.policy = SandboxPolicy(**cfg.sandbox)
        except (TypeError, ValueError) as exc:
            raise EnvError(f"env.sandbox: {exc}") from None
        # Start-up: the session folders, mounts and cgroups of dead processes go.
        sweep(self.scratch)
        self.trees = StartingTrees(self.scratch)
        self.tools = tool_schemas(cfg.max_command_chars, cfg.max_file_chars)
        names = [t["function"]["name"] for t in self.tools]
        if cfg.reward == "first_call" and cfg.reward_tool not in names:
            raise EnvError(f"env.reward_tool={cfg.reward_tool!r} is not a tool; tools: {names}")
        self.tasks = {t.task_id: t for t in self._select(load_suite(cfg))}
        if not self.tasks:
            raise EnvError(f"environment {cfg.name}: no usable tasks")

    def _select(self, tasks: list[Task]) -> list[Task]:
        tasks = sorted(tasks, key=lambda t: t.task_id)
        if self.cfg.task_ids is not None:
            known = {t.task_id for t in tasks}
            unknown = sorted(set(self.cfg.task_ids) - known)
            if unknown:
                raise EnvError(f"environment {self.cfg.name}: unknown task ids {unknown}")
            tasks = [t for t in tasks if t.task_id in set(self.cfg.task_ids)]
        return tasks[: self.cfg.max_tasks] if self.cfg.max_tasks else tasks

    def labels(self, task_id: str) -> tuple[str, str]:
        """(difficulty, category) of a task, for records and reports."""
        task = self.tasks[task_id]
        return task.difficulty, task.category

    def prompt(self, task: Task) -> list[dict]:
        return [{"role": "system", "content": self.cfg.system_prompt},
                {"role": "user", "content": task.statement}]

    def episode(self, task_id: str) -> SandboxEpisode:
        return SandboxEpisode(self, self.tasks[task_id])

    def score_diff(self, task_id: str, diff: str) -> Score:
        """Score recorded changes (a record's `final_diff`) as a session's end is scored: a
        fresh copy of the task, the diff applied with `git apply`, the hidden tests run."""
        return score_changes(self.tasks[task_id], Changes(diff), self.scratch,
                             self.cfg.score_timeout_s, self.policy, self.cfg.max_output_chars)

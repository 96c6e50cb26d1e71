"""Coding environments: tasks, tools, sandboxes and scoring. Knows nothing of serving."""

from __future__ import annotations

from typing import TYPE_CHECKING

from envs.environment import EnvConfig, Environment, Episode, SandboxError
from envs.scoring import Score
from envs.task import EnvError, Task, TaskRepo
from envs.tools import ToolResult

if TYPE_CHECKING:
    from envs.vf.environment import VerifiersEnvironment


def load(cfg: EnvConfig) -> Environment | VerifiersEnvironment:
    """The configured environment; a verifiers Taskset when `cfg.suite == "verifiers"`."""
    if cfg.suite == "verifiers":
        from envs.vf.environment import load_verifiers_env  # imports verifiers only when used

        return load_verifiers_env(cfg, cfg.taskset)
    return Environment(cfg)


__all__ = ["EnvConfig", "EnvError", "Environment", "Episode", "SandboxError", "Score", "Task",
           "TaskRepo", "ToolResult", "load"]

"""Coding environments: tasks, tools, sandboxes and scoring. Knows nothing of serving."""

from __future__ import annotations

from envs.environment import (
    EnvConfig,
    Environment,
    Episode,
    SandboxEnvironment,
    SandboxEpisode,
    SandboxError,
)
from envs.scoring import Score
from envs.task import EnvError, Task, TaskRepo
from envs.tools import ToolResult


def load(cfg: EnvConfig) -> Environment:
    """The configured environment; a verifiers Taskset when `cfg.suite == "verifiers"`."""
    if cfg.suite == "verifiers":
        from envs.vf.environment import load_verifiers_env  # imports verifiers only when used

        return load_verifiers_env(cfg, cfg.taskset)
    return SandboxEnvironment(cfg)


__all__ = ["EnvConfig", "EnvError", "Environment", "Episode", "SandboxEnvironment",
           "SandboxEpisode", "SandboxError", "Score", "Task", "TaskRepo", "ToolResult", "load"]

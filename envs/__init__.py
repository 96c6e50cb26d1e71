"""Coding environments: tasks, tools, sandboxes and scoring. Knows nothing of serving."""

from envs.environment import EnvConfig, Environment, Episode, SandboxError
from envs.scoring import Score
from envs.task import EnvError, Task, TaskRepo
from envs.tools import ToolResult


def load(cfg: EnvConfig) -> Environment:
    return Environment(cfg)


__all__ = ["EnvConfig", "EnvError", "Environment", "Episode", "SandboxError", "Score", "Task",
           "TaskRepo", "ToolResult", "load"]

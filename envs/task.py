"""A coding task: where its repository comes from, its statement, and how it is graded."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class EnvError(RuntimeError):
    """A problem with tasks or environments the user can act on; one line, names the task."""


@dataclass(frozen=True)
class Grade:
    tests_total: int
    tests_failed: int
    passed: bool


class TaskRepo(Protocol):
    """What a task suite must say about one task's repository and tests."""

    def materialize(self, dest: Path) -> None:
        """Write the starting repository into the empty folder `dest`."""

    def add_hidden_tests(self, dest: Path) -> None:
        """Install the hidden tests into a scoring copy (never the agent's copy)."""

    def hidden_test_argv(self, python: str) -> list[str]:
        """The command, run in the scoring copy, whose output `grade` reads."""

    def visible_test_argv(self, python: str) -> list[str]:
        """The command behind the agent's `run_tests` tool."""

    def grade(self, output: str, exit_code: int | None) -> Grade:
        """Read the hidden tests' output."""

    def reference_fix(self) -> dict[str, str]:
        """Relative path -> full new text of each file the reference solution changes."""

    def masked_paths(self) -> list[str]:
        """Host files the agent's sandbox must not read (they would give the fix away)."""


@dataclass(frozen=True)
class Task:
    task_id: str
    statement: str
    repo: TaskRepo
    difficulty: str = "unknown"
    suite: str = ""
    category: str = ""  # what reports group by beside difficulty: stdlib module, swebench repo


def warn_bad_task(exc: EnvError) -> None:
    """A bad task row is reported with its id and skipped (env.on_bad_task=skip)."""
    logging.getLogger("envs").warning("skipping bad task: %s", exc)

"""A coding task: a repository to start from, a problem statement, and hidden tests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class EnvError(RuntimeError):
    """A problem with tasks or environments the user can act on; one line, names the task."""


@dataclass(frozen=True)
class Task:
    task_id: str
    statement: str
    repo_dir: Path  # the starting repository (read-only; sessions work on copies)
    hidden_dir: Path  # hidden test files, copied in only at scoring time
    solution_dir: Path | None = None  # reference fix: files that overwrite the repo's
    difficulty: str = "unknown"

    def hidden_tests(self) -> list[Path]:
        return sorted(self.hidden_dir.glob("test_*.py"))


REQUIRED_KEYS = ("id", "statement")


def load_task_dir(path: Path) -> Task:
    """Read one task folder: task.json, repo/, hidden/ and optionally solution/."""
    meta_path = path / "task.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EnvError(f"task {path.name}: cannot read {meta_path}: {exc}") from None
    missing = [k for k in REQUIRED_KEYS if not meta.get(k)]
    if missing:
        raise EnvError(f"task {path.name}: task.json lacks {missing}")
    task = Task(task_id=meta["id"], statement=meta["statement"], repo_dir=path / "repo",
                hidden_dir=path / "hidden",
                solution_dir=(path / "solution") if (path / "solution").is_dir() else None,
                difficulty=meta.get("difficulty", "unknown"))
    if not task.repo_dir.is_dir():
        raise EnvError(f"task {task.task_id}: no repo/ folder in {path}")
    if not task.hidden_tests():
        raise EnvError(f"task {task.task_id}: no hidden tests (hidden/test_*.py) in {path}")
    return task

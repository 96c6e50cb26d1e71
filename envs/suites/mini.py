"""The mini suite: hand-written repositories, one folder per task.

A task folder holds `task.json` (id, statement, difficulty), `repo/` (the broken repository
with visible tests under `repo/tests/`), `hidden/test_*.py` and `solution/` (files of the fix).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from envs.task import EnvError, Grade, Task, warn_bad_task
from envs.unittest_output import parse_unittest

REQUIRED_KEYS = ("id", "statement")
HIDDEN = "_hidden_tests"
# The tests need the standard library only: -S skips site's .pth files (2 ms of a 39 ms test
# run in a sandbox here, 12 ms of a bare interpreter start in the project's venv).
UNITTEST = ("-S", "-m", "unittest", "discover", "-s")


@dataclass(frozen=True)
class MiniRepo:
    folder: Path

    def materialize(self, dest: Path) -> None:
        shutil.copytree(self.folder / "repo", dest, dirs_exist_ok=True, symlinks=True)

    def add_hidden_tests(self, dest: Path) -> None:
        hidden = dest / HIDDEN
        shutil.rmtree(hidden, ignore_errors=True)
        hidden.mkdir()
        for test in sorted((self.folder / "hidden").glob("test_*.py")):
            shutil.copy(test, hidden / test.name)

    def hidden_test_argv(self, python: str) -> list[str]:
        return [python, *UNITTEST, HIDDEN]

    def visible_test_argv(self, python: str) -> list[str]:
        return [python, *UNITTEST, "tests"]

    def grade(self, output: str, exit_code: int | None) -> Grade:
        """Every hidden test passes: none fails, and one at least ran and was not skipped (a
        fix whose module raises SkipTest on import skips them all)."""
        total, failed, skipped = parse_unittest(output)
        return Grade(total, failed, exit_code == 0 and failed == 0 and total > skipped)

    def masked_paths(self) -> list[str]:
        return []

    def reference_fix(self) -> dict[str, str]:
        root = self.folder / "solution"
        return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
                if p.is_file()}


def load_task_dir(path: Path) -> Task:
    meta_path = path / "task.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EnvError(f"task {path.name}: cannot read {meta_path}: {exc}") from None
    missing = [k for k in REQUIRED_KEYS if not meta.get(k)]
    if missing:
        raise EnvError(f"task {meta.get('id') or path.name}: task.json lacks {missing}")
    for part in ("repo", "hidden", "solution"):
        if not (path / part).is_dir():
            raise EnvError(f"task {meta['id']}: no {part}/ folder in {path}")
    if not list((path / "hidden").glob("test_*.py")):
        raise EnvError(f"task {meta['id']}: no hidden tests (hidden/test_*.py) in {path}")
    return Task(meta["id"], meta["statement"], MiniRepo(path), meta.get("difficulty", "unknown"),
                suite="mini")


def load_mini_suite(root: Path, on_bad_task: str) -> list[Task]:
    if not root.is_dir():
        raise EnvError(f"mini suite: task folder {root} does not exist")
    tasks = []
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            tasks.append(load_task_dir(path))
        except EnvError as exc:
            if on_bad_task == "fail":
                raise
            warn_bad_task(exc)
    return tasks

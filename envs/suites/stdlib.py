"""The stdlib suite: rows of envs.stdlib (AST mutants of installed standard-library modules).

The repository is the mutated module alone; with the repository first on the import path it
shadows the installed module, so the standard library's own test module exercises the bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envs.stdlib import BUILTIN, Row, load_rows, materialize, parse_details, reference_fix
from envs.stdlib import test_command as stdlib_test_command
from envs.stdlib.source import stdlib_dir
from envs.task import Grade, Task


@dataclass(frozen=True)
class StdlibRepo:
    row: Row

    def materialize(self, dest: Path) -> None:
        materialize(self.row, dest)

    def add_hidden_tests(self, dest: Path) -> None:
        """The hidden tests are the installed `test` package's: nothing to copy."""

    def hidden_test_argv(self, python: str) -> list[str]:
        return stdlib_test_command(self.row.hidden_tests, python, details=True)

    def visible_test_argv(self, python: str) -> list[str]:
        return stdlib_test_command([self.row.test_module], python)

    def grade(self, output: str, exit_code: int | None) -> Grade:
        """Every hidden test must pass, except those the sandbox skips (no extended attributes
        on its tmpfs, no network interfaces): a test that cannot run cannot fail a fix."""
        wanted = self.row.hidden_tests
        details = parse_details(output)
        if details is None:  # crashed, hung or printed no verdict: the fix is not right
            return Grade(len(wanted), len(wanted), False)
        outcomes = [details.get(t, {}).get("outcome", "missing") for t in wanted]
        failed = sum(o not in ("pass", "skip") for o in outcomes)
        return Grade(len(wanted), failed, failed == 0 and "pass" in outcomes)

    def masked_paths(self) -> list[str]:
        """The installed, unbroken module and its bytecode: copying them would be the fix."""
        source = stdlib_dir() / self.row.path
        cached = source.parent / "__pycache__"
        return [str(source), *map(str, sorted(cached.glob(f"{source.stem}.*.pyc")))]

    def reference_fix(self) -> dict[str, str]:
        path, text = reference_fix(self.row)
        return {path: text}


def load_stdlib_suite(path: Path | None, on_bad_task: str) -> list[Task]:
    rows = load_rows(path or BUILTIN, on_bad=on_bad_task)
    return [Task(r.task_id, r.statement, StdlibRepo(r), r.difficulty, suite="stdlib",
                 category=r.module)
            for r in rows]

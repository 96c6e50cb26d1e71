"""Running a task's unittest ids in its repository, and reading the verdict back."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

RUNNER = Path(__file__).with_name("runner.py").read_text()
DETAILS, SUMMARY = "@@stdlib-details@@", "@@stdlib-summary@@"  # as printed by runner.py


@dataclass(frozen=True)
class TestSummary:
    __test__ = False  # not a pytest test class, despite the name

    tests: int  # tests that ran
    passed: int
    not_passed: tuple[str, ...]  # failed, skipped or never run (the first 10 ids)
    n_not_passed: int

    @property
    def ok(self) -> bool:
        return self.n_not_passed == 0 and self.passed > 0


def test_command(test_ids: Sequence[str], python: str = sys.executable,
                 details: bool = False) -> list[str]:
    """argv that runs `test_ids` (unittest ids or test module names). Run it with the task's
    repository as the working directory: that is what puts the mutant first on sys.path.
    The last line of stdout is the summary; `details` adds one line of per-test outcomes."""
    return [python, "-B", "-c", RUNNER, *(["--details"] if details else []), *test_ids]


def _last(output: str, marker: str) -> object | None:
    for line in reversed(output.splitlines()):
        if line.startswith(marker + " "):
            try:
                return ast.literal_eval(line[len(marker) + 1:])
            except (ValueError, SyntaxError):
                return None
    return None


def parse_summary(output: str) -> TestSummary | None:
    """The runner's verdict, or None when it never printed one (crash, timeout, cut output)."""
    obj = _last(output, SUMMARY)
    if not isinstance(obj, dict):
        return None
    return TestSummary(tests=obj["tests"], passed=obj["passed"],
                       not_passed=tuple(obj["not_passed"]), n_not_passed=obj["n_not_passed"])


def parse_details(output: str) -> dict[str, dict] | None:
    """Per-test outcomes ({"outcome": pass|fail|skip, and for failures error/where/doc})."""
    obj = _last(output, DETAILS)
    return obj if isinstance(obj, dict) else None


@dataclass(frozen=True)
class RunResult:
    summary: TestSummary | None
    details: dict[str, dict] | None
    timed_out: bool
    seconds: float


def run_tests(repo: Path, test_ids: Sequence[str], timeout_s: float,
              python: str = sys.executable, details: bool = True,
              tmp_dir: Path | None = None) -> RunResult:
    """Run in `repo` with a wall-clock limit; a run that hangs is killed with its children.
    Other PYTHON* variables are dropped so that only `repo` can shadow the stdlib; `tmp_dir`
    becomes TMPDIR, which keeps parallel runs of suites that use fixed temp paths apart."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = "0"  # set and dict orders show up in failure messages
    if tmp_dir is not None:
        env["TMPDIR"] = str(tmp_dir)
    start = time.monotonic()
    proc = subprocess.Popen(test_command(test_ids, python, details), cwd=repo,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True, text=True,
                            errors="replace", env=env)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        return RunResult(None, None, True, time.monotonic() - start)
    return RunResult(parse_summary(out), parse_details(out), False, time.monotonic() - start)

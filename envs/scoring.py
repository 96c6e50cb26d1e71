"""Scoring: hidden tests run in a fresh copy of the final repository, never in the agent's."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from envs.task import Task
from envs.workspace import Workspace


@dataclass(frozen=True)
class Score:
    reward: float
    tests_total: int
    tests_failed: int
    output: str
    infra_error: str | None = None  # set when the harness itself failed: not a reward of 0


def score_repo(task: Task, repo: Path, scratch: Path, timeout_s: float,
               max_output: int = 4000) -> Score:
    """Copy `repo` afresh, add the hidden tests, run them; reward 1.0 iff all pass."""
    ws = Workspace(repo, root=scratch, prefix=f"score-{task.task_id}-")
    try:
        hidden = ws.path / "_hidden_tests"
        shutil.rmtree(hidden, ignore_errors=True)
        hidden.mkdir()
        for test in task.hidden_tests():
            shutil.copy(test, hidden / test.name)
        res = ws.run([ws.python(), "-m", "unittest", "discover", "-s", "_hidden_tests"],
                     timeout_s, max_output)
    except OSError as exc:
        return Score(0.0, 0, 0, "", infra_error=f"scoring sandbox failed: {exc}")
    finally:
        ws.close()
    if res.timed_out:  # the agent's code may loop forever: that is a failing solution
        return Score(0.0, 0, 0, res.output + "\n[hidden tests timed out]")
    total, failed = parse_unittest(res.output)
    passed = res.exit_code == 0 and total > 0 and failed == 0
    return Score(1.0 if passed else 0.0, total, failed if total else 0, res.output)


def parse_unittest(output: str) -> tuple[int, int]:
    """(tests run, tests failed or errored) from unittest's summary lines."""
    ran = re.search(r"^Ran (\d+) tests?", output, re.M)
    total = int(ran.group(1)) if ran else 0
    failed = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", output))
    return total, failed

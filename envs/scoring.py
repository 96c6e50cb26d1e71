"""Scoring: the hidden tests run in a FRESH sandbox on the session's changes, never in its own."""

from __future__ import annotations

import errno
from dataclasses import dataclass, replace
from pathlib import Path

from envs.sandbox import SandboxPolicy
from envs.task import Task
from envs.workspace import Changes, Workspace, truncate

GRADE_OUTPUT = 4_000_000  # characters of the hidden tests' report kept for grading


@dataclass(frozen=True)
class Score:
    reward: float
    tests_total: int
    tests_failed: int
    output: str
    diff: str = ""
    infra_error: str | None = None  # the harness itself failed: retried, never a reward of 0


def score_changes(task: Task, changes: Changes, scratch: Path | None, timeout_s: float,
                  policy: SandboxPolicy, max_output: int = 4000) -> Score:
    """Materialize the task afresh, apply `changes`, add the hidden tests, run them. Changes
    too large to keep, or to fit the disk quota with the hidden tests, fail the agent, with the
    reason as the score's output."""
    if changes.refused:
        return Score(0.0, 0, 0, f"[changes not scored: {changes.refused}]")

    def populate(dest: Path) -> None:
        task.repo.materialize(dest)
        changes.apply(dest)
        task.repo.add_hidden_tests(dest)

    try:  # one command: a sandbox of its own, never a session's exec server
        ws = Workspace(populate, root=scratch, prefix=f"score-{task.task_id}-",
                       policy=replace(policy, persistent=False), history=False)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:  # the agent's files had taken the room
            return Score(0.0, 0, 0, "[changes not scored: with the hidden tests they are over "
                         "the session's disk quota (sandbox disk_mb)]", changes.diff)
        return Score(0.0, 0, 0, "", changes.diff, infra_error=f"scoring sandbox failed: {exc}")
    try:  # graded on the whole report (up to GRADE_OUTPUT), stored cut to max_output
        res = ws.run(task.repo.hidden_test_argv(ws.python()), timeout_s, GRADE_OUTPUT)
    except OSError as exc:
        return Score(0.0, 0, 0, "", changes.diff, infra_error=f"hidden tests did not run: {exc}")
    finally:
        ws.close()
    shown = truncate(res.output, max_output)
    if res.timed_out:  # the agent's code may loop forever: that is a failing solution
        return Score(0.0, 0, 0, shown + "\n[hidden tests timed out]", changes.diff)
    grade = task.repo.grade(res.output, res.exit_code)
    return Score(1.0 if grade.passed else 0.0, grade.tests_total, grade.tests_failed, shown,
                 changes.diff)

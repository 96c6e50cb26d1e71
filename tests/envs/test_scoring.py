"""Scoring (envs/scoring.py) over every way a scoring run can end, the sandbox faked."""

import errno
import itertools
from dataclasses import dataclass
from unittest import mock

import pytest

from envs.sandbox import SandboxPolicy
from envs.scoring import score_changes
from envs.task import Grade, Task
from envs.workspace import Changes

_STARTS = {"ok": None, "quota": OSError(errno.ENOSPC, "No space left on device"),
           "broken": OSError("bwrap: cannot mount /proc")}


@dataclass
class _Repo:
    passed: bool

    def materialize(self, dest):
        pass

    def add_hidden_tests(self, dest):
        pass

    def hidden_test_argv(self, python):
        return [python, "-m", "unittest"]

    def grade(self, output, exit_code):
        return Grade(3, 0, self.passed)  # none failed, yet not passed: all skipped, say


@dataclass
class _Result:
    output: str
    exit_code: int | None
    timed_out: bool


@pytest.mark.parametrize(("refused", "start", "runs", "timed_out", "passed"), list(
    itertools.product([False, True], _STARTS, [True, False], [False, True], [False, True])))
def test_every_scoring_ending_gets_the_reward_its_cause_deserves(refused, start, runs,
                                                                 timed_out, passed):
    """Every combination, each by the documented rule: refused changes, a fix over the disk
    quota and hidden tests that time out fail the agent (0); a harness that fails (the
    sandbox, the run) is an infra_error, retried, its reward never read as the agent's; else
    1 iff the grade passed. A scoring sandbox made is closed whatever happened."""
    made = []

    class Workspace:
        def __init__(self, populate, **kwargs):
            if _STARTS[start] is not None:
                raise _STARTS[start]
            assert kwargs["policy"].persistent is False  # a sandbox per command, never reused
            made.append(self)
            self.closed = False

        def python(self):
            return "python"

        def run(self, argv, timeout_s, max_output):
            if not runs:
                raise OSError("exec failed")
            return _Result("Ran 3 tests", None if timed_out else 0, timed_out)

        def close(self):
            self.closed = True

    changes = Changes("diff", refused="too large" if refused else None)
    with mock.patch("envs.scoring.Workspace", Workspace):
        score = score_changes(Task("t", "fix it", _Repo(passed)), changes, None, 5.0,
                              SandboxPolicy(persistent=True))
    infra = not refused and (start == "broken" or start == "ok" and not runs)
    agent_wins = not refused and start == "ok" and runs and not timed_out and passed
    assert (score.infra_error is not None) == infra
    assert score.reward == (1.0 if agent_wins else 0.0)
    assert all(ws.closed for ws in made) and len(made) == (not refused and start == "ok")
    if agent_wins or not refused and start == "ok" and runs and not timed_out:
        assert (score.tests_total, score.tests_failed) == (3, 0)

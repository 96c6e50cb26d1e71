"""Scoring (envs/scoring.py) over every way a scoring run can end, the sandbox faked."""

import errno
import itertools
from dataclasses import dataclass, replace
from unittest import mock

import pytest

from envs.sandbox import SandboxPolicy
from envs.scoring import GRADE_OUTPUT, Score, score_changes
from envs.task import Grade, Task
from envs.workspace import Changes, truncate

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


@dataclass
class _Steps:
    """A repository and changes that record what scoring did with them."""

    log: list

    def materialize(self, dest):
        self.log.append(("materialize", dest))

    def apply(self, dest):
        self.log.append(("apply", dest))

    def add_hidden_tests(self, dest):
        self.log.append(("hidden tests", dest))

    def hidden_test_argv(self, python):
        return [python, "-m", "hidden"]

    def grade(self, output, exit_code):
        self.log.append(("grade", len(output), exit_code))
        return Grade(5, 2, False)


@pytest.mark.parametrize("ending", ["refused", "quota", "broken", "no run", "timed out",
                                    "graded"])
def test_a_score_keeps_the_diff_the_counts_and_the_reason_of_its_ending(ending, tmp_path):
    """What a record shows of each ending; the sandbox is the session's policy run per
    command, filled with the task's tree, the changes, then the hidden tests; the grade reads
    the whole report, the score keeps it cut to max_output."""
    log, output = [], "x" * 5000
    steps = _Steps(log)
    changes = mock.Mock(diff="the diff", refused="too large" if ending == "refused" else None,
                        apply=steps.apply)
    policy = SandboxPolicy(persistent=True, disk_mb=7)

    class Workspace:
        def __init__(self, populate, root, prefix, policy, history):
            log.append(("sandbox", root, prefix, policy, history))
            if ending in ("quota", "broken"):
                raise _STARTS["quota" if ending == "quota" else "broken"]
            populate(tmp_path)

        def python(self):
            return "py"

        def run(self, argv, timeout_s, max_output):
            log.append(("run", argv, timeout_s, max_output))
            if ending == "no run":
                raise OSError("exec failed")
            return _Result(output, None if ending == "timed out" else 1, ending == "timed out")

        def close(self):
            log.append(("closed",))

    with mock.patch("envs.scoring.Workspace", Workspace):
        score = score_changes(Task("t7", "fix it", steps), changes, tmp_path / "scratch", 9.0,
                              policy, max_output=100)
    shown = truncate(output, 100)
    assert score == {
        "refused": Score(0.0, 0, 0, "[changes not scored: too large]"),
        "quota": Score(0.0, 0, 0, "[changes not scored: with the hidden tests they are over "
                       "the session's disk quota (sandbox disk_mb)]", "the diff"),
        "broken": Score(0.0, 0, 0, "", "the diff",
                        infra_error="scoring sandbox failed: bwrap: cannot mount /proc"),
        "no run": Score(0.0, 0, 0, "", "the diff",
                        infra_error="hidden tests did not run: exec failed"),
        "timed out": Score(0.0, 0, 0, shown + "\n[hidden tests timed out]", "the diff"),
        "graded": Score(0.0, 5, 2, shown, "the diff")}[ending]
    if ending == "refused":
        return
    sandbox = ("sandbox", tmp_path / "scratch", "score-t7-", replace(policy, persistent=False),
               False)
    populated = [("materialize", tmp_path), ("apply", tmp_path), ("hidden tests", tmp_path)]
    ran = ("run", ["py", "-m", "hidden"], 9.0, GRADE_OUTPUT)
    assert log == {"quota": [sandbox], "broken": [sandbox],
                   "no run": [sandbox, *populated, ran, ("closed",)],
                   "timed out": [sandbox, *populated, ran, ("closed",)],
                   "graded": [sandbox, *populated, ran, ("closed",), ("grade", 5000, 1)]
                   }[ending]

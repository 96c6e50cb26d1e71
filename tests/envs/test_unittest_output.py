"""unittest's report as the graders read it, over generated outcome sets run by unittest itself."""

import io
import types
import unittest

from hypothesis import given, settings
from hypothesis import strategies as st

from envs.suites.mini import MiniRepo
from envs.task import Grade
from envs.unittest_output import parse_unittest


def _subtests_fail(self):
    for i in range(2):
        with self.subTest(i=i):
            self.fail("one of two")


_BODIES = {
    "pass": lambda self: None,
    "fail": lambda self: self.fail("no"),
    "error": lambda self: 1 / 0,
    "skip": lambda self: self.skipTest("cannot run here"),
    "xfail": unittest.expectedFailure(lambda self: self.fail("known")),
    "xpass": unittest.expectedFailure(lambda self: None),
    "subtests_fail": _subtests_fail,
}
FAILING = {"fail", "error", "xpass", "subtests_fail"}  # unittest's verdict: FAILED
PASSING = {"pass", "xfail"}  # an expected failure is a pass, as the stdlib runner counts it


def _run(outcomes: list[str]) -> tuple[str, int]:
    """The report and exit status of `python -m unittest` over one test per outcome."""
    module = types.ModuleType("hidden")
    module.Hidden = type("Hidden", (unittest.TestCase,), {
        f"test_{i}_{o}": _BODIES[o] for i, o in enumerate(outcomes)})
    module.Hidden.__module__ = "hidden"
    report = io.StringIO()
    try:
        unittest.main(module=module, argv=["hidden"], testRunner=unittest.TextTestRunner(report))
    except SystemExit as exit_:
        return report.getvalue(), int(exit_.code)
    raise AssertionError("unittest.main returned")


@settings(max_examples=200)
@given(outcomes=st.lists(st.sampled_from(sorted(_BODIES)), max_size=6))
def test_the_report_gives_tests_run_and_tests_failed(outcomes):
    """A record's tests_total / tests_failed count tests: a test with two failing subtests is
    one failed test, an expected failure is none, an unexpected success is one (unittest
    fails the run for it), so failed never exceeds run; skips are counted for the grade."""
    output, _ = _run(outcomes)
    assert parse_unittest(output) == (len(outcomes), sum(o in FAILING for o in outcomes),
                                      outcomes.count("skip"))


@settings(max_examples=200)
@given(outcomes=st.lists(st.sampled_from(sorted(_BODIES)), max_size=6))
def test_a_mini_task_passes_iff_no_hidden_test_fails_and_one_passes(outcomes, tmp_path_factory):
    """Reward 1 iff every hidden test passes (docs/record-format.md): none fails, and a
    skipped test cannot pass a fix, so all skipped (or none run) is 0, never a free 1."""
    output, status = _run(outcomes)
    grade = MiniRepo(tmp_path_factory.getbasetemp()).grade(output, status)
    assert grade.passed == (not FAILING & set(outcomes) and bool(PASSING & set(outcomes)))


def test_output_with_no_report_ran_no_test_and_passes_nothing(tmp_path):
    """A run that died before unittest reported (a crash at import, a killed interpreter)."""
    crashed = "Traceback (most recent call last):\n  File \"x.py\"\nImportError: no module\n"
    assert parse_unittest(crashed) == parse_unittest("") == (0, 0, 0)
    assert not MiniRepo(tmp_path).grade("", 0).passed
    report = "FAIL: test_a (t.T.test_a)\n---\nRan 3 tests in 0.01s\n\nFAILED (failures=1)\n"
    assert MiniRepo(tmp_path).grade(report, 1) == Grade(3, 1, False)

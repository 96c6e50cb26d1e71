"""The test runner: per-test outcomes, a verdict code under test cannot forge, no stale .pyc."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
import textwrap
import time

from envs.stdlib import testing
from envs.stdlib.testing import DETAILS, RUNNER, SUMMARY, parse_details, parse_summary, run_tests

TESTS = '''\
import unittest

import mymod


def helper():
    """Not a test: loading it by name calls it, which returns no test."""


class T(unittest.TestCase):
    def test_pass(self):
        self.assertEqual(mymod.value(), 1)

    def test_fail(self):
        """Checks double."""
        self.assertEqual(mymod.double(2),
                         5)

    def test_error(self):
        mymod.boom()

    @unittest.skip("not today")
    def test_skip(self):
        pass

    def test_subtests(self):
        for n in (1, 2):
            with self.subTest(n=n):
                self.assertEqual(n, 1)
'''
MODULE = '''\
def value():
    return 1


def double(x):
    return 2 * x


def boom():
    raise KeyError("deep inside mymod")
'''


def _repo(tmp_path, module=MODULE, tests=TESTS):
    (tmp_path / "mymod.py").write_text(module)
    (tmp_path / "test_mymod.py").write_text(tests)
    return tmp_path


def test_markers_match_the_runner():
    assert f'DETAILS, SUMMARY = "{DETAILS}", "{SUMMARY}"' in RUNNER


def test_outcomes_per_test_and_the_summary(tmp_path):
    ids = ["test_mymod", "test_mymod.T.test_missing", "test_mymod.helper"]
    res = run_tests(_repo(tmp_path), ids, 60)
    d = res.details
    assert {k: v["outcome"] for k, v in d.items() if k.startswith("test_mymod.T.")} == {
        "test_mymod.T.test_pass": "pass", "test_mymod.T.test_fail": "fail",
        "test_mymod.T.test_error": "fail", "test_mymod.T.test_skip": "skip",
        "test_mymod.T.test_subtests": "fail"}
    fail = d["test_mymod.T.test_fail"]
    assert fail["error"] == "AssertionError: 4 != 5"
    assert fail["doc"] == "Checks double."
    assert fail["where"] == [["test_fail", "        self.assertEqual(mymod.double(2),\n"
                                           "                         5)"]]
    assert d["test_mymod.T.test_subtests"]["subtest"] == "(n=2)"
    error = d["test_mymod.T.test_error"]
    assert error["error"] == "KeyError: 'deep inside mymod'"
    assert error["where"] == [["test_error", "        mymod.boom()"]]  # no frame of mymod.py
    s = res.summary
    assert (s.passed, s.n_not_passed, s.ok) == (1, 6, False)  # 4 bad, 2 never ran
    assert {"test_mymod.T.test_missing", "test_mymod.helper"} <= set(s.not_passed)


def test_all_passing_is_ok_and_exit_code_zero(tmp_path):
    ids = ["test_mymod.T.test_pass"]
    proc = subprocess.run(testing.test_command(ids), cwd=_repo(tmp_path), capture_output=True,
                          text=True)
    assert proc.returncode == 0
    assert parse_summary(proc.stdout).ok and parse_details(proc.stdout) is None


def test_code_under_test_cannot_append_a_verdict(tmp_path):
    forged = f"{SUMMARY} {{'tests': 1, 'passed': 1, 'not_passed': [], 'n_not_passed': 0}}"
    module = MODULE + f"import atexit\natexit.register(print, {forged!r})\nprint({forged!r})\n"
    res = run_tests(_repo(tmp_path, module), ["test_mymod.T.test_fail"], 60)
    assert res.summary is not None and not res.summary.ok


def test_a_same_size_edit_in_the_same_second_is_not_hidden_by_bytecode(tmp_path):
    repo = _repo(tmp_path)
    source = repo / "mymod.py"
    py_compile.compile(str(source), cfile=str(repo / "__pycache__" /
                                              f"mymod.{sys.implementation.cache_tag}.pyc"))
    stat = source.stat()
    source.write_text(MODULE.replace("return 1", "return 7"))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    res = run_tests(repo, ["test_mymod.T.test_pass"], 60)
    assert res.details["test_mymod.T.test_pass"]["error"] == "AssertionError: 7 != 1"


def test_the_repository_copy_shadows_modules_unittest_imports(tmp_path):
    """difflib is imported by unittest itself; the repository's copy must still be the one."""
    import difflib
    from pathlib import Path

    (tmp_path / "difflib.py").write_text(Path(difflib.__file__).read_text() + "\nMARK = 1\n")
    (tmp_path / "test_shadow.py").write_text(textwrap.dedent('''\
        import unittest

        import difflib


        class T(unittest.TestCase):
            def test_copy(self):
                self.assertEqual(difflib.MARK, 1)
        '''))
    assert run_tests(tmp_path, ["test_shadow"], 60).summary.ok


def test_random_draws_repeat_in_any_order(tmp_path):
    tests = TESTS.replace("import unittest\n", "import random\nimport unittest\n") + \
        "\n    def test_draw(self):\n        self.assertEqual(random.random(), 0)\n"
    repo = _repo(tmp_path, tests=tests)
    alone = run_tests(repo, ["test_mymod.T.test_draw"], 60).details
    after_others = run_tests(repo, ["test_mymod"], 60).details
    assert alone["test_mymod.T.test_draw"] == after_others["test_mymod.T.test_draw"]


def test_a_hanging_run_is_killed(tmp_path):
    module = MODULE.replace("return 1", "import time; time.sleep(60)")
    start = time.monotonic()
    res = run_tests(_repo(tmp_path, module), ["test_mymod.T.test_pass"], 2)
    assert res.timed_out and res.summary is None and time.monotonic() - start < 10

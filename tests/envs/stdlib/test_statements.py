"""Statements come from failing behaviour only; difficulty follows its documented rule."""

from __future__ import annotations

from envs.stdlib.difficulty import difficulty
from envs.stdlib.statements import clean, write_statement

FAILURES = {
    "test.test_textwrap.WrapTestCase.test_simple": {
        "outcome": "fail", "error": "AssertionError: Lists differ: ['a'] != ['a b']",
        "where": [["test_simple", "    self.check_wrap(text, 10, expect)"],
                  ["check_wrap", "        self.assertEqual(wrap(text, width), expect)"]],
        "doc": "Simple case.", "subtest": None},
    "test.test_textwrap.IndentTestCase.test_indent": {
        "outcome": "fail", "error": "TypeError: bad operand", "where": [], "doc": None,
        "subtest": "(width=3)"},
    "test.test_textwrap.IndentTestCase.test_other": {"error": "AssertionError: "},
}


def test_statement_names_the_api_symptom_and_tests():
    text = write_statement("textwrap", "test.test_textwrap", FAILURES, {"wrap", "fill"})
    lead = text.splitlines()[0]
    assert lead == ("In the `textwrap` module, calls such as `wrap()` raise TypeError: "
                    "3 tests in `test.test_textwrap` fail.")
    assert "`WrapTestCase.test_simple` (Simple case.):" in text
    assert "# in check_wrap\nself.assertEqual(wrap(text, width), expect)" in text
    assert "AssertionError: Lists differ" in text
    assert "Also failing: `IndentTestCase.test_other`." in text
    assert text.endswith("fix `textwrap.py` so that they pass again.")


def test_one_wrong_value_reads_as_wrong_results():
    one = {k: v for k, v in FAILURES.items() if "simple" in k}
    lead = write_statement("textwrap", "test.test_textwrap", one, set()).splitlines()[0]
    assert lead == ("In the `textwrap` module, some of its functions give wrong results: "
                    "a test in `test.test_textwrap` fails.")


def test_clean_removes_run_specific_text():
    text = "at 0x7f3a2b1c9d00 in /scratch/ab12/repo/x.py, [388 chars], /scratch/ab12/tmp/d"
    assert clean(text, {"/scratch/ab12/repo": ".", "/scratch/ab12/tmp": "/tmp"}) == \
        "at 0x... in ./x.py, [...], /tmp/d"


def test_difficulty_rule():
    wrong = {"error": "AssertionError: 1 != 2"}
    crash = {"error": "TypeError: nope"}
    assert difficulty("flip_comparison", {"a": wrong}) == "hard"  # 2 + 1 + 1
    assert difficulty("swap_arguments", {"a": wrong}) == "hard"  # 2 + 1
    assert difficulty("swap_arguments", {"a": crash}) == "medium"  # 2
    assert difficulty("off_by_one", {k: crash for k in "abc"}) == "medium"  # 1 + 1
    assert difficulty("swap_boolean", {k: crash for k in "abcdef"}) == "easy"  # 0
    assert difficulty("drop_statement", {k: wrong for k in "abcdef"}) == "medium"  # 0 + 1 + 1

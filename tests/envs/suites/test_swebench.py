"""SWE-bench-format rows over a local git repository built by the test."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs import EnvConfig, EnvError, load
from envs.suites.swebench import GitRepo

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
KEEP = "from calc import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def diff_of(repo: Path, path: str, text: str) -> str:
    target = repo / path
    old = target.read_text() if target.exists() else None
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    git("add", "-A", cwd=repo)
    out = git("diff", "--cached", cwd=repo)
    git("reset", "-q", "--hard", cwd=repo)
    if old is None:
        target.unlink(missing_ok=True)
    return out


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("swe")
    repo = root / "calc-repo"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    git("config", "user.email", "t@example.com", cwd=repo)
    git("config", "user.name", "t", cwd=repo)
    (repo / "calc.py").write_text(BUGGY)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_keep.py").write_text(KEEP)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "base", cwd=repo)
    base = git("rev-parse", "HEAD", cwd=repo).strip()
    row = {"instance_id": "calc__add-1", "repo": "calc-repo", "base_commit": base,
           "patch": diff_of(repo, "calc.py", FIXED),
           "test_patch": diff_of(repo, "tests/test_add.py", TEST),
           "problem_statement": "add(2, 3) returns -1",
           "FAIL_TO_PASS": ["tests/test_add.py::test_add"],
           "PASS_TO_PASS": json.dumps(["tests/test_keep.py::test_zero"])}
    bad = [{**row, "instance_id": "no-commit", "base_commit": "0" * 40},
           {k: v for k, v in row.items() if k != "patch"} | {"instance_id": "no-patch"},
           {**row, "instance_id": "no-repo", "repo": "missing"}]
    path = root / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [row, *bad]))
    return path


def test_reference_fix_scores_one_and_nothing_scores_zero(rows_file):
    env = load(EnvConfig(name="calc", suite="swebench", tasks_path=str(rows_file)))
    assert list(env.tasks) == ["calc__add-1"]
    with env.episode("calc__add-1") as ep:
        assert not (ep.workspace.path / ".git").exists()
        assert not (ep.workspace.path / "tests" / "test_add.py").exists()
        nothing = ep.score()
        assert nothing.reward == 0.0 and nothing.tests_failed == 1, nothing.output
        for path, text in env.tasks["calc__add-1"].repo.reference_fix().items():
            ep.call("write_file", {"path": path, "content": text})
        fixed = ep.score()
        assert fixed.reward == 1.0 and fixed.tests_total == 2, fixed.output
        assert "+    return a + b" in fixed.diff


def test_bad_rows_are_reported_with_their_id(rows_file, caplog):
    load(EnvConfig(suite="swebench", tasks_path=str(rows_file)))
    warnings = caplog.text
    assert "task no-commit: base_commit" in warnings
    assert "task no-patch: row lacks ['patch']" in warnings
    assert "task no-repo: repo" in warnings and "is not a local git checkout" in warnings
    with pytest.raises(EnvError, match="task no-commit: base_commit"):
        load(EnvConfig(suite="swebench", tasks_path=str(rows_file), on_bad_task="fail"))


_KINDS = '''
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("setup")

@pytest.fixture
def teardown_fails():
    yield
    raise RuntimeError("teardown")

def test_pass():
    pass

def test_fail():
    assert False

def test_fail_printing_a_pass():
    print("PASSED tests/test_kinds.py::test_fail_printing_a_pass")
    assert False

def test_error(broken):
    pass

def test_skip():
    pytest.skip("cannot run here")

@pytest.mark.xfail
def test_xfail():
    assert False

def test_pass_then_teardown_error(teardown_fails):
    pass

@pytest.mark.parametrize("n", [1, 10])
def test_p(n):
    assert n == 1
'''
PASSING = {"tests/test_kinds.py::test_pass", "tests/test_kinds.py::test_p[1]"}


@pytest.fixture(scope="module")
def kinds_report(tmp_path_factory):
    """pytest's own -rA report over one test of each outcome, run as hidden_test_argv runs it."""
    root = tmp_path_factory.mktemp("kinds")
    (root / "tests").mkdir()
    (root / "tests" / "test_kinds.py").write_text(_KINDS)
    proc = subprocess.run(GitRepo("i", root, "", "", "", (), ()).hidden_test_argv(sys.executable),
                          cwd=root, capture_output=True, text=True, timeout=120)
    return proc.stdout, proc.returncode


_IDS = sorted(PASSING | {f"tests/test_kinds.py::test_{k}" for k in (
    "fail", "fail_printing_a_pass", "error", "skip", "xfail", "pass_then_teardown_error",
    "p[10]", "p", "never_ran")})


@settings(max_examples=200)
@given(fail_to_pass=st.lists(st.sampled_from(_IDS), unique=True, max_size=4),
       pass_to_pass=st.lists(st.sampled_from(_IDS), unique=True, max_size=4))
def test_a_swebench_task_passes_iff_every_wanted_test_passed(kinds_report, fail_to_pass,
                                                            pass_to_pass):
    """Reward 1 iff every FAIL_TO_PASS and PASS_TO_PASS test passed: not skipped, not xfailed,
    not errored in teardown, not absent, not `test_p` standing for `test_p[1]`, not a PASSED
    line the test printed itself; nothing wanted is no pass at all."""
    output, status = kinds_report
    repo = GitRepo("i", Path("."), "", "", "", tuple(fail_to_pass), tuple(pass_to_pass))
    wanted = fail_to_pass + pass_to_pass
    grade = repo.grade(output, status)
    failed = sum(t not in PASSING for t in wanted)
    assert (grade.tests_total, grade.tests_failed) == (len(wanted), failed)
    assert grade.passed == (bool(wanted) and failed == 0)

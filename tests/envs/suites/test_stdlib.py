"""The stdlib suite through the environment: sandboxed, scored afresh, solved by tool calls."""

import collections
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs import EnvConfig, EnvError, load
from envs.solver import reference_calls
from envs.stdlib.testing import DETAILS
from envs.suites.stdlib import StdlibRepo
from envs.task import Grade

ENV = load(EnvConfig(name="stdlib", suite="stdlib"))


def test_builtin_suite_size_and_spread():
    """The README's figures: 264 tasks across 44 modules, 114 easy, 75 medium, 75 hard."""
    modules = {t.split(".")[0] for t in ENV.tasks}
    assert (len(ENV.tasks), len(modules)) == (264, 44)
    spread = collections.Counter(t.difficulty for t in ENV.tasks.values())
    assert spread == {"easy": 114, "medium": 75, "hard": 75}


@pytest.mark.parametrize("task_id", random.Random(7).sample(sorted(ENV.tasks), 6))
def test_nothing_scores_zero_and_the_reference_solver_one(task_id):
    with ENV.episode(task_id) as ep:
        assert ep.score().reward == 0.0
        calls = reference_calls(ep)
        assert [name for name, _ in calls] == ["str_replace", "submit"]
        for name, args in calls:
            result = ep.call(name, args)
            assert result.ok and not result.failed, result.output
        assert ep.score().reward == 1.0


def test_a_stale_row_is_named_and_skipped(tmp_path, caplog):
    good = ENV.tasks[sorted(ENV.tasks)[0]].repo.row.to_json()
    stale = {**good, "task_id": "stale.1", "source_sha256": "0" * 64}
    missing = {k: v for k, v in good.items() if k != "statement"} | {"task_id": "nostatement.1"}
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (good, stale, missing)))
    env = load(EnvConfig(name="s", suite="stdlib", tasks_path=str(path)))
    assert list(env.tasks) == [good["task_id"]]
    assert "task stale.1" in caplog.text and "task nostatement.1" in caplog.text
    with pytest.raises(EnvError, match="task stale.1"):
        load(EnvConfig(name="s", suite="stdlib", tasks_path=str(path), on_bad_task="fail"))


def test_the_unbroken_module_is_masked_in_the_agents_sandbox():
    """Copying the installed module would be the fix: inside the sandbox it cannot be read."""
    task_id = sorted(ENV.tasks)[0]
    installed = ENV.tasks[task_id].repo.masked_paths()[0]
    first_line = Path(installed).read_text().splitlines()[0].strip()
    with ENV.episode(task_id) as ep:
        out = ep.call("bash", {"command": f"cat {installed}; ls"}).output
        assert first_line not in out and "Permission denied" in out
        assert ENV.tasks[task_id].repo.row.path in out.split()


_POOL = [f"test.test_m.T.test_{i}" for i in range(5)]


@settings(max_examples=300)
@given(wanted=st.lists(st.sampled_from(_POOL), unique=True, max_size=4),
       outcomes=st.dictionaries(st.sampled_from(_POOL), st.sampled_from(["pass", "fail", "skip"])),
       ending=st.sampled_from(["verdict", "crashed", "cut", "spoofed"]))
def test_a_stdlib_task_passes_iff_no_hidden_test_fails_and_one_passes(wanted, outcomes, ending):
    """Reward 1 iff every hidden test passes, where a test the sandbox skips can neither fail
    nor pass a fix: none failed or missing, one at least passed. No verdict (crash, timeout,
    cut output) fails them all; only the runner's last line counts, not one the code printed."""
    details = f"{DETAILS} { {t: {'outcome': o} for t, o in outcomes.items()}!r}"
    all_pass = f"{DETAILS} { {t: {'outcome': 'pass'} for t in _POOL}!r}"
    output = {"verdict": f"noise\n{details}\n", "crashed": "Traceback ...\n",
              "cut": f"noise\n{details[:-3]}\n", "spoofed": f"{all_pass}\n{details}\n"}[ending]
    grade = StdlibRepo(SimpleNamespace(hidden_tests=wanted)).grade(output, 0)
    if ending in ("crashed", "cut"):
        assert grade == Grade(len(wanted), len(wanted), False)
        return
    failed = sum(outcomes.get(t) not in ("pass", "skip") for t in wanted)
    assert (grade.tests_total, grade.tests_failed) == (len(wanted), failed)
    assert grade.passed == (failed == 0 and any(outcomes.get(t) == "pass" for t in wanted))

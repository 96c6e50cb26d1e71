"""Mini suite -> verifiers Taskset -> rollout environment: same prompts, tools and rewards."""

import pytest

from envs import EnvConfig, load
from envs.vf.environment import load_verifiers_env
from tests.envs.vf.conftest import tool_servers

OURS = load(EnvConfig())
TASK = "stack_pop"

# verifiers' MCP client passes tenacity a deprecated argument; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter:DeprecationWarning")

@pytest.fixture(scope="module")
def env():
    cfg = EnvConfig(name="mini_vf", suite="verifiers",
                    tasks_path="envs.vf.taskset:RollfleetTaskset")
    with load_verifiers_env(cfg) as env:
        yield env


def test_same_tasks_prompts_and_tools(env):
    assert list(env.tasks) == list(OURS.tasks)
    for task_id, task in OURS.tasks.items():
        assert env.prompt(env.tasks[task_id]) == OURS.prompt(task)
    by_name = {t["function"]["name"]: t for t in env.tools}
    assert by_name == {t["function"]["name"]: t for t in OURS.tools}


def test_reference_fix_scores_one(env):
    with env.episode(TASK) as ep:
        for rel, text in OURS.tasks[TASK].repo.reference_fix().items():
            result = ep.call("write_file", {"path": rel, "content": text})
            assert result.ok and not result.failed, result.output
        assert "OK" in ep.call("run_tests", {}).output
        assert ep.call("submit", {}).submitted
        score = ep.score()
    with OURS.episode(TASK) as ours:
        for rel, text in OURS.tasks[TASK].repo.reference_fix().items():
            ours.call("write_file", {"path": rel, "content": text})
        expected = ours.score()
    assert score.reward == expected.reward == 1.0 and score.infra_error is None
    assert (score.tests_total, score.tests_failed) == (expected.tests_total, 0)
    assert score.diff == expected.diff != ""


def test_doing_nothing_scores_zero(env):
    with env.episode(TASK) as ep:
        score = ep.score()
    with OURS.episode(TASK) as ours:
        expected = ours.score()
    assert score.reward == expected.reward == 0.0 and score.infra_error is None
    assert (score.tests_total, score.tests_failed) == (expected.tests_total,
                                                       expected.tests_failed)
    assert tool_servers() == []

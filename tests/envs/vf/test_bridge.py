"""A verifiers Taskset as a rollout environment, driven by hand like the session drives it."""

import json

import pytest

from envs import EnvConfig, EnvError, SandboxError
from envs.vf.environment import load_verifiers_env
from tests.envs.vf.conftest import tool_servers

COUNTER = "tests.envs.vf.counter:CounterTaskset"

# verifiers' MCP client passes tenacity a deprecated argument; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter:DeprecationWarning")

@pytest.fixture(scope="module")
def env():
    with load_verifiers_env(EnvConfig(name="counter", suite="verifiers",
                                      tasks_path=COUNTER)) as env:
        yield env


def test_tasks_prompts_and_strict_tools(env):
    assert list(env.tasks) == ["reach-3", "reach-5"]
    assert env.prompt(env.tasks["reach-5"]) == [
        {"role": "system", "content": "Use the counter tools."},
        {"role": "user", "content": "Make the counter 5."}]
    tools = {t["function"]["name"]: t["function"] for t in env.tools}
    assert sorted(tools) == ["counter_add", "counter_done", "counter_peek"]
    add = tools["counter_add"]
    assert add["strict"] is True and add["description"] == "Add amount to the counter, times times."
    assert add["parameters"]["required"] == ["amount", "times"]
    assert add["parameters"]["properties"]["times"]["type"] == ["integer", "null"]


def test_episode_calls_tools_stops_and_scores(env):
    with env.episode("reach-3") as ep:
        assert ep.call("counter_add", {"amount": 2, "times": None}).output == "counter is 2"
        assert ep.call("counter_add", '{"amount": 1, "times": 1}').output == "counter is 3"
        peek = ep.call("counter_peek", "{}")
        assert peek.output == "counter 3, target 3"  # the server got the task in setup_task
        failing = ep.call("counter_add", {"amount": -1, "times": None})
        assert failing.ok and failing.failed and "must not be negative" in failing.output
        bad = ep.call("counter_add", {"amount": "x", "times": None})
        assert not bad.ok and "is not of type 'integer'" in bad.error
        unknown = ep.call("counter_nope", {})
        assert not unknown.ok and "unknown tool" in unknown.error
        done = ep.call("counter_done", {})
        assert done.submitted and not done.failed  # the task's @stop fired
        assert not ep.call("counter_peek", {}).ok
        score = ep.score()
    assert score.reward == 1.0 and score.infra_error is None
    breakdown = json.loads(score.output)
    assert breakdown["rewards"] == {"reached": {"score": 1.0, "weight": 1.0}}
    assert breakdown["metrics"] == {"start": 7.0, "value": 3.0}  # Task.setup used the runtime
    assert breakdown["stop_condition"] == "finished"
    assert ep.score() is score


def test_doing_nothing_scores_zero(env):
    with env.episode("reach-5") as ep:
        score = ep.score()
    assert score.reward == 0.0 and score.infra_error is None
    assert json.loads(score.output)["metrics"]["value"] == 0.0


def test_closing_without_scoring_stops_the_tool_server(env):
    with env.episode("reach-5") as ep:
        assert ep.call("counter_peek", {}).ok
        assert tool_servers()
    assert tool_servers() == []


def test_failures_of_the_taskset_are_infra_errors_not_rewards():
    cfg = EnvConfig(name="c", suite="verifiers", tasks_path=COUNTER)
    with load_verifiers_env(cfg, taskset_config={"targets": [0, -1]}) as env:
        with pytest.raises(SandboxError, match="a target of 0 is refused at setup"):
            env.episode("reach-0")
        with env.episode("reach--1") as ep:
            score = ep.score()
    assert "a negative target cannot be scored" in score.infra_error
    assert json.loads(score.output)["rewards"] == {"reached": None}
    assert tool_servers() == []


def test_task_selection_and_bad_specs():
    cfg = EnvConfig(name="c", suite="verifiers", tasks_path=COUNTER, task_ids=["reach-5"])
    with load_verifiers_env(cfg) as env:
        assert list(env.tasks) == ["reach-5"]
    with pytest.raises(EnvError, match="unknown task ids"):
        load_verifiers_env(EnvConfig(suite="verifiers", tasks_path=COUNTER, task_ids=["x"]))
    with pytest.raises(EnvError, match="needs env.tasks_path"):
        load_verifiers_env(EnvConfig(suite="verifiers"))
    with pytest.raises(EnvError, match="no_such_module"):
        load_verifiers_env(EnvConfig(suite="verifiers", tasks_path="no_such_module:X"))
    with pytest.raises(EnvError, match="not a verifiers Taskset"):
        load_verifiers_env(EnvConfig(suite="verifiers", tasks_path="envs:EnvConfig"))
    with pytest.raises(EnvError, match="targets"):
        load_verifiers_env(EnvConfig(suite="verifiers", tasks_path=COUNTER),
                           taskset_config={"targets": "many"})

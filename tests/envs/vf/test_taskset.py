"""Our suites as a verifiers Taskset: rows, configs that survive verifiers' JSON, the plugin."""

import sys

import verifiers.v1 as vf

from envs import EnvConfig, load
from envs.vf import plugin
from envs.vf.task import RollfleetTask, RollfleetTaskConfig
from envs.vf.taskset import RollfleetTaskset, RollfleetTasksetConfig
from envs.vf.toolset import WorkspaceToolsConfig, WorkspaceToolset


def test_rows_are_our_tasks_with_our_prompts():
    ours = load(EnvConfig())
    tasks = list(RollfleetTaskset(RollfleetTasksetConfig()))
    assert [t.data.id for t in tasks] == list(ours.tasks)
    for task in tasks:
        assert isinstance(task, RollfleetTask)
        assert [{"role": "system", "content": task.data.system_prompt},
                {"role": "user", "content": task.data.prompt}] == ours.prompt(
                    ours.tasks[task.data.id])
        assert task.key == f"mini/{task.data.id}"


def test_env_config_selects_tasks():
    config = RollfleetTasksetConfig(task=RollfleetTaskConfig(
        env=EnvConfig(task_ids=["stats_mean", "stack_pop"])))
    assert [t.data.id for t in RollfleetTaskset(config)] == ["stack_pop", "stats_mean"]


def test_tool_server_config_survives_json():
    """verifiers hands the tool server its config as JSON (VF_CONFIG)."""
    task_config = RollfleetTaskConfig(env=EnvConfig(max_tasks=2, sandbox={"cpu_s": 5}))
    [server] = RollfleetTask.toolsets(task_config)
    assert isinstance(server, WorkspaceToolset) and server.server_name == ""
    back = WorkspaceToolsConfig.model_validate_json(server.config.model_dump_json())
    assert back.env == task_config.env and back.runtime.type == "subprocess"


def test_plugin_resolves_as_vf_eval_resolves_it(monkeypatch):
    """By id, through verifiers' loaders: our taskset, harness and env, a local runtime."""
    monkeypatch.setitem(sys.modules, "rollfleet_tasks", plugin)  # the top-level id
    assert vf.taskset_config_type("rollfleet_tasks") is RollfleetTasksetConfig
    assert vf.default_harness_id("rollfleet_tasks") == "rollfleet_tasks"
    assert vf.environment_class("rollfleet_tasks") is plugin.LocalEnv
    env_config = vf.resolve_env_config({"taskset": {"id": "rollfleet_tasks"}})
    assert env_config.agent.runtime.type == "subprocess"
    assert type(env_config.taskset) is RollfleetTasksetConfig
    harness = vf.load_harness(env_config.agent_harnesses()["agent"])
    assert isinstance(harness, plugin.LocalChatHarness)

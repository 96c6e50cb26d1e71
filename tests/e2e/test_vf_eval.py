"""verifiers both ways against the real tiny engine: `vf-eval` on our tasks, and a verifiers
Taskset (ours, through verifiers) run by the rollout job's own session.

The model has random weights: rewards are 0 and its calls are noise; what is checked is that
every loop runs to the end, writes its traces or records, and leaves no process behind.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs import EnvConfig
from envs.vf.environment import load_verifiers_env
from rollout.model_client import ModelClient, SamplingConfig
from rollout.record import Job, Provenance
from rollout.session import Session, SessionLimits
from tests.procs import process_table

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e,  # verifiers' MCP client passes tenacity a deprecated argument
              pytest.mark.filterwarnings("ignore:The 'initial' parameter:DeprecationWarning")]
VF_EVAL = "from verifiers.v1.cli.eval.main import main; main()"


def _ours_left() -> list[str]:
    """Tool servers and chat programs still running (engines are the Cluster's to stop; the
    machine is shared, so other people's engines may come and go meanwhile)."""
    marks = ("envs.vf.toolset", ".vf-program-")
    return [cmd for cmd in process_table().values() if any(m in cmd for m in marks)]


def test_vf_eval_runs_our_tasks(shared_engine, tmp_path):
    out = tmp_path / "outputs"
    argv = [sys.executable, "-c", VF_EVAL, "rollfleet_tasks", "--no-push", "--no-rich",
            "-m", shared_engine.model, "--client.base-url", shared_engine.base_url, "-o", str(out),
            "--run.name", "e2e", "-n", "2", "-r", "1", "-c", "2",
            "--env.agent.max-turns", "3", "--sampling.max-tokens", "64"]
    # `rollfleet_tasks` is the project's top-level module (installed with the project).
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    episodes = [json.loads(line) for line in (out / "e2e" / "traces.jsonl").open()]
    assert len(episodes) == 2  # 2 tasks x 1 rollout
    traces = [t for episode in episodes for t in episode["traces"]]
    assert len(traces) == 2
    assert sorted(t["task"]["data"]["id"] for t in traces) == ["merge_touching",
                                                               "roman_subtractive"]
    for trace in traces:
        assert trace["ok"] and not trace["errors"], trace["errors"]
        assert trace["rewards"]["hidden_tests"]["score"] in (0.0, 1.0)
        assert trace["metrics"]["tests_total"] > 0  # our hidden tests ran on the changes
        assert trace["nodes"][0]["message"]["role"] == "system"
        assert trace["calls"], "the model was called through the interception server"
        assert {t["name"] for t in trace["tools"]} >= {"bash", "write_file", "submit"}
    time.sleep(1)
    assert _ours_left() == []


def test_rollout_session_runs_a_verifiers_taskset(shared_engine):
    cfg = EnvConfig(name="mini_vf", suite="verifiers", max_tasks=2,
                    tasks_path="envs.vf.taskset:RollfleetTaskset")
    client = ModelClient(shared_engine, SamplingConfig())
    # Short tool arguments, so that a whole call fits a small turn (the grammar needs that).
    taskset_config = {"task": {"env": {"max_file_chars": 100, "max_command_chars": 50}}}
    limits = SessionLimits(max_turns=3, max_tokens_per_turn=2000, max_total_tokens=6000)
    provenance = Provenance("e2e", shared_engine.model, shared_engine.model_dir, "", 0, "{}")

    async def run_all(env) -> list[dict]:
        return await asyncio.gather(*(Session(Job(t, 0), env, client, limits, 0, provenance).run()
                                      for t in env.tasks))

    with load_verifiers_env(cfg, taskset_config) as env:
        records = asyncio.run(run_all(env))
    assert len(records) == 2
    for record in records:
        assert record["status"] in ("ok", "truncated"), record["error"]
        assert record["reward"] in (0.0, 1.0)
        assert record["reward_info"]["tests_total"] > 0
        assert record["num_turns"] >= 1
        calls = [c for turn in record["turns"] for c in turn["tool_calls"]]
        assert calls, "tool_choice=required with strict schemas yields tool calls"
        assert json.loads(record["reward_info"]["output"])["rewards"]["hidden_tests"]
    time.sleep(1)
    assert _ours_left() == []

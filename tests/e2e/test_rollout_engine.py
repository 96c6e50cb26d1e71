"""The rollout engine's failure paths and a multi-node Ray cluster, with the real job."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from datasets import load_from_disk

from tests.e2e.jobs import swe_rl_job
from tests.procs import new_job_processes, process_table

RAY = str(Path(sys.executable).with_name("ray"))
TASKS = ("merge_touching", "roman_subtractive", "slugify_lower", "stack_pop", "stats_mean")
pytestmark = pytest.mark.e2e


def _keys(samples: int) -> list[str]:
    return sorted(f"{t}/{i}" for t in TASKS for i in range(samples))


def test_a_killed_rollout_actor_loses_no_rollout(tmp_path, on_shared_engine):
    before = process_table()
    out = tmp_path / "run"
    job = swe_rl_job(out, "rollout.samples_per_task=3", *on_shared_engine)
    deadline = time.monotonic() + 600
    while len(list((out / "data").glob("part-*.parquet")) if (out / "data").exists() else []) < 2:
        assert job.poll() is None, job.stdout.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    actors = [pid for pid, cmd in process_table().items()
              if pid not in before and cmd.startswith("ray::RolloutWorker")]
    assert actors, "no rollout actor process found"
    os.kill(actors[0], signal.SIGKILL)
    log, _ = job.communicate(timeout=900)
    assert job.returncode == 0, log[-3000:]
    assert "worker 0 failed" in log or "worker 1 failed" in log  # the scheduler saw it die
    ds = load_from_disk(str(out / "dataset"))
    assert sorted(ds["rollout_id"]) == _keys(3)  # every key, once
    assert set(ds["status"]) <= {"ok", "truncated"}
    # serving=external: the running server's own /metrics, read for admission and the summary
    summary = json.loads((out / "summary.json").read_text())
    # at least what the records say (the killed actor's unfinished turns were served too)
    assert summary["engine_external_prefix_hits"] >= sum(ds["cached_tokens"]) > 0
    time.sleep(1)
    assert new_job_processes(before) == []


def _ray_node(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    """A Ray node in its own process group (`--block`: it lives as long as this process)."""
    return subprocess.Popen([RAY, "start", "--block", "--node-ip-address=127.0.0.1",
                             "--num-cpus=1", "--disable-usage-stats", *args], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def test_sessions_run_on_both_nodes_of_a_two_node_ray_cluster(tmp_path, on_shared_engine):
    before = process_table()
    # rollout/ keeps its own Ray on loopback with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which
    # `ray start` reads as "no multi-node clusters": the nodes run without it
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env["RAY_AUTH_MODE"] = "disabled"
    port = 20000 + os.getpid() % 10000
    temp = Path(f"/tmp/rf-ray-{os.getpid()}")  # Ray's socket paths must stay under 108 bytes
    head = _ray_node("--head", f"--port={port}", "--include-dashboard=false",
                     f"--temp-dir={temp}", env=env, log=tmp_path / "head.log")
    nodes = [head]
    try:
        time.sleep(8)
        nodes.append(_ray_node(f"--address=127.0.0.1:{port}", env=env,
                               log=tmp_path / "node2.log"))
        time.sleep(8)
        out = tmp_path / "run"
        job = swe_rl_job(out, f"ray.address=127.0.0.1:{port}", "rollout.workers=2",
                         *on_shared_engine, env=env)
        log, _ = job.communicate(timeout=900)
        assert job.returncode == 0, log[-3000:]
        ds = load_from_disk(str(out / "dataset"))
        assert sorted(ds["rollout_id"]) == _keys(2)
        assert len(set(ds["node_id"])) == 2  # sessions (and their sandboxes) on both nodes
    finally:
        for node in nodes:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        shutil.rmtree(temp, ignore_errors=True)
    deadline = time.monotonic() + 120  # Ray's agents notice their raylet is gone by themselves
    while new_job_processes(before) and time.monotonic() < deadline:
        time.sleep(2)
    assert new_job_processes(before) == []

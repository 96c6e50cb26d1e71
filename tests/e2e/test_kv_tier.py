"""The Mooncake host-DRAM KV tier with real engines: another engine serves a session's later turn
from the tier, Dynamo's router sees the tier, and a dead master costs recompute, not rollouts."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from datasets import load_from_disk

from serving import Cluster, ModelConfig, ServingConfig
from serving.metrics import fetch, total
from tests.e2e.records import check_records
from tests.procs import new_job_processes, process_table

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e

ROUTER_VIEW = """
import asyncio, json, sys
from dynamo.llm import KvRouter, KvRouterConfig
from dynamo.runtime import DistributedRuntime

async def main():
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp", event_plane="zmq")
    router = KvRouter(runtime.endpoint("dynamo.backend.generate"), int(sys.argv[1]),
                      KvRouterConfig())
    tokens = json.loads(sys.stdin.read())
    for _ in range(40):  # the router replays the workers' events as it starts
        scores = await router.get_overlap_scores(tokens)
        held = [w.get("host_pinned_blocks", 0) for w in scores.get("workers", [])]
        if len(held) == int(sys.argv[2]) and min(held) >= int(sys.argv[3]):
            break
        await asyncio.sleep(0.5)
    print(json.dumps(scores))
    runtime.shutdown()

asyncio.run(main())
"""


def _turn(url: str, prompt: list[int], worker: str) -> dict:
    """One completion pinned to a worker (its Dynamo instance id, hex)."""
    resp = httpx.post(f"{url}/v1/completions", timeout=300, json={
        "model": "tiny-glm", "prompt": prompt, "max_tokens": 4, "temperature": 0,
        "nvext": {"backend_instance_id": int(worker, 16), "extra_fields": ["worker_id"]}})
    assert resp.status_code == 200, resp.text[:500]
    body = resp.json()
    served = f"{body['nvext']['worker_id']['decode_worker_id']:x}"
    assert served == worker, (served, worker)
    return body


def _cached(body: dict) -> int:
    return (body.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def _tier_hits(url: str) -> float:
    return total(fetch(url), "vllm:external_prefix_cache_hits_total", url)


def test_another_engine_serves_a_later_turn_from_the_tier(tmp_path):
    before = process_table()
    rng = random.Random(0)
    cfg = ServingConfig(mode="kv_routed", engines=2, kv_tier="mooncake", kv_tier_gib=0.5)
    cluster = Cluster(cfg, ModelConfig(max_model_len=4096), tmp_path, ROOT / ".cache")
    with cluster as endpoint:
        url = endpoint.base_url.removesuffix("/v1")
        first, second = cluster.workers
        turn1 = [rng.randrange(100, 8000) for _ in range(1000)]
        body = _turn(url, turn1, first.instance_id)
        assert _cached(body) == 0
        time.sleep(2)  # the background put finishes; its announcement reaches both engines
        hits_before = _tier_hits(second.metrics_url)
        turn2 = turn1 + [rng.randrange(100, 8000) for _ in range(300)]
        body = _turn(url, turn2, second.instance_id)  # the session moves to the other engine
        assert _cached(body) >= 7 * 128  # turn 1's 7 full blocks, loaded from the tier
        assert _tier_hits(second.metrics_url) - hits_before >= 7 * 128
        # An engine files the tier's announcements with its next step's KV events (vLLM
        # collects connector events only when it steps): the first engine, idle since turn 1,
        # takes one short request, and Dynamo's router then holds the tier's blocks under each
        # worker's host tier.
        _turn(url, [rng.randrange(100, 8000) for _ in range(8)], first.instance_id)
        view = subprocess.run([sys.executable, "-c", ROUTER_VIEW, "128", "2", "7"],
                              input=json.dumps(turn2), capture_output=True, text=True, timeout=120,
            env={**os.environ, **cluster.plane.env()})
        assert view.returncode == 0, view.stderr[-2000:]
        scores = json.loads(view.stdout.strip().splitlines()[-1])
        host = {w["worker_id"]: w.get("host_pinned_blocks", 0) for w in scores["workers"]}
        assert len(host) == 2 and all(n >= 7 for n in host.values()), scores
    time.sleep(1)
    assert new_job_processes(before) == []


def test_disaggregated_workers_share_the_tier_which_outlives_a_worker_restart(tmp_path):
    """Prefill and decode workers run the tier beside NIXL (vLLM's MultiConnector); a restarted
    prefill worker, its own cache empty, takes a session's prefix from the tier."""
    before = process_table()
    rng = random.Random(1)
    cfg = ServingConfig(mode="disagg", kv_tier="mooncake", kv_tier_gib=0.5)
    cluster = Cluster(cfg, ModelConfig(max_model_len=4096), tmp_path, ROOT / ".cache")
    with cluster as endpoint:
        url = endpoint.base_url.removesuffix("/v1")
        turn1 = [rng.randrange(100, 8000) for _ in range(1000)]

        def complete(prompt: list[int]) -> dict:
            resp = httpx.post(f"{url}/v1/completions", timeout=300, json={
                "model": "tiny-glm", "prompt": prompt, "max_tokens": 4, "temperature": 0})
            assert resp.status_code == 200, resp.text[:500]
            return resp.json()

        first = complete(turn1)
        time.sleep(2)
        cluster.restart_worker("prefill0")
        prefill = next(w for w in cluster.workers if w.name == "prefill0")
        assert _tier_hits(prefill.metrics_url) == 0
        second = complete(turn1 + [rng.randrange(100, 8000) for _ in range(300)])
        assert _tier_hits(prefill.metrics_url) >= 7 * 128
        assert first["choices"][0]["text"] and second["choices"][0]["text"]
    time.sleep(1)
    assert new_job_processes(before) == []


def _job(out: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rollout.run", "+experiment=swe_rl",
                             f"output.dir={out}", "logger=none", *overrides], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _writer_of(log: Path) -> int | None:
    """The process whose standard output is `log` (ManagedProcess points it there), if any."""
    for pid in process_table():
        try:
            if os.readlink(f"/proc/{pid}/fd/1") == str(log):
                return pid
        except OSError:
            continue
    return None


def test_a_killed_mooncake_master_costs_recompute_not_rollouts(tmp_path):
    """The main job with the tier; once the engine has used the tier, SIGKILL its master, and
    every master the supervisor restarts, until the engine reports the tier down (a master
    restarted within the second may otherwise see no call in between): every rollout is still
    recorded, none as an infrastructure error, none retried. (Loads from the tier are the two
    tests above: this job's working set fits any KV cache large enough for its context, so it
    never evicts.)"""
    before = process_table()
    out = tmp_path / "run"
    job = _job(out, "serving.kv_tier=mooncake", "serving.kv_tier_gib=0.5")
    engine_log = out / "logs" / "engine-0.log"

    def engine_lines() -> list[str]:
        return engine_log.read_text(errors="replace").splitlines() if engine_log.exists() else []

    deadline = time.monotonic() + 600
    while not any("EngineCore" in line and "KV tier: connected" in line
                  for line in engine_lines()):  # the scheduler side, at the first request
        assert job.poll() is None, job.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the engine did not use the tier within 600 s"
        time.sleep(0.2)
    while not any("treating the tier as down" in line for line in engine_lines()):
        assert job.poll() is None, ("the job ended before the engine saw the tier down",
                                    job.stdout.read()[-3000:])
        master = _writer_of(out / "kvtier" / "master.log")
        if master is not None:
            os.kill(master, signal.SIGKILL)
        time.sleep(0.2)
    log, _ = job.communicate(timeout=900)
    assert job.returncode == 0, log[-3000:]
    assert "restarting it (the tier starts empty)" in log
    ds = load_from_disk(str(out / "dataset"))
    assert len(ds) == 10
    assert all(row["status"] in ("ok", "truncated") for row in ds), [
        (row["rollout_id"], row["error"]) for row in ds if row["status"] == "infra_error"]
    assert all(row["attempt"] == 0 for row in ds)  # nothing had to be retried
    check_records(ds, engines={"0"})
    time.sleep(1)
    assert new_job_processes(before) == []

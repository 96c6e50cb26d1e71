"""The job through NVIDIA Dynamo's frontend and KV router, real vLLM workers (no fakes)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from datasets import load_from_disk

from serving import Cluster, ModelConfig, ServingConfig
from tests.e2e.records import check_records
from tests.procs import new_job_processes, process_table

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _job(out: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rollout.run", "+experiment=swe_rl",
                             f"output.dir={out}", "logger=none", *overrides], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_kv_routed_job_reuses_prefixes_on_the_session_engine(tmp_path):
    before = process_table()
    out = tmp_path / "run"
    job = _job(out, "serving=kv_routed")
    log, _ = job.communicate(timeout=900)
    assert job.returncode == 0, log[-3000:]
    ds = load_from_disk(str(out / "dataset"))
    assert len(ds) == 10
    counts = check_records(ds, engines={"agg0", "agg1"})
    for row in ds:  # each session stays on the engine that holds its prefix
        assert len({t["engine_id"] for t in row["turns"]}) == 1, row["rollout_id"]
    assert counts["later_cached"] == counts["turns"] - counts["records"]
    assert {t["engine_id"] for row in ds for t in row["turns"]} == {"agg0", "agg1"}
    time.sleep(1)
    assert new_job_processes(before) == []


def test_disagg_job_prefills_on_one_worker_and_decodes_on_another(tmp_path):
    before = process_table()
    out = tmp_path / "run"
    job = _job(out, "serving=disagg", "rollout.samples_per_task=1", "rollout.max_retries=1",
               "rollout.retry_backoff_s=5")
    log, _ = job.communicate(timeout=900)
    time.sleep(1)
    assert new_job_processes(before) == []  # whatever happened, nothing is left running
    assert job.returncode == 0, log[-3000:]
    ds = load_from_disk(str(out / "dataset"))
    assert len(ds) == 5
    counts = check_records(ds, engines={"decode0"})
    assert all(t["prefill_engine_id"] == "prefill0" for row in ds for t in row["turns"])
    assert counts["multi_turn"] >= 1 and counts["later_cached"] >= 2


def test_a_killed_engine_loses_no_session(tmp_path):
    """SIGKILL one of two engines mid-run: its turns fail as infra errors, are retried on the
    other engine, and every rollout is recorded."""
    before = process_table()
    out = tmp_path / "run"
    job = _job(out, "serving=kv_routed", "rollout.samples_per_task=3", "rollout.max_retries=3")
    victim_log = out / "logs" / "worker-agg1.log"
    deadline = time.monotonic() + 400
    while not (out / "logs" / "frontend-0.log").exists() or not _served(victim_log, 3):
        assert job.poll() is None, job.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "engine agg1 never served requests"
        time.sleep(0.5)
    victim = _worker_pid("agg1", out)
    os.killpg(victim, signal.SIGKILL)
    log, _ = job.communicate(timeout=900)
    assert job.returncode == 0, log[-3000:]
    ds = load_from_disk(str(out / "dataset"))
    assert len(ds) == 15  # 5 tasks x 3 samples, none lost
    assert all(row["status"] in ("ok", "truncated") for row in ds), [
        (row["rollout_id"], row["error"]) for row in ds if row["status"] == "infra_error"]
    late = [t["engine_id"] for row in ds if row["attempt"] > 0 for t in row["turns"]]
    assert late, "the kill failed no turn: nothing was retried"
    assert "agg1" not in late  # retries went to the engine that is still up
    time.sleep(1)
    assert new_job_processes(before) == []


def _served(log: Path, n: int) -> bool:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return sum("request completed" in line and '"generate"' in line for line in lines) >= n


def _worker_pid(name: str, run_dir: Path) -> int:
    for pid, cmd in process_table().items():
        if "dynamo.vllm" in cmd and str(run_dir) in cmd and f"kv-events-{name}" in cmd:
            return pid
    raise AssertionError(f"no process for worker {name}")


def _turn(url: str, prompt: list[int], max_tokens: int,
          headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """One completion through the frontend -> (HTTP status, the engines that served it)."""
    resp = httpx.post(f"{url}/v1/completions", timeout=120, headers=headers,
                      json={"model": "tiny-glm", "prompt": prompt, "max_tokens": max_tokens,
                            "nvext": {"extra_fields": ["worker_id"]}})
    return resp.status_code, resp.json().get("nvext", {}).get("worker_id", {})


def _complete(url: str, session: str, prompt: list[int], max_tokens: int) -> str:
    status, ids = _turn(url, prompt, max_tokens, {"x-dynamo-session-id": session})
    assert status == 200, status
    return f"{ids['decode_worker_id']:x}"


def test_a_dead_prefill_worker_fails_fast_and_a_restarted_one_rejoins(tmp_path):
    """SIGKILL the only prefill worker: turns fail at once with a retryable 5xx (nothing hangs
    on the decode worker, which stays up); `restart_worker` brings a new one that serves."""
    before = process_table()
    cluster = Cluster(ServingConfig(mode="disagg"), ModelConfig(max_model_len=4096), tmp_path,
                      ROOT / ".cache")
    with cluster as endpoint:
        url = endpoint.base_url.removesuffix("/v1")
        status, ids = _turn(url, list(range(100, 400)), 8)
        assert status == 200
        old_prefill, decode = f"{ids['prefill_worker_id']:x}", f"{ids['decode_worker_id']:x}"
        assert endpoint.engine_names[old_prefill] == "prefill0"
        prefill = next(w for w in cluster.workers if w.name == "prefill0")
        os.killpg(prefill.process.pid, signal.SIGKILL)
        for i in range(5):
            start = time.monotonic()
            status, _ = _turn(url, list(range(500 + i, 800 + i)), 8)
            assert status >= 500 and time.monotonic() - start < 10, status
            time.sleep(1)
        assert [w.name for w in cluster.workers if w.alive()] == ["decode0"]
        cluster.restart_worker("prefill0")
        status, ids = _turn(url, list(range(900, 1200)), 8)
        assert status == 200
        new_prefill = f"{ids['prefill_worker_id']:x}"
        assert new_prefill != old_prefill and endpoint.engine_names[new_prefill] == "prefill0"
        assert f"{ids['decode_worker_id']:x}" == decode  # the same decode worker, not wedged
    time.sleep(1)
    assert new_job_processes(before) == []


def test_session_bindings_are_shared_between_frontends(tmp_path):
    """Sessions bound through one frontend keep their engine through another, even for a
    prompt that shares nothing with what that engine holds."""
    before = process_table()
    rng = random.Random(0)
    cfg = ServingConfig(mode="kv_routed", engines=2, frontends=2)
    cluster = Cluster(cfg, ModelConfig(max_model_len=4096), tmp_path, ROOT / ".cache")
    with cluster as endpoint:
        first, second = (f.base_url for f in cluster.frontends)
        sessions = [f"s{i}" for i in range(8)]
        with ThreadPoolExecutor(8) as pool:  # concurrent, so load spreads them over both engines
            bound = list(pool.map(lambda s: _complete(
                first, s, [rng.randrange(100, 8000) for _ in range(300)], 48), sessions))
        names = {endpoint.engine_names[b] for b in bound}
        assert names == {"agg0", "agg1"}, bound
        later = [_complete(second, s, [rng.randrange(100, 8000) for _ in range(300)], 1)
                 for s in sessions]
        assert later == bound
    time.sleep(1)
    assert new_job_processes(before) == []


def test_etcd_and_nats_discovery_on_loopback(tmp_path):
    before = process_table()
    cfg = ServingConfig(mode="kv_routed", engines=1, discovery="etcd")
    cluster = Cluster(cfg, ModelConfig(max_model_len=4096), tmp_path, ROOT / ".cache")
    with cluster as endpoint:
        assert cluster.plane.env()["DYN_DISCOVERY_BACKEND"] == "etcd"
        url = endpoint.base_url.removesuffix("/v1")
        assert endpoint.engine_names[_complete(url, "s", [5, 6, 7], 2)] == "agg0"
    time.sleep(1)
    assert new_job_processes(before) == []

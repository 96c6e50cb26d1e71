"""The Mooncake host-DRAM KV tier with real engines: a restarted prefill worker takes a
session's prefix from the tier, and a dead master costs recompute, not rollouts. (Another
engine serving a later turn from the tier, and the router's view of it: test_routed_cluster.py.)"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
from datasets import load_from_disk

from rollout.admission import KvBudget
from serving import MetricsError, ModelConfig, ServingConfig
from serving.cluster import Cluster
from serving.metrics import kv_state
from tests.e2e.frontend_calls import complete, served_by, tier_hits
from tests.e2e.jobs import swe_rl_job
from tests.e2e.records import check_behaviour, check_records
from tests.procs import new_job_processes, process_table

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_a_dead_prefill_worker_fails_fast_and_its_restart_takes_the_prefix_from_the_tier(
        tmp_path):
    """Disaggregated workers run the tier beside NIXL (vLLM's MultiConnector). SIGKILL the only
    prefill worker: turns fail at once with a retryable 5xx (nothing hangs on the decode worker,
    which stays up); `restart_worker` brings a new one, its own cache empty, which takes the
    session's prefix from the tier."""
    before = process_table()
    rng = random.Random(1)
    cfg = ServingConfig(mode="disagg", kv_tier="mooncake", kv_tier_gib=0.5)
    cluster = Cluster(cfg, ModelConfig(max_model_len=4096), tmp_path, ROOT / ".cache")
    with cluster as endpoint:
        url = endpoint.base_url.removesuffix("/v1")
        turn1 = [rng.randrange(100, 8000) for _ in range(1000)]
        status, first = complete(url, turn1, 4)
        assert status == 200, first
        old_prefill, decode = served_by(first)
        assert cluster.roster.names()[old_prefill] == "prefill0"
        time.sleep(2)  # the background put of turn 1's blocks finishes
        prefill = next(w for w in cluster.topology.workers if w.name == "prefill0")
        os.killpg(prefill.process.pid, signal.SIGKILL)
        for _ in range(5):
            start = time.monotonic()
            status, _ = complete(url, [rng.randrange(100, 8000) for _ in range(300)], 8)
            assert status >= 500 and time.monotonic() - start < 10, status
            time.sleep(1)
        assert [w.name for w in cluster.topology.workers if w.alive()] == ["decode0"]
        admission = KvBudget(cluster.roster.kv_states, group=1, maximum=64)
        old_metrics = cluster.roster.metrics_urls()["prefill0"]
        with pytest.raises(MetricsError):  # the dead worker's address answers no more
            admission.read_state()
        cluster.restart_worker("prefill0")
        # The KV-budget admission reads the roster at each poll: the restarted worker is
        # there on its new port, and the cache it sizes itself by is both engines' again.
        new_metrics = cluster.roster.metrics_urls()["prefill0"]
        assert new_metrics != old_metrics
        with pytest.raises(MetricsError):
            kv_state(old_metrics)
        assert admission.limit() >= 1 and admission.capacity == sum(
            state.capacity_tokens for state in cluster.roster.kv_states()) > 0
        prefill = next(w for w in cluster.topology.workers if w.name == "prefill0")
        assert tier_hits(prefill.metrics_url) == 0
        status, second = complete(url, turn1 + [rng.randrange(100, 8000) for _ in range(300)], 4)
        assert status == 200, second
        assert tier_hits(prefill.metrics_url) >= 7 * 128
        new_prefill, same_decode = served_by(second)
        assert new_prefill != old_prefill and cluster.roster.names()[new_prefill] == "prefill0"
        assert same_decode == decode  # the same decode worker, not wedged
        assert first["choices"][0]["text"] and second["choices"][0]["text"]
    time.sleep(1)
    assert new_job_processes(before) == []


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
    job = swe_rl_job(out, "serving.kv_tier=mooncake", "serving.kv_tier_gib=0.5")
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
    check_behaviour(ds)
    time.sleep(1)
    assert new_job_processes(before) == []

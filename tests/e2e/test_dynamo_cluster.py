"""The job through NVIDIA Dynamo's frontend and KV router, real vLLM workers (no fakes);
the cluster's own behaviour under requests is test_routed_cluster.py."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest
from datasets import load_from_disk

from tests.e2e.jobs import swe_rl_job
from tests.e2e.records import check_behaviour, check_records
from tests.procs import new_job_processes, process_table, temp_litter

pytestmark = pytest.mark.e2e
REQUEST_ID = re.compile(r"request_id=\"?([0-9a-f-]{36})")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # Dynamo's log colours its fields


def test_disagg_job_prefills_on_one_worker_and_decodes_on_another(tmp_path):
    before, litter = process_table(), temp_litter()
    out = tmp_path / "run"
    job = swe_rl_job(out, "serving=disagg", "rollout.samples_per_task=1", "rollout.max_retries=1",
                     "rollout.retry_backoff_s=5")
    log, _ = job.communicate(timeout=900)
    time.sleep(1)
    assert new_job_processes(before) == []  # whatever happened, nothing is left running
    assert job.returncode == 0, log[-3000:]
    assert temp_litter() - litter == set()  # nor in the temp folder (sockets, Dynamo's files)
    ds = load_from_disk(str(out / "dataset"))
    assert len(ds) == 5
    counts = check_records(ds, engines={"decode0"})
    check_behaviour(ds)
    assert all(t["prefill_engine_id"] == "prefill0" for row in ds for t in row["turns"])
    assert counts["multi_turn"] >= 1 and counts["later_cached"] >= 2


def test_kv_routed_sessions_stay_on_their_engine_and_a_killed_one_loses_none(tmp_path):
    """A kv_routed job on two engines: each session's turns go to the engine that holds its
    prefix (every later turn is served from cache). SIGKILL one engine mid-run: its turns fail
    as infra errors, are retried on the other engine, and every rollout is recorded exactly
    (a retried session starts again, so each record's turns are one session's); a session that
    was between two turns when its engine died goes on on the other one."""
    before = process_table()
    out = tmp_path / "run"
    job = swe_rl_job(out, "serving=kv_routed", "rollout.samples_per_task=3",
                     "rollout.max_retries=3")
    victim_log = out / "logs" / "worker-agg1.log"
    deadline = time.monotonic() + 400
    while True:  # kill agg1 with a turn on it: frozen first, so the check and the kill agree
        assert job.poll() is None, job.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "engine agg1 never served requests with a turn running"
        if (out / "logs" / "frontend-0.log").exists() and len(_generates(victim_log)[1]) >= 3:
            victim = _worker_pid("agg1", out)
            os.killpg(victim, signal.SIGSTOP)
            if _turns_running(victim_log):  # not only sessions' releases (one-token requests)
                break
            os.killpg(victim, signal.SIGCONT)
        time.sleep(0.2)
    os.killpg(victim, signal.SIGKILL)
    log, _ = job.communicate(timeout=900)
    assert job.returncode == 0, log[-3000:]
    ds = load_from_disk(str(out / "dataset"))
    assert len(ds) == 15  # 5 tasks x 3 samples, none lost
    check_records(ds, engines={"agg0", "agg1"})  # every record ok or truncated
    for row in ds:  # each session stays on the engine that holds its prefix while it lives
        engines = [t["engine_id"] for t in row["turns"]]
        moves = [i for i in range(1, len(engines)) if engines[i] != engines[i - 1]]
        # a session between two turns when agg1 died goes on on agg0, once, and never back
        assert moves == [] or (len(moves) == 1 and engines[moves[0] - 1] == "agg1"
                               and set(engines[moves[0]:]) == {"agg0"}), row["rollout_id"]
        assert all(t["cached_tokens"] > 0 for i, t in enumerate(row["turns"])
                   if i and i not in moves), row["rollout_id"]  # served from its prefix
    late = [t["engine_id"] for row in ds if row["attempt"] > 0 for t in row["turns"]]
    assert late, "the kill failed no turn: nothing was retried"
    assert set(late) == {"agg0"}  # retries went to the engine that is still up
    time.sleep(1)
    assert new_job_processes(before) == []


def _generates(log: Path) -> tuple[list[str], list[str]]:
    """The ids of the generate requests a Dynamo worker's log says it received, and completed."""
    text = COLOUR.sub("", log.read_text(errors="replace")) if log.exists() else ""
    lines = [line for line in text.splitlines() if 'endpoint="generate"' in line]
    return ([m.group(1) for line in lines if "request received" in line
             for m in [REQUEST_ID.search(line)]],
            [m.group(1) for line in lines if "request completed" in line
             for m in [REQUEST_ID.search(line)]])


def _turns_running(log: Path) -> list[str]:
    """The turns a worker is serving: requests received, not completed, and not a session's
    release (whose id is a name-based UUID, serving.frontdoor.release_request_id)."""
    received, completed = _generates(log)
    return [r for r in set(received) - set(completed) if uuid.UUID(r).version != 5]


def _worker_pid(name: str, run_dir: Path) -> int:
    """The worker of this run's cluster (its HOME is under the run folder)."""
    for pid, cmd in process_table().items():
        if "dynamo.vllm" in cmd and f"kv-events-{name}" in cmd:
            with contextlib.suppress(OSError):
                if str(run_dir).encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    return pid
    raise AssertionError(f"no process for worker {name}")

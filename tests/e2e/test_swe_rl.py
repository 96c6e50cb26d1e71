"""The main job end to end, through a real vLLM engine and real Ray actors (no fakes)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from datasets import load_from_disk

from tests.procs import new_job_processes, process_table

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _job(*overrides: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rollout.run", *overrides], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)


def test_swe_rl_records_every_turn_as_sampled(tmp_path):
    before = process_table()
    out = tmp_path / "run"
    job = _job("+experiment=swe_rl", f"output.dir={out}")
    log, _ = job.communicate(timeout=900)
    assert job.returncode == 0, log[-3000:]
    assert "rollout summary" in log

    ds = load_from_disk(str(out / "dataset"))
    assert len(ds) == 10  # 5 tasks x 2 samples
    multi_turn = 0
    for row in ds:
        assert row["status"] in ("ok", "truncated"), row["error"]
        assert row["reward"] is not None
        assert row["num_turns"] >= 1
        multi_turn += row["num_turns"] >= 2
        for turn in row["turns"]:
            assert turn["prompt_token_ids"] and turn["completion_token_ids"]
            assert len(turn["completion_logprobs"]) == len(turn["completion_token_ids"])
            assert all(lp <= 0.0 for lp in turn["completion_logprobs"])
            assert turn["constraint"].startswith("rollfleet-glm:tool_choice=required")
        assert row["provenance"]["config_hash"] and row["provenance"]["model"] == "tiny-glm"
        if row["prefix_consistent"]:
            assert len(row["token_ids"]) == len(row["loss_mask"]) == len(row["logprobs"])
            assert sum(row["loss_mask"]) == row["completion_tokens"]
    assert multi_turn >= 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollouts"] == 10 and summary["infra_error"] == 0
    assert list((out / "wandb").glob("offline-run-*"))
    time.sleep(1)
    assert new_job_processes(before) == []


def test_sigterm_midway_stops_everything(tmp_path):
    before = process_table()
    out = tmp_path / "run"
    job = _job("+experiment=swe_rl", f"output.dir={out}", "rollout.samples_per_task=8",
               "logger=none")
    engine_log = out / "logs" / "engine-0.log"
    deadline = time.monotonic() + 300
    while not (engine_log.exists() and "startup complete" in engine_log.read_text()):
        assert job.poll() is None, job.stdout.read()
        assert time.monotonic() < deadline, "engine did not start"
        time.sleep(0.5)
    time.sleep(10)  # Ray is up and sessions are in flight
    assert job.poll() is None
    job.send_signal(signal.SIGTERM)
    log, _ = job.communicate(timeout=120)
    assert job.returncode != 0
    assert "Traceback" not in log
    time.sleep(1)
    assert new_job_processes(before) == []


def _taken_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize(("overrides", "message"), [
    (["+experiment=nope"], "error: In 'config': Could not find 'experiment/nope'"),
    (["+experiment=swe_rl", "rollout.nope=1"], "error: Could not override 'rollout.nope'"),
    (["+experiment=swe_rl", "+rollout.nope=1"], "error: unknown key(s) ['nope']"),
    (["+experiment=swe_rl", "model.path=/no/such/model"],
     "error: model path /no/such/model does not exist"),
    (["+experiment=swe_rl", "serving=external", "serving.base_url=http://127.0.0.1:9/v1"],
     "error: external server http://127.0.0.1:9/v1 does not answer"),
    (["+experiment=swe_rl", "serving.port=PORT"], "error: port PORT on 127.0.0.1 is already"),
])
def test_bad_input_is_one_clear_error(tmp_path, overrides, message):
    before = process_table()
    with _taken_port() as sock:
        port = str(sock.getsockname()[1])
        overrides = [o.replace("PORT", port) for o in overrides]
        job = _job(*overrides, f"output.dir={tmp_path}", "logger=none")
        log, _ = job.communicate(timeout=300)
    assert job.returncode == 2
    assert message.replace("PORT", port) in log
    assert "Traceback" not in log
    assert [line for line in log.splitlines() if line.startswith("error:")] == [
        line for line in log.splitlines() if "error" in line.lower()]  # one error line
    assert new_job_processes(before) == []

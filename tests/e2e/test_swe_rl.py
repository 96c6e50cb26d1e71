"""The main job end to end, through a real vLLM engine and real Ray actors (no fakes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from datasets import load_from_disk

from rollout.summary import summarize
from tests.e2e.records import check_behaviour, check_records
from tests.procs import new_job_processes, process_table, temp_litter

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _job(*overrides: str, cwd: Path = ROOT, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rollout.run", *overrides], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)


def _engine_socket_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("rollfleet-vllm-*")}


@pytest.fixture(scope="module")
def swe_rl_run(tmp_path_factory) -> Path:
    """One run of the README's main job exactly as typed there (its default run folder, no
    override), started from a working directory other than the project's; shared by the
    tests that read its records."""
    before, litter, folders = process_table(), temp_litter(), _engine_socket_folders()
    cwd = tmp_path_factory.mktemp("elsewhere")
    job = _job("+experiment=swe_rl", cwd=cwd)
    log, _ = job.communicate(timeout=900)
    assert job.returncode == 0, log[-3000:]
    assert "rollout summary" in log
    time.sleep(1)
    assert new_job_processes(before) == []
    # nothing of the engine's left in the temp folder: no socket, no socket folder
    assert temp_litter() - litter == set()
    assert _engine_socket_folders() - folders == set()
    [out] = (cwd / "runs" / "swe_rl").iterdir()  # conf/output/default.yaml: runs/<name>/<time>
    return out


def test_swe_rl_records_every_turn_as_sampled(swe_rl_run):
    ds = load_from_disk(str(swe_rl_run / "dataset"))
    assert sorted(ds["rollout_id"]) == sorted(f"{t}/{i}" for t in (
        "merge_touching", "roman_subtractive", "slugify_lower", "stack_pop", "stats_mean")
        for i in range(2))
    counts = check_records(ds, engines={"0"})
    check_behaviour(ds)  # each token's probability, as a trainer recomputes it
    assert counts["multi_turn"] >= 2
    assert counts["later_cached"] == counts["turns"] - counts["records"]  # every later turn
    model_dir = Path(ds[0]["provenance"]["model_path"])
    assert (model_dir / "tokenizer.json").is_file() and (model_dir / "config.json").is_file()
    assert list((swe_rl_run / "wandb").glob("offline-run-*"))


def test_the_summary_is_the_sum_of_the_records(swe_rl_run):
    ds = load_from_disk(str(swe_rl_run / "dataset"))
    summary = json.loads((swe_rl_run / "summary.json").read_text())
    expected = summarize(ds.to_list(), summary["wall_s"])
    for key, value in expected.items():
        assert summary[key] == pytest.approx(value), key
    assert summary["rollouts"] == summary["dataset_rows"] == 10 and summary["infra_error"] == 0


def test_the_trainer_view_is_the_sampled_sequence(swe_rl_run):
    records = {r["rollout_id"]: r for r in load_from_disk(str(swe_rl_run / "dataset"))}
    view = load_from_disk(str(swe_rl_run / "trainer"))
    assert len(view) == len(records)
    for row in view:
        rec = records[row["rollout_id"]]
        assert row["input_ids"] == rec["token_ids"] and row["loss_mask"] == rec["loss_mask"]
        assert row["old_logprobs"] == pytest.approx(rec["logprobs"])
        assert (row["group_id"], row["reward"]) == (rec["group_id"], rec["reward"])


def _rescore(run: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/rescore.py", str(run), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)


def test_rescoring_reproduces_rewards_and_logprobs(swe_rl_run, tmp_path):
    out = tmp_path / "rescore.json"
    proc = _rescore(swe_rl_run, "--records", "10", "--diffs", "10", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["turns"] >= 20 and report["rewards_checked"] >= 2 and report["forced"] > 0
    assert report["max_abs"] <= report["tolerance_max"] and report["rewards_mismatched"] == []
    assert report["not_rescored"] == {}


def test_rescoring_catches_a_corrupted_record_and_a_corrupted_diff(swe_rl_run, tmp_path):
    bad = tmp_path / "run"
    shutil.copytree(swe_rl_run, bad, ignore=shutil.ignore_patterns("wandb", "data", "trainer"))
    rows = load_from_disk(str(bad / "dataset")).to_list()
    victim = next(r for r in rows if r["final_diff"])
    lines = victim["final_diff"].splitlines(keepends=True)
    hunk = next(i for i, ln in enumerate(lines) if ln.startswith("@@"))
    lines[hunk + 1] = "+" + lines[hunk + 1][1:] if lines[hunk + 1][:1] == "-" else "-changed\n"
    victim["final_diff"] = "".join(lines)
    rows[0]["turns"][0]["completion_logprobs"][3] += 1.0  # a shifted logprob
    from datasets import Dataset

    from rollout.record import FEATURES
    shutil.rmtree(bad / "dataset")
    Dataset.from_list(rows, features=FEATURES).save_to_disk(str(bad / "dataset"))
    proc = _rescore(bad, "--records", "1", "--diffs", "10")
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert f"reward {victim['rollout_id']}" in proc.stdout and "MISMATCH" in proc.stdout
    assert f"at ('{rows[0]['rollout_id']}', 0, 3)" in proc.stdout


def _on_disk(out: Path) -> list[str]:
    """The rollout ids of every record file the job has renamed into place so far."""
    parts = sorted((out / "data").glob("part-*.parquet")) if (out / "data").exists() else []
    return [rid for p in parts for rid in pq.read_table(p)["rollout_id"].to_pylist()]


def test_sigkill_keeps_every_finished_rollout_and_a_rerun_completes_the_set(
        tmp_path, on_shared_engine):
    """On the shared engine: that a job's own engine dies with a SIGKILLed job is
    tests/serving/test_process.py::test_a_server_dies_with_a_sigkilled_job."""
    before = process_table()
    out = tmp_path / "run"
    overrides = ("+experiment=swe_rl", f"output.dir={out}", "rollout.samples_per_task=2",
                 "logger=none", *on_shared_engine)
    job = _job(*overrides)
    deadline = time.monotonic() + 600
    while len(_on_disk(out)) < 3:
        assert job.poll() is None, job.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "no rollout finished"
        time.sleep(0.2)
    job.kill()  # SIGKILL: no handler runs, nothing is flushed by the job
    job.wait()
    finished = _on_disk(out)
    assert len(finished) >= 3 and len(set(finished)) == len(finished)
    killed_at = time.monotonic()
    rerun = _job(*overrides)  # beside what the killed job left, which must not disturb it
    log, _ = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, log[-3000:]
    # Ray's dashboard and runtime-env agents notice their raylet is gone by themselves, up to
    # ~90 s later (README: known limits).
    while new_job_processes(before) and time.monotonic() < killed_at + 150:
        time.sleep(2)
    assert new_job_processes(before) == []
    ds = load_from_disk(str(out / "dataset"))
    assert sorted(ds["rollout_id"]) == sorted(f"{t}/{i}" for t in (
        "merge_touching", "roman_subtractive", "slugify_lower", "stack_pop", "stats_mean")
        for i in range(2))
    kept = {r["rollout_id"]: r["provenance"]["created_at"] for r in ds}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollouts"] == 10 and summary["rollouts_this_run"] == 10 - len(finished)
    assert all(rid in kept for rid in finished)


def test_sigterm_midway_stops_everything_with_one_line(tmp_path):
    before = process_table()
    out = tmp_path / "run"
    job = _job("+experiment=swe_rl", f"output.dir={out}", "rollout.samples_per_task=8",
               "logger=none")
    deadline = time.monotonic() + 300
    while len(_on_disk(out)) < 2:
        assert job.poll() is None, job.stdout.read()
        assert time.monotonic() < deadline, "no rollout finished"
        time.sleep(0.2)
    job.send_signal(signal.SIGTERM)
    log, _ = job.communicate(timeout=120)
    assert job.returncode == 143
    assert "Traceback" not in log
    assert log.strip().splitlines()[-1] == (
        f"error: stopped by SIGTERM; finished rollouts are on disk in {out} "
        f"(rerun with output.dir={out} to resume)")
    assert len(_on_disk(out)) >= 2
    time.sleep(1)
    assert new_job_processes(before) == []
    assert not os.path.exists(out / "dataset")


def test_the_job_runs_on_the_per_command_sandbox_path(tmp_path, on_shared_engine):
    """env.sandbox.persistent=false, a sandbox per command (the other path of issue 26; the
    job's default is one per session): every record as sampled, every sandboxed call run, every
    session scored, nothing left running."""
    before = process_table()
    out = tmp_path / "run"
    job = _job("+experiment=swe_rl", f"output.dir={out}", "logger=none",
               "+env.sandbox.persistent=false", *on_shared_engine)
    log, _ = job.communicate(timeout=900)
    assert job.returncode == 0, log[-3000:]
    time.sleep(1)
    assert new_job_processes(before) == []
    ds = load_from_disk(str(out / "dataset"))
    assert len(ds) == 10
    assert check_records(ds, engines={"external"})["multi_turn"] >= 2
    check_behaviour(ds)  # `external`: our engine behind it, so its behaviour logprobs
    for row in ds:  # a bash call's output ends with the status its sandbox returned
        for call in (c for t in row["turns"] for c in t["tool_calls"] if c["name"] == "bash"):
            assert re.search(r"\n\[(exit code -?\d+|timed out)\]$", call["output"]), call
    assert all(row["reward_info"]["tests_total"] > 0 for row in ds if row["status"] == "ok")


def test_the_stock_constraint_runs_message_in_and_says_where_history_broke(tmp_path,
                                                                          on_shared_engine):
    """rollout.tool_constraint=stock: the server renders the conversation and parses calls
    itself; records count what its parser did, and each later turn's prefix break is named."""
    out = tmp_path / "run"
    job = _job("+experiment=swe_rl", f"output.dir={out}", "logger=none",
               "rollout.tool_constraint=stock", "rollout.max_tokens_per_turn=256",
               "rollout.max_turns=2", "env.max_tasks=2", "rollout.samples_per_task=2",
               *on_shared_engine)
    log, _ = job.communicate(timeout=900)
    assert job.returncode == 0, log[-3000:]
    ds = load_from_disk(str(out / "dataset"))
    assert len(ds) == 4 and set(ds["status"]) <= {"ok", "truncated"}
    for row in ds:
        for turn in row["turns"]:
            assert turn["constraint"] == "stock:tool_choice=required;strict=true;parallel=false"
            assert turn["prompt_token_ids"] and turn["completion_token_ids"]
        for brk in row["prefix_breaks"]:
            assert brk["turn"] >= 1 and brk["reason"] == (
                "the server rendered the prompt from messages (tool_constraint=stock)")
        assert row["prefix_consistent"] == (row["prefix_breaks"] == [])
        per_call = sum(len(c["issues"]) for t in row["turns"] for c in t["tool_calls"])
        per_turn = sum(len(t["issues"]) for t in row["turns"])
        dropped = sum(t["dropped_calls"] for t in row["turns"])
        counted = row["tool_call_issues"]
        assert sum(counted.values()) - counted["failed"] - counted["dropped"] == (
            per_call + per_turn)
        assert counted["dropped"] == dropped

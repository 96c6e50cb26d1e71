"""The eval sweep and the corpus export end to end on the embedded model (CI runs both)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import load_from_disk

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, check=False)


def test_a_tiny_sweep_writes_its_report_and_resumes(tmp_path):
    sweep = tmp_path / "sweep"
    args = ("rollout.run", "-m", "+experiment=eval_sweep", "env.max_tasks=2",
            "rollout.samples_per_task=2", "rollout.temperature=0.6,1.0", "logger=none",
            f"hydra.sweep.dir={sweep}")
    first = _run(*args)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    members = sorted(p.parent for p in sweep.glob("*/dataset"))
    assert [m.name.rsplit(",", 1)[1] for m in members] == ["rollout.temperature=0.6",
                                                           "rollout.temperature=1.0"]
    for member in members:
        records = load_from_disk(str(member / "dataset"))
        assert len(records) == 4  # 2 tasks x 2 samples
        summary = json.loads((member / "summary.json").read_text())
        # the members share one engine; each counts only its own prefix-cache hits
        assert summary["engine_0_prefix_hits"] == sum(
            t["cached_tokens"] for row in records for t in row["turns"])
    log = first.stdout + first.stderr
    assert log.count("starting vLLM engine") == 1 and "reusing the running serving cluster" in log
    assert (members[0] / "logs").is_dir() and not (members[1] / "logs").exists()
    report = (sweep / "report.md").read_text()
    assert "| rollout.temperature=0.6 | 4 | 2 |" in report and "pass@2" in report
    for png in ("pass_at_k.png", "by_difficulty.png", "cost.png", "paired.png"):
        assert (sweep / png).stat().st_size > 5000
    again = _run(*args)  # relaunched: finished members and rollouts are skipped
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.count("nothing left to run") + again.stderr.count(
        "nothing left to run") == 2
    (sweep / "report.md").unlink()
    regen = _run("rollout.reports.report", str(sweep), "--no-wandb")
    assert regen.returncode == 0 and (sweep / "report.md").read_text() == report


def test_a_bad_sweep_member_fails_before_any_engine_starts(tmp_path):
    bad = _run("rollout.run", "-m", "+experiment=eval_sweep", "rollout.temperature=0.6,hot",
               f"hydra.sweep.dir={tmp_path}")
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("error: sweep member `+experiment=eval_sweep "
                                         "rollout.temperature=hot`")
    assert not list(tmp_path.iterdir())


def test_a_tiny_corpus_export(tmp_path, on_shared_engine):
    out = tmp_path / "run"
    gen = _run("rollout.run", "+experiment=synth_corpus", "env.max_tasks=2",
               "rollout.samples_per_task=2", "corpus.min_reward=0",
               "corpus.statuses=[ok,truncated]", "logger=none", f"output.dir={out}",
               *on_shared_engine)
    assert gen.returncode == 0, gen.stderr[-2000:]
    records = {r["rollout_id"]: r for r in load_from_disk(str(out / "dataset"))}
    tokens = load_from_disk(str(out / "corpus" / "tokens"))
    sft = load_from_disk(str(out / "corpus" / "sft"))
    assert 1 <= len(tokens) == len(sft) <= 4
    for row in tokens:  # the sampled sequence itself, not a re-tokenization
        assert row["input_ids"] == records[row["rollout_id"]]["token_ids"]
    assert "rows kept of 4 records" in (out / "corpus" / "sft" / "README.md").read_text()
    empty = _run("rollout.reports.corpus", str(out), "corpus.min_reward=1.0")
    assert empty.returncode == 0
    assert "corpus: empty: every one of the 4 records was filtered out" in empty.stdout
    assert len(load_from_disk(str(out / "corpus" / "sft"))) == 0

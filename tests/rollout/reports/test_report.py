"""The sweep report from run folders: figures from the records, plots, one command."""

import json

from datasets import Dataset
from omegaconf import OmegaConf

from rollout.record import FEATURES, Job, Outcome, Provenance, SessionTrace, build_record
from rollout.reports.report import load_members, main, write_report
from tests.rollout.test_record import _turn

PROV = Provenance("run", "m", "/m", "h", 0, "{}")


def _member(sweep, name, overrides, passes, unscored=()):
    """A finished run folder: tasks t0..t3, 4 samples each; `passes[i]` of task i passed;
    `unscored` (task, sample) pairs ended in an infrastructure error instead."""
    run = sweep / name
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), run / ".hydra" / "overrides.yaml")
    OmegaConf.save(OmegaConf.create({"logger": {"backend": "none", "mode": "disabled"}}),
                   run / ".hydra" / "config.yaml")
    rows = []
    for t, c in enumerate(passes):
        for i in range(4):
            if (t, i) in unscored:
                rows.append(build_record(Job(f"t{t}", i), PROV,
                                         Outcome("infra_error", "error", "down")))
                continue
            trace = SessionTrace(turns=[_turn(0, [1, 2], [3])],
                                 labels=("easy" if t < 2 else "hard", f"mod{t % 2}"))
            rows.append(build_record(Job(f"t{t}", i), PROV,
                                     Outcome("ok", "submitted", reward=float(i < c)), trace))
    rows.append(build_record(Job("t0", 9), PROV, Outcome("infra_error", "error", "down")))
    Dataset.from_list(rows, features=FEATURES).save_to_disk(str(run / "dataset"))
    (run / "summary.json").write_text(json.dumps({"wall_s": 12.0}))


def test_the_report_has_pass_at_k_by_difficulty_and_a_paired_comparison(tmp_path):
    common = ["+experiment=eval_sweep", "env.max_tasks=4"]
    _member(tmp_path, "a", [*common, "rollout.temperature=0.6"], [0, 1, 2, 4])
    _member(tmp_path, "b", [*common, "rollout.temperature=1.0"], [4, 4, 2, 4])
    members = load_members(tmp_path)
    assert [m.name for m in members] == ["rollout.temperature=0.6", "rollout.temperature=1.0"]
    report = write_report(tmp_path, log_wandb=False).read_text()
    # a: pass@1 = (0 + .25 + .5 + 1) / 4 = 0.4375; pass@4 = (0 + 1 + 1 + 1) / 4 = 0.75
    assert "| rollout.temperature=0.6 | 17 | 4 | 0.438 [" in report  # 16 scored + 1 infra
    assert "| 0.750 [" in report
    assert "| rollout.temperature=0.6 | 0.125 | 0.750 |" in report  # easy, hard
    # b - a per task: 1, .75, 0, 0 -> mean 0.4375
    assert "pass@1 difference over the 4 tasks both ran: 0.438" in report
    assert "2 tasks better, 0 worse, 2 equal" in report
    for png in ("pass_at_k.png", "by_difficulty.png", "by_category.png", "cost.png",
                "paired.png"):
        assert (tmp_path / png).stat().st_size > 5000


def test_an_unscored_rollout_leaves_k_at_the_samples_per_task(tmp_path):
    """One task with 3 scored samples: pass@4 stays pass@4 over the other tasks (it used to
    become pass@3 for the whole sweep), and the report names the task it left out."""
    _member(tmp_path, "a", ["x=1"], [4, 1, 2, 4], unscored={(1, 3)})
    report = write_report(tmp_path, log_wandb=False).read_text()
    assert "pass@4" in report and "pass@3" not in report
    # pass@4 over t0, t2, t3 (4 samples each, at least one pass): 1.0
    assert "| a | 17 | 4 | " in report and "| 1.000 [1.000, 1.000] |" in report
    assert "a: pass@4 leaves out 1 task(s) with fewer than 4 scored samples: t1." in report


def test_the_command_regenerates_and_refuses_an_empty_folder(tmp_path, capsys):
    assert main([str(tmp_path), "--no-wandb"]) == 2
    assert "holds no run folder with a dataset" in capsys.readouterr().err
    _member(tmp_path, "a", ["x=1"], [1, 1, 1, 1])
    _member(tmp_path, "b", ["x=2"], [0, 0, 0, 0])
    assert main([str(tmp_path), "--no-wandb", "--compare", "x=2", "x=1"]) == 0
    assert "## Paired: x=1 minus x=2" in (tmp_path / "report.md").read_text()

"""The sweep report from run folders: figures from the records, plots, one command."""

import json
from fractions import Fraction
from pathlib import Path

import pytest
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from rollout.record import FEATURES, Job, Outcome, Provenance, SessionTrace, build_record
from rollout.reports.evals import task_results
from rollout.reports.report import Member, load_members, main, member_figures, write_report
from tests.rollout.reports.test_evals import _share_holding_a_pass
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


@settings(max_examples=100)
@given(samples=st.lists(st.tuples(st.sampled_from("abc"),
                                  st.sampled_from([None, 0.0, 0.5, 1.0])), max_size=10))
def test_a_members_figures_are_brute_force_pass_at_k_over_its_records(samples):
    """The report's pass@k and per-difficulty pass@1 come from the records as built: a
    rollout with no reward (an infrastructure error) counts in the rollouts, never as a fail;
    pass@k averages, over the tasks with k scored samples, the share of k-subsets holding a
    pass (reward 1.0: the default threshold); no task counted gives 0."""
    difficulty = {"a": "easy", "b": "hard", "c": "easy"}
    rows, scored = [], {}
    for i, (task, reward) in enumerate(samples):
        if reward is None:
            rows.append(build_record(Job(task, i), PROV, Outcome("infra_error", "error", "down")))
            continue
        trace = SessionTrace(turns=[_turn(0, [1, 2], [3])], labels=(difficulty[task], "m"))
        rows.append(build_record(Job(task, i), PROV, Outcome("ok", "submitted", reward=reward),
                                 trace))
        scored.setdefault(task, []).append(reward >= 1.0)
    figures = member_figures(Member("m", Path("m"), [], rows, {}, task_results(rows)), [1, 2, 3])
    assert (figures["rollouts"], figures["infra_error"]) == (
        len(samples), sum(r is None for _, r in samples))
    for k in (1, 2, 3):
        counted = [_share_holding_a_pass(o, k) for o in scored.values() if len(o) >= k]
        expected = sum(counted) / len(counted) if counted else 0
        assert figures[f"pass@{k}"].value == pytest.approx(float(expected), abs=1e-12)
    by_difficulty: dict[str, list[Fraction]] = {}
    for task, outcomes in scored.items():
        by_difficulty.setdefault(difficulty[task], []).append(Fraction(sum(outcomes),
                                                                      len(outcomes)))
    assert figures["by_difficulty"] == pytest.approx(
        {g: float(sum(v) / len(v)) for g, v in by_difficulty.items()}, abs=1e-12)


def test_a_members_counts_rates_and_means_are_its_records():
    def row(status, turns, calls, invalid, failed, reward=1.0):
        return {"task_id": "t", "reward": reward, "status": status, "num_turns": turns,
                "completion_tokens": 10 * turns, "prompt_tokens": 100 * turns,
                "num_tool_calls": calls, "num_invalid_tool_calls": invalid,
                "tool_call_issues": {"failed": failed}}
    rows = [row("ok", 2, 3, 1, 0), row("error", 1, 1, 0, 1, None),
            row("infra_error", 0, 0, 0, 0, None), row("ok", 3, 4, 1, 2, 0.0)]
    figures = member_figures(Member("m", Path("m"), [], rows, {"wall_s": 12.5},
                                    task_results(rows)), [1])
    assert {k: figures[k] for k in ("rollouts", "tasks", "infra_error", "error", "mean_turns",
                                     "mean_completion_tokens", "mean_prompt_tokens",
                                     "invalid_call_rate", "failed_call_rate", "wall_s")} == {
        "rollouts": 4, "tasks": 1, "infra_error": 1, "error": 1, "mean_turns": 1.5,
        "mean_completion_tokens": 15.0, "mean_prompt_tokens": 150.0,
        "invalid_call_rate": 0.25, "failed_call_rate": 0.375, "wall_s": 12.5}
    empty = member_figures(Member("e", Path("e"), [], [], {}, {}), [1])
    assert [empty[k] for k in ("mean_turns", "mean_completion_tokens", "mean_prompt_tokens",
                               "invalid_call_rate", "failed_call_rate", "wall_s")] == [0.0] * 6


def test_comparing_members_that_are_not_there_names_them_and_the_members(tmp_path):
    for name, passes in (("a", [1, 0]), ("b", [1, 1])):
        _member(tmp_path, name, [f"x={name}"], passes)
    with pytest.raises(KeyError, match=r"no member named \['nope'\]; members: \["):
        write_report(tmp_path, compare=("x=a", "nope"), log_wandb=False)

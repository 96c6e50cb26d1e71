"""A sweep's report, from its run folders alone: `python -m rollout.reports.report SWEEP_DIR`.

Each member of a Hydra multirun (`python -m rollout.run -m +experiment=eval_sweep ...`) is an
ordinary run folder under the sweep folder. This reads their datasets (never a live run) and
writes SWEEP_DIR/report.md with PNG plots beside it, and the same figures to wandb (offline
unless the members' logger says otherwise). A sweep writes it when its last member ends
(`SweepReport`, a Hydra callback); rerunning the command regenerates it without rerunning
anything.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import load_from_disk
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rollfleet.run_dir import RunDir
from rollout.reports.evals import (
    Estimate,
    TaskResult,
    bootstrap,
    mean_pass_at_k,
    paired_difference,
    short_tasks,
    task_results,
)

PLOTS = ("pass_at_k.png", "by_difficulty.png", "by_category.png", "cost.png", "paired.png")


@dataclass
class Member:
    name: str  # the overrides that set it apart from the other members
    path: Path
    overrides: list[str]
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    tasks: dict[str, TaskResult] = field(default_factory=dict)


def load_members(sweep_dir: Path) -> list[Member]:
    members = []
    for dataset in sorted(sweep_dir.glob(f"*/{RunDir(Path()).dataset.name}")):
        run = RunDir(dataset.parent)
        overrides = (list(OmegaConf.load(run.overrides_file)) if run.overrides_file.is_file()
                     else [])
        records = load_from_disk(str(run.dataset)).to_list()
        members.append(Member(run.path.name, run.path, [str(o) for o in overrides], records,
                              run.summary(), task_results(records)))
    if not members:
        raise FileNotFoundError(f"{sweep_dir} holds no run folder with a dataset/ "
                                "(is it a sweep folder whose members finished?)")
    shared = set.intersection(*(set(m.overrides) for m in members))
    for m in members:
        m.name = " ".join(o for o in m.overrides if o not in shared) or m.path.name
    return members


def _fmt(e: Estimate) -> str:
    return f"{e.value:.3f} [{e.low:.3f}, {e.high:.3f}]"


def member_figures(m: Member, ks: list[int]) -> dict[str, Any]:
    tasks = list(m.tasks.values())
    rows = m.records
    calls = sum(r["num_tool_calls"] for r in rows)
    out: dict[str, Any] = {
        "rollouts": len(rows), "tasks": len(tasks),
        "infra_error": sum(r["status"] == "infra_error" for r in rows),
        "error": sum(r["status"] == "error" for r in rows),
        "mean_turns": statistics.fmean(r["num_turns"] for r in rows) if rows else 0.0,
        "mean_completion_tokens": statistics.fmean(r["completion_tokens"] for r in rows)
        if rows else 0.0,
        "mean_prompt_tokens": statistics.fmean(r["prompt_tokens"] for r in rows) if rows else 0.0,
        "invalid_call_rate": sum(r["num_invalid_tool_calls"] for r in rows) / calls
        if calls else 0.0,
        "failed_call_rate": sum(r["tool_call_issues"]["failed"] for r in rows) / calls
        if calls else 0.0,
        "wall_s": m.summary.get("wall_s", 0.0),
    }
    for k in ks:
        out[f"pass@{k}"] = bootstrap(tasks, lambda ts, k=k: mean_pass_at_k(ts, k))
    for key, attr in (("by_difficulty", "difficulty"), ("by_category", "category")):
        groups: dict[str, list[TaskResult]] = defaultdict(list)
        for t in tasks:
            groups[getattr(t, attr) or "(none)"].append(t)
        out[key] = {g: mean_pass_at_k(ts, 1) for g, ts in sorted(groups.items())}
    return out


def write_report(sweep_dir: Path, compare: tuple[str, str] | None = None,
                 log_wandb: bool = True) -> Path:
    members = load_members(sweep_dir)
    # k = the samples per task: a task with fewer scored samples (an unscored rollout) is left
    # out of pass@k, never turning the whole sweep's pass@4 into pass@3
    n_max = max((t.n for m in members for t in m.tasks.values()), default=1)
    ks = sorted({1, n_max})
    figures = {m.name: member_figures(m, ks) for m in members}
    pair = _pair(members, compare)
    paired = paired_difference(pair[0].tasks, pair[1].tasks) if pair else None
    _plots(sweep_dir, members, figures, ks, pair, paired)
    report = sweep_dir / "report.md"
    report.write_text(_markdown(sweep_dir, members, figures, ks, pair, paired))
    if log_wandb:
        _log_wandb(sweep_dir, members, figures, ks)
    return report


def _pair(members: list[Member], compare: tuple[str, str] | None
          ) -> tuple[Member, Member] | None:
    if compare:
        by_name = {m.name: m for m in members} | {m.path.name: m for m in members}
        missing = [c for c in compare if c not in by_name]
        if missing:
            raise KeyError(f"no member named {missing}; members: {[m.name for m in members]}")
        return by_name[compare[0]], by_name[compare[1]]
    return (members[0], members[1]) if len(members) >= 2 else None


def _markdown(sweep_dir, members, figures, ks, pair, paired) -> str:
    lines = [f"# Sweep report: {sweep_dir.name}", "",
             f"{len(members)} configurations. pass@k: the unbiased estimator per task "
             "(1 - C(n-c, k) / C(n, k)), averaged over tasks; [95% interval] from 2,000 "
             "bootstrap resamples of the tasks. Unscored rollouts (infrastructure or code "
             "errors) are left out.", ""]
    head = ["configuration", "rollouts", "tasks", *[f"pass@{k}" for k in ks], "turns",
            "completion tok", "prompt tok", "invalid calls", "failed calls", "infra err",
            "wall s"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in members:
        f = figures[m.name]
        cells = [m.name, f["rollouts"], f["tasks"], *[_fmt(f[f"pass@{k}"]) for k in ks],
                 f"{f['mean_turns']:.2f}", f"{f['mean_completion_tokens']:.0f}",
                 f"{f['mean_prompt_tokens']:.0f}", f"{f['invalid_call_rate']:.1%}",
                 f"{f['failed_call_rate']:.1%}", f["infra_error"], f"{f['wall_s']:.0f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    for m in members:
        for k in ks:
            short = short_tasks(list(m.tasks.values()), k)
            if short:
                lines += ["", f"{m.name}: pass@{k} leaves out {len(short)} task(s) with fewer "
                          f"than {k} scored samples: {', '.join(short)}."]
    for key, title in (("by_difficulty", "difficulty"), ("by_category", "category")):
        groups = sorted({g for f in figures.values() for g in f[key]})
        lines += ["", f"## pass@1 by task {title}", "",
                  "| configuration | " + " | ".join(groups) + " |",
                  "|" + "---|" * (len(groups) + 1)]
        for m in members:
            vals = figures[m.name][key]
            lines.append(f"| {m.name} | " + " | ".join(
                f"{vals[g]:.3f}" if g in vals else "-" for g in groups) + " |")
    if pair:
        est, diffs = paired
        lines += ["", f"## Paired: {pair[1].name} minus {pair[0].name}", "",
                  f"pass@1 difference over the {len(diffs)} tasks both ran: {_fmt(est)}; "
                  f"{sum(d > 0 for d in diffs.values())} tasks better, "
                  f"{sum(d < 0 for d in diffs.values())} worse, "
                  f"{sum(d == 0 for d in diffs.values())} equal."]
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in PLOTS if (sweep_dir / p).exists()]
    lines += ["", "## Members", ""] + [f"- `{m.path.name}`: {' '.join(m.overrides)}"
                                      for m in members]
    return "\n".join(lines) + "\n"


def _plots(out: Path, members, figures, ks, pair, paired) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [m.name for m in members]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(names)), 4))
    width = 0.8 / len(ks)
    for i, k in enumerate(ks):
        ests = [figures[n][f"pass@{k}"] for n in names]
        ax.bar([p + i * width for p in x], [e.value for e in ests], width, label=f"pass@{k}",
               yerr=[[e.value - e.low for e in ests], [e.high - e.value for e in ests]],
               capsize=4)
    ax.set_xticks([p + width * (len(ks) - 1) / 2 for p in x], names, rotation=15, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass rate (95% task-bootstrap interval)")
    ax.set_title("pass@k per configuration")
    ax.legend()
    _save(fig, out / "pass_at_k.png")
    for key, title in (("by_difficulty", "difficulty"), ("by_category", "category")):
        groups = sorted({g for f in figures.values() for g in f[key]})
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(groups) * len(names)), 4))
        width = 0.8 / len(names)
        for i, n in enumerate(names):
            ax.bar([g + i * width for g in range(len(groups))],
                   [figures[n][key].get(g, 0.0) for g in groups], width, label=n)
        ax.set_xticks([g + width * (len(names) - 1) / 2 for g in range(len(groups))], groups,
                      rotation=30, ha="right")
        ax.set_ylim(0, 1)
        ax.set_ylabel("pass@1")
        ax.set_title(f"pass@1 by task {title}")
        ax.legend()
        _save(fig, out / f"{key}.png")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, key, label in zip(axes, ("mean_completion_tokens", "mean_turns", "wall_s"),
                              ("completion tokens / rollout", "turns / rollout", "wall s"),
                              strict=True):
        ax.bar(x, [figures[n][key] for n in names])
        ax.set_xticks(list(x), names, rotation=15, ha="right")
        ax.set_title(label)
    _save(fig, out / "cost.png")
    if pair:
        est, diffs = paired
        fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(diffs)), 4))
        tids = sorted(diffs, key=diffs.get)
        ax.bar(range(len(tids)), [diffs[t] for t in tids])
        ax.axhline(est.value, color="black", label=f"mean {est.value:+.3f}")
        ax.axhspan(est.low, est.high, alpha=0.2, label="95% interval")
        ax.set_xticks(range(len(tids)), tids, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("pass@1 difference")
        ax.set_title(f"{pair[1].name} minus {pair[0].name}, per task")
        ax.legend()
        _save(fig, out / "paired.png")


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)


def _log_wandb(sweep_dir: Path, members: list[Member], figures, ks) -> None:
    cfg_file = RunDir(members[0].path).config_file
    logger = OmegaConf.load(cfg_file).get("logger", {}) if cfg_file.is_file() else {}
    if logger.get("backend", "wandb") != "wandb" or logger.get("mode") == "disabled":
        return
    import wandb

    run = wandb.init(project=logger.get("project", "rollfleet"), entity=logger.get("entity"),
                     name=f"report-{sweep_dir.name}", dir=str(sweep_dir),
                     mode=logger.get("mode", "offline"), job_type="sweep-report",
                     settings=wandb.Settings(console="off", x_disable_stats=True))
    columns = ["configuration", *[f"pass@{k}" for k in ks], *[f"pass@{k}_low" for k in ks],
               *[f"pass@{k}_high" for k in ks], "mean_turns", "mean_completion_tokens",
               "invalid_call_rate", "wall_s"]
    table = wandb.Table(columns=columns)
    for m in members:
        f = figures[m.name]
        table.add_data(m.name, *[f[f"pass@{k}"].value for k in ks],
                       *[f[f"pass@{k}"].low for k in ks], *[f[f"pass@{k}"].high for k in ks],
                       f["mean_turns"], f["mean_completion_tokens"], f["invalid_call_rate"],
                       f["wall_s"])
    run.log({"sweep/summary": table,
             **{f"sweep/{p[:-4]}": wandb.Image(str(sweep_dir / p))
                for p in PLOTS if (sweep_dir / p).exists()}})
    run.finish()


class SweepReport(Callback):
    """Hydra callback (`hydra.callbacks` in conf/experiment/eval_sweep.yaml): the report once
    the last member of a multirun has ended."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        report = write_report(Path(config.hydra.sweep.dir))
        print(f"sweep report: {report}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="Write a sweep's report from its run folders.")
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"),
                    help="the two configurations of the paired comparison (default: first two)")
    ap.add_argument("--no-wandb", action="store_true")
    args = ap.parse_args(argv)
    try:
        report = write_report(args.sweep_dir, tuple(args.compare) if args.compare else None,
                              not args.no_wandb)
    except (FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"sweep report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Eval statistics over records: pass@k with the unbiased estimator, bootstrap intervals.

pass@k for one task with n samples of which c passed is 1 - C(n-c, k) / C(n, k): the chance that
k samples drawn without replacement from the n contain a pass (Chen et al. 2021, "Evaluating
Large Language Models Trained on Code"). A configuration's pass@k is its mean over tasks, and its
interval resamples TASKS with replacement (the samples of one task are not independent draws).
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from math import comb
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass(frozen=True)
class TaskResult:
    """One task's samples in one configuration."""

    task_id: str
    n: int
    passed: int
    difficulty: str = "unknown"
    category: str = ""


def task_results(records: Iterable[dict[str, Any]], threshold: float = 1.0
                 ) -> dict[str, TaskResult]:
    """Scored records grouped by task; a sample passes with reward >= threshold. Records that
    were never scored (infrastructure errors, code errors) are left out, not counted as fails."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["reward"] is not None:
            groups[r["task_id"]].append(r)
    return {tid: TaskResult(tid, len(rs), sum(r["reward"] >= threshold for r in rs),
                            rs[0].get("task_difficulty") or "unknown",
                            rs[0].get("task_category") or "")
            for tid, rs in groups.items()}


def mean_pass_at_k(tasks: list[TaskResult], k: int) -> float:
    """pass@k averaged over the tasks that have at least k scored samples (a task with fewer
    has no unbiased pass@k; the report says which tasks those are)."""
    counted = [t for t in tasks if t.n >= k]
    return statistics.fmean(pass_at_k(t.n, t.passed, k) for t in counted) if counted else 0.0


def short_tasks(tasks: list[TaskResult], k: int) -> list[str]:
    """The tasks pass@k leaves out: fewer than k scored samples."""
    return sorted(t.task_id for t in tasks if t.n < k)


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float


def bootstrap(items: list, stat: Callable[[list], float], iters: int = 2000,
              seed: int = 0, level: float = 0.95) -> Estimate:
    """`stat` over `items`, with a percentile interval from resampling the items."""
    if not items:
        return Estimate(0.0, 0.0, 0.0)
    rng = random.Random(seed)
    draws = sorted(stat([rng.choice(items) for _ in items]) for _ in range(iters))
    lo = draws[int((1 - level) / 2 * iters)]
    hi = draws[min(iters - 1, int((1 + level) / 2 * iters))]
    return Estimate(stat(items), lo, hi)


def paired_difference(a: dict[str, TaskResult], b: dict[str, TaskResult], k: int = 1,
                      iters: int = 2000, seed: int = 0) -> tuple[Estimate, dict[str, float]]:
    """pass@k of B minus A over the tasks both ran: the mean and its task-bootstrap interval,
    and the per-task differences."""
    shared = sorted(set(a) & set(b))
    diffs = {t: pass_at_k(b[t].n, b[t].passed, k) - pass_at_k(a[t].n, a[t].passed, k)
             for t in shared}
    return bootstrap(list(diffs.values()), statistics.fmean, iters, seed), diffs

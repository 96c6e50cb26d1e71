"""pass@k and its intervals, against values worked out by hand."""

import pytest

from rollout.reports.evals import (
    TaskResult,
    bootstrap,
    mean_pass_at_k,
    paired_difference,
    pass_at_k,
    task_results,
)


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert pass_at_k(5, 3, 3) == 1.0  # only 2 fail: any 3 samples hold a pass
    with pytest.raises(ValueError, match="at least 6 samples"):
        pass_at_k(5, 2, 6)


def test_unscored_records_are_left_out_not_failed():
    rows = [{"task_id": "a", "reward": 1.0}, {"task_id": "a", "reward": 0.0},
            {"task_id": "a", "reward": None}, {"task_id": "b", "reward": 0.0}]
    tasks = task_results(rows)
    assert (tasks["a"].n, tasks["a"].passed, tasks["b"].n) == (2, 1, 1)
    assert mean_pass_at_k(list(tasks.values()), 1) == pytest.approx((0.5 + 0.0) / 2)


def test_the_interval_holds_the_estimate_and_resamples_tasks():
    tasks = [TaskResult(str(i), 4, i % 5) for i in range(20)]
    est = bootstrap(tasks, lambda ts: mean_pass_at_k(ts, 1))
    assert est.low <= est.value <= est.high and est.high - est.low > 0.05
    same = [TaskResult(str(i), 4, 2) for i in range(20)]
    flat = bootstrap(same, lambda ts: mean_pass_at_k(ts, 1))
    assert flat.low == flat.value == flat.high == 0.5


def test_paired_difference_counts_shared_tasks_only():
    a = {"x": TaskResult("x", 2, 0), "y": TaskResult("y", 2, 1), "only_a": TaskResult("z", 2, 2)}
    b = {"x": TaskResult("x", 2, 2), "y": TaskResult("y", 2, 1)}
    est, diffs = paired_difference(a, b)
    assert diffs == {"x": 1.0, "y": 0.0}
    assert est.value == pytest.approx(0.5)

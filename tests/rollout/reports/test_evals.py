"""pass@k and its intervals, against values worked out by hand."""

import itertools
import statistics
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.reports.evals import (
    Estimate,
    TaskResult,
    bootstrap,
    mean_pass_at_k,
    paired_difference,
    pass_at_k,
    short_tasks,
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


# -- properties against brute force: every k-subset of the samples, counted ---------------------

def _share_holding_a_pass(outcomes: list[bool], k: int) -> Fraction:
    """Of all k-subsets of the samples, the share that hold a pass: what pass@k estimates."""
    subsets = list(itertools.combinations(outcomes, k))
    return Fraction(sum(any(s) for s in subsets), len(subsets))


@settings(max_examples=200)
@given(n=st.integers(0, 9), data=st.data())
def test_pass_at_k_is_the_share_of_k_subsets_that_hold_a_pass(n, data):
    """The estimator is unbiased only if it equals the subset count, at every edge: c = 0,
    c = n, k = n, k = 0 (nothing drawn, nothing passes); k > n has no such subsets and is
    refused rather than guessed."""
    c = data.draw(st.integers(0, n), label="c")
    k = data.draw(st.integers(0, n + 2), label="k")
    if k > n:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)
        return
    outcomes = [True] * c + [False] * (n - c)
    assert pass_at_k(n, c, k) == pytest.approx(float(_share_holding_a_pass(outcomes, k)),
                                               abs=1e-12)


_record = st.fixed_dictionaries({
    "task_id": st.sampled_from("abcd"),
    "reward": st.one_of(st.sampled_from([None, 0.0, 0.5, 1.0]), st.floats(0, 1)),
})


@settings(max_examples=300)
@given(records=st.lists(_record, max_size=16), k=st.integers(1, 5),
       threshold=st.sampled_from([0.5, 1.0]))
def test_mean_pass_at_k_over_records_is_brute_force_over_scored_samples(records, k, threshold):
    """A configuration's pass@k: unscored rollouts are neither passes nor fails (they say
    nothing of the model), a sample passes at reward >= threshold, and only tasks with at
    least k scored samples are averaged (the rest are named as short, an all-unscored task
    is not there at all); no counted task gives 0."""
    scored: dict[str, list[bool]] = {}
    for r in records:
        if r["reward"] is not None:
            scored.setdefault(r["task_id"], []).append(r["reward"] >= threshold)
    tasks = task_results(records, threshold)
    assert {t: (r.n, r.passed) for t, r in tasks.items()} == {
        t: (len(o), sum(o)) for t, o in scored.items()}
    counted = [_share_holding_a_pass(o, k) for o in scored.values() if len(o) >= k]
    expected = sum(counted) / len(counted) if counted else 0
    assert mean_pass_at_k(list(tasks.values()), k) == pytest.approx(float(expected), abs=1e-12)
    assert short_tasks(list(tasks.values()), k) == sorted(
        t for t, o in scored.items() if len(o) < k)


_task = st.integers(1, 6).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n)))


@settings(max_examples=200)
@given(a=st.dictionaries(st.sampled_from("vwxyz"), _task),
       b=st.dictionaries(st.sampled_from("vwxyz"), _task), k=st.integers(1, 3))
def test_paired_difference_is_the_mean_over_shared_tasks_of_b_minus_a(a, b, k):
    """A paired comparison must pair: per task both ran, B's pass@k minus A's, by subset count;
    tasks with fewer than k samples on either side have no pass@k and must raise."""
    a_tasks = {t: TaskResult(t, n, c) for t, (n, c) in a.items()}
    b_tasks = {t: TaskResult(t, n, c) for t, (n, c) in b.items()}
    shared = sorted(set(a) & set(b))
    if any(min(a[t][0], b[t][0]) < k for t in shared):
        with pytest.raises(ValueError):
            paired_difference(a_tasks, b_tasks, k, iters=50)
        return
    est, diffs = paired_difference(a_tasks, b_tasks, k, iters=50)
    expected = {t: _share_holding_a_pass([True] * b[t][1] + [False] * (b[t][0] - b[t][1]), k)
                - _share_holding_a_pass([True] * a[t][1] + [False] * (a[t][0] - a[t][1]), k)
                for t in shared}
    assert diffs == pytest.approx({t: float(d) for t, d in expected.items()}, abs=1e-12)
    mean = sum(expected.values()) / len(expected) if expected else 0
    assert est.value == pytest.approx(float(mean), abs=1e-12)


@settings(max_examples=200)
@given(items=st.lists(st.floats(0, 1), min_size=1, max_size=8),
       level=st.sampled_from([0.0, 0.5, 0.95, 1.0]), iters=st.integers(1, 60))
def test_a_bootstrap_interval_is_ordered_and_within_what_resampling_can_give(items, level,
                                                                               iters):
    """A resample's mean lies between the smallest and largest item, so the interval must too,
    low <= high at any level (1.0 included: the last draw, not one past it), and the value is
    the statistic of the items themselves."""
    est = bootstrap(items, statistics.fmean, iters=iters, level=level)
    assert min(items) - 1e-12 <= est.low <= est.high <= max(items) + 1e-12
    assert est.value == pytest.approx(statistics.fmean(items))


def test_a_task_keeps_the_labels_of_its_records_or_says_unknown():
    records = [{"task_id": "a", "reward": 1.0, "task_difficulty": "hard",
                "task_category": "strings"},
               {"task_id": "b", "reward": 0.0, "task_difficulty": None, "task_category": None},
               {"task_id": "c", "reward": 0.0}]
    got = task_results(records)
    assert [(t.difficulty, t.category) for t in got.values()] == [
        ("hard", "strings"), ("unknown", ""), ("unknown", "")]


def test_an_interval_is_the_resampled_statistic_at_its_level_s_quantiles():
    """A statistic that counts its calls draws 0, 1, ... iters - 1: the interval's ends are the
    draws at (1 - level) / 2 and (1 + level) / 2 of them (as floats compute them: 0.1 / 2 of
    200 is 9.999...), the value the next call."""
    def counter():
        calls = iter(range(10**6))
        return lambda items: next(calls)
    assert bootstrap([1, 2], counter(), iters=200, level=0.9) == Estimate(200, 9, 190)
    assert bootstrap([1, 2], counter(), iters=200) == Estimate(200, 5, 195)  # level 0.95
    assert bootstrap([], statistics.fmean) == Estimate(0.0, 0.0, 0.0)


def test_intervals_are_the_same_for_the_same_seed_and_the_defaults_are_seed_0_2000_draws():
    items = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert bootstrap(items, statistics.fmean) == bootstrap(items, statistics.fmean, 2000, 0)
    a = {f"t{i}": TaskResult(f"t{i}", 10, i % 11) for i in range(12)}
    b = {f"t{i}": TaskResult(f"t{i}", 10, 3 * i % 11) for i in range(12)}
    diffs = {t: pass_at_k(10, b[t].passed, 1) - pass_at_k(10, a[t].passed, 1) for t in sorted(a)}
    assert paired_difference(a, b) == (bootstrap(list(diffs.values()), statistics.fmean, 2000, 0),
                                       diffs)
    assert paired_difference(a, b, seed=5)[0] == bootstrap(list(diffs.values()),
                                                           statistics.fmean, 2000, 5)
    assert paired_difference(a, b, seed=5)[0] != paired_difference(a, b)[0]

"""The RL loop's job source: whole groups, task after task, never more than `ahead` groups
waiting for the trainer; and its hand-over: no group older than the lag bound reaches it."""

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollfleet.cli import ConfigError
from rollout.rl.loop import Group, GroupSource, Rollouts


def _drain(source: GroupSource) -> list:
    jobs = []
    while (job := source.take()) is not None:
        jobs.append(job)
    return jobs


def test_groups_are_whole_and_go_round_the_tasks():
    source = GroupSource(["a", "b"], samples=3, ahead=3)
    jobs = _drain(source)
    assert [(j.task_id, j.group) for j in jobs] == [
        ("a", 0)] * 3 + [("b", 1)] * 3 + [("a", 2)] * 3
    assert len({j.rollout_id for j in jobs}) == 9  # a new round is new samples, not repeats
    assert not source.finished()


def test_no_group_starts_while_ahead_groups_wait_for_the_trainer():
    source = GroupSource(["a"], samples=2, ahead=2)
    assert len(_drain(source)) == 4  # two groups, then nothing
    source.consumed(1)  # the trainer took one: one more may start
    assert [j.group for j in _drain(source)] == [2, 2]
    source.stop()
    source.consumed(5)
    assert source.take() is None and source.finished()


def test_a_group_is_mixed_when_its_turns_span_versions():
    one = {"policy_versions": [1], "reward": 1.0}
    assert not Group("g", [one, one]).mixed
    mixed = Group("g", [one, {"policy_versions": [1, 2], "reward": None}])
    assert mixed.mixed and mixed.versions == [1, 2] and mixed.rewards == [1.0, None]


def test_a_resampled_task_starts_before_any_new_one():
    source = GroupSource(["a", "b", "c"], samples=1, ahead=10)
    assert [j.task_id for j in (source.take(), source.take())] == ["a", "b"]
    source.resample("a")
    assert [j.task_id for j in (source.take(), source.take())] == ["a", "c"]


def _rollouts(k, stale_groups="drop", served=0):
    """The trainer's side of Rollouts around a fleet that never starts: groups put straight
    into its queue, the served version set by hand."""
    rollouts = Rollouts(["+experiment=rl_loop", "logger=none"], groups_per_step=1, ahead=100,
                        max_off_policy_steps=k, stale_groups=stale_groups)
    rollouts.source = GroupSource(["t"], samples=1, ahead=100)
    rollouts.cluster = types.SimpleNamespace(roster=types.SimpleNamespace(policy_version=served))
    return rollouts


def _group(name, versions):
    return Group(name, [{"task_id": name, "policy_versions": versions, "reward": 1.0}])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 4), st.integers(0, 8),
       st.lists(st.lists(st.integers(0, 8), max_size=3), min_size=1, max_size=12),
       st.sampled_from(["drop", "resample"]))
def test_no_group_older_than_k_is_ever_handed_to_the_trainer(k, served, groups, stale):
    rollouts = _rollouts(k, stale, served)
    made = [_group(f"g{i}", sorted({min(v, served) for v in vs})) for i, vs in enumerate(groups)]
    for g in made:
        rollouts._ready.put(g)
    fresh = [g for g in made if not g.versions or served - g.versions[0] <= k]
    got = rollouts.next_groups(len(fresh), timeout_s=0.01) if fresh else []
    assert [g.group_id for g in got] == [g.group_id for g in fresh]
    assert all(g.lag <= k for g in got)
    stats = rollouts.group_stats
    dropped = [g for g in made[:made.index(fresh[-1]) + 1] if g not in fresh] if fresh else []
    assert stats.dropped == len(dropped) and stats.handed == len(fresh)
    assert stats.resampled == (len(dropped) if stale == "resample" else 0)
    assert rollouts.source.again == ([g.task_id for g in dropped] if stale == "resample"
                                     else [])


def test_a_group_exactly_k_versions_old_is_handed_over_and_one_more_is_not():
    rollouts = _rollouts(k=2, served=5)
    rollouts.source.started = 2  # the two below, both finished
    rollouts._ready.put(_group("old", [2, 5]))  # oldest token 3 versions back
    rollouts._ready.put(_group("edge", [3, 4]))  # 2 back: the bound itself
    [got] = rollouts.next_groups(1, timeout_s=0.01)
    assert (got.group_id, got.lag) == ("edge", 2)
    assert rollouts.group_stats.as_dict() == {"handed": 1, "dropped": 1, "resampled": 0,
                                              "lags": {"2": 1}, "carried": [0]}
    with pytest.raises(TimeoutError):
        rollouts.next_groups(1, timeout_s=0.01)


def test_a_bad_bound_is_refused_before_anything_starts():
    with pytest.raises(ConfigError, match="max_off_policy_steps"):
        Rollouts(["+experiment=rl_loop"], max_off_policy_steps=-1)
    with pytest.raises(ConfigError, match="stale_groups"):
        Rollouts(["+experiment=rl_loop"], stale_groups="keep")


def test_a_step_takes_the_first_groups_to_finish_and_counts_those_still_sampling():
    """Over-sampling with early stop: `ahead` groups sample at once, a step takes the first
    that finish, the others go on into the next step and are counted there."""
    rollouts = _rollouts(k=None)
    rollouts.source = GroupSource(["a", "b", "c"], samples=1, ahead=3)
    started = _drain(rollouts.source)  # three groups sampling
    assert len(started) == 3
    rollouts._ready.put(_group("c", [0]))  # the last started finishes first
    rollouts._ready.put(_group("a", [0]))
    assert [g.group_id for g in rollouts.next_groups(1, timeout_s=0.01)] == ["c"]
    assert rollouts.group_stats.carried == [1]  # a is done and waits; b still samples
    assert [j.task_id for j in _drain(rollouts.source)] == ["a"]  # c's place: a new group
    assert [g.group_id for g in rollouts.next_groups(1, timeout_s=0.01)] == ["a"]
    assert rollouts.group_stats.carried == [1, 2]  # b and the new one


def test_a_group_s_samples_are_numbered_on_from_the_last_group_s():
    """Sample indices 0, 1, 2 for the first group of three, 3, 4, 5 for the next: a rollout's
    id (task/sample) never names a sample of another group."""
    source = GroupSource(["a", "b"], samples=3, ahead=3)
    assert [(j.task_id, j.group, j.sample_index) for j in _drain(source)] == [
        ("a", 0, 0), ("a", 0, 1), ("a", 0, 2), ("b", 1, 3), ("b", 1, 4), ("b", 1, 5),
        ("a", 2, 6), ("a", 2, 7), ("a", 2, 8)]

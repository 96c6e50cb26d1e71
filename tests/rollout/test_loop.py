"""The RL loop's job source: whole groups, task after task, never more than `ahead` groups
waiting for the trainer."""

from rollout.loop import Group, GroupSource


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

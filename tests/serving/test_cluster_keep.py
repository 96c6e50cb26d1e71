"""`running_cluster`'s rules for a kept cluster (a sweep's members), on a stand-in cluster (the
real one is kept in tests/e2e/test_eval_and_corpus.py::
test_a_tiny_sweep_writes_its_report_and_resumes)."""

from pathlib import Path

import pytest

from serving import ModelConfig, ServingConfig, cluster


class StandIn:
    events: list[str] = []

    def __init__(self, serving, model, run_dir, cache_dir) -> None:
        self.run_dir, self.name = run_dir, f"{serving.mode}@{run_dir.name}"

    def __enter__(self) -> str:
        StandIn.events.append(f"start {self.name}")
        return f"endpoint of {self.name}"

    def __exit__(self, *exc) -> None:
        self.stop()

    def __str__(self) -> str:
        return f"endpoint of {self.name}"

    def stop(self) -> None:
        StandIn.events.append(f"stop {self.name}")


@pytest.fixture
def share(monkeypatch) -> cluster._KeptCluster:
    monkeypatch.setattr(cluster, "Cluster", StandIn)
    monkeypatch.setattr(cluster, "KEPT", cluster._KeptCluster())
    StandIn.events = []
    return cluster.KEPT


def _use(share, mode: str, member: str, keep: bool = True) -> str:
    with cluster.running_cluster(ServingConfig(mode=mode), ModelConfig(), Path(member),
                                 Path("cache"), keep=keep) as cl:
        return str(cl)


def test_members_with_equal_settings_share_one_cluster_until_the_end(share):
    assert _use(share, "embedded", "a") == _use(share, "embedded", "b") == "endpoint of embedded@a"
    assert StandIn.events == ["start embedded@a"]
    share.stop()
    share.stop()  # at exit too: once is enough
    assert StandIn.events == ["start embedded@a", "stop embedded@a"]


def test_other_settings_stop_the_cluster_before_theirs_starts(share):
    _use(share, "embedded", "a")
    assert _use(share, "kv_routed", "b") == "endpoint of kv_routed@b"
    assert StandIn.events == ["start embedded@a", "stop embedded@a", "start kv_routed@b"]


def test_a_failed_member_stops_it_and_the_next_starts_afresh(share):
    with pytest.raises(KeyboardInterrupt), cluster.running_cluster(
            ServingConfig(), ModelConfig(), Path("a"), Path("cache"), keep=True):
        raise KeyboardInterrupt
    assert _use(share, "embedded", "b") == "endpoint of embedded@b"
    assert StandIn.events == ["start embedded@a", "stop embedded@a", "start embedded@b"]


def test_a_job_of_its_own_stops_its_cluster_at_the_end_and_leaves_a_kept_one_alone(share):
    _use(share, "embedded", "a")
    assert _use(share, "kv_routed", "job", keep=False) == "endpoint of kv_routed@job"
    assert StandIn.events == ["start embedded@a", "start kv_routed@job", "stop kv_routed@job"]
    assert _use(share, "embedded", "b") == "endpoint of embedded@a"  # still kept

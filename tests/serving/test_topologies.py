"""The topology registry: every name loads its module's Topology, which names its workers."""

import threading
from pathlib import Path

import pytest

from serving import ModelConfig, ServingConfig, ServingError
from serving.checkpoints import PolicyCheckpoint
from serving.config import ServingConfig as Config
from serving.topologies import TOPOLOGIES, topology_class
from serving.topologies.base import Placement, Topology


def _topology(**settings) -> Topology:
    cfg = ServingConfig(**settings)
    where = Placement(cfg, ModelConfig(), Path("model"), Path("run"), Path("cache"))
    return topology_class(cfg.mode)(where, lambda slot: None,
                                    PolicyCheckpoint(0, "model", ""))


def test_each_registered_name_is_its_modules_topology():
    for name in TOPOLOGIES:
        cls = topology_class(name)
        assert issubclass(cls, Topology) and cls.name == name
    mode = next(f for f in Config.__dataclass_fields__.values() if f.name == "mode")
    assert mode.metadata["choices"] == tuple(TOPOLOGIES)  # serving.mode's choices: the registry


def test_topologies_name_their_workers():
    assert _topology(mode="kv_routed", engines=3).roles() == [
        ("agg0", "agg"), ("agg1", "agg"), ("agg2", "agg")]
    assert _topology(mode="mocker", engines=2).roles() == [("agg0", "agg"), ("agg1", "agg")]
    assert _topology(mode="disagg", prefill_engines=1, decode_engines=2).roles() == [
        ("prefill0", "prefill"), ("decode0", "decode"), ("decode1", "decode")]
    with pytest.raises(ServingError, match="decode_engines >= 1"):
        _topology(mode="disagg", decode_engines=0).roles()


def test_a_disagg_fleets_prefill_workers_are_the_ones_that_hand_kv_off():
    """serving/policy.py pauses them first and resumes them last."""
    topology = _topology(mode="disagg", prefill_engines=1, decode_engines=2)
    topology.workers = [_Worker(name, role) for name, role in topology.roles()]
    assert {c.name: c.hands_off_kv for c in topology.controls()} == {
        "prefill0": True, "decode0": False, "decode1": False}
    routed = _topology(mode="kv_routed", engines=2)
    routed.workers = [_Worker(name, role) for name, role in routed.roles()]
    assert not any(c.hands_off_kv for c in routed.controls())


def test_front_doors_and_the_kv_tier():
    assert _topology(mode="embedded").front_door == "vllm"
    assert _topology(mode="kv_routed").front_door == "dynamo"
    assert _topology(mode="mocker").front_door == "dynamo"
    assert _topology(mode="mocker", replay_trace="t.jsonl").front_door == "dynamo_replay"
    assert [n for n in TOPOLOGIES if topology_class(n).takes_kv_tier] == [
        "embedded", "kv_routed", "disagg"]


def test_routed_experts_are_refused_on_the_cpu_build_before_anything_starts():
    with pytest.raises(ServingError, match="Model Runner V2, which needs a GPU"):
        _topology(mode="kv_routed", routed_experts=True).check()
    _topology(mode="external", base_url="http://gpu:8000/v1", routed_experts=True).check()


class _Worker:
    """A Dynamo worker that starts and stops at once."""

    def __init__(self, name, role="agg", core=None):
        self.name, self.role, self.core = name, role, core
        self.metrics_url, self.instance_id, self.system_port = "", "1", 0

    def stop(self): pass

    def start(self): pass

    def wait_ready(self, deadline, abort=None): pass


def test_a_worker_restart_waits_for_an_update_under_way_and_is_told_the_version_after_it():
    """The cluster holds the topology's lock through an update (serving/cluster.py); a restart
    (the caller's or the watchdog's) takes it too, so it starts from the new weights and is
    told their label, never in the middle."""
    topology = _topology(mode="kv_routed", engines=1)
    topology.plane, topology.workers = object(), [_Worker("agg0")]
    told = []
    topology._worker = lambda name, role, core: _Worker(name, role, core)
    topology._control = lambda worker: type("C", (), {
        "declare": lambda self, c: told.append((worker.name, c.label))})()
    v1 = PolicyCheckpoint(1, "v1", "d" * 64)
    with topology.lock:  # an update holds it
        restart = threading.Thread(target=topology.restart, args=("agg0",))
        restart.start()
        restart.join(0.3)
        assert restart.is_alive() and told == []  # waits for the update to end
        topology.served = v1  # what the update ends with
    restart.join(5)
    assert told == [("agg0", v1.label)]

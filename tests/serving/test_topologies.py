"""The topology registry: every name loads its module's Topology, which names its workers."""

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


def test_front_doors_and_the_kv_tier():
    assert _topology(mode="embedded").front_door == "vllm"
    assert _topology(mode="kv_routed").front_door == "dynamo"
    assert _topology(mode="mocker").front_door == "dynamo"
    assert _topology(mode="mocker", replay_trace="t.jsonl").front_door == "dynamo_replay"
    assert [n for n in TOPOLOGIES if topology_class(n).takes_kv_tier] == [
        "embedded", "kv_routed", "disagg"]

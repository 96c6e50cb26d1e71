"""The tier connector's key namespace is the served policy the cluster published, never a
count of the resets an engine happened to see."""

from serving.checkpoints import PolicyCheckpoint, write_served
from serving.engine.kvtier import connector
from serving.engine.kvtier.connector import MooncakeTierConnector


def _connector(served_file) -> MooncakeTierConnector:
    """The connector's scheduler side as vLLM leaves it after its constructor, without an
    engine: its geometry, its served-policy file, no blocks known yet."""
    c = object.__new__(MooncakeTierConnector)
    c.enabled, c.geometry, c.served_policy = True, "rf-kv/geometry", str(served_file)
    c._known, c._inflight, c._loads, c._lookups = {b"h": None}, {}, {}, {}
    c.ns = c._policy_namespace()
    return c


def test_engines_agree_on_the_namespace_whatever_resets_each_saw(tmp_path):
    v0 = PolicyCheckpoint(0, "/m", "0" * 64)
    served = write_served(tmp_path, v0)
    agg0, agg1 = _connector(served), _connector(served)
    assert agg0.ns == agg1.ns == "rf-kv/geometry/0:" + "0" * 16
    # an update that agg1 refused: agg0 was reset, the cluster rolled back and published v0
    # again, so agg0 is reset back; agg1 saw none of it
    write_served(tmp_path, PolicyCheckpoint(1, "/v1", "1" * 64))
    assert agg0.reset_cache() is True and agg0.ns.endswith("/1:" + "1" * 16)
    write_served(tmp_path, v0)
    assert agg0.reset_cache() is True
    assert agg0.ns == agg1.ns  # where a counter would have put agg0 two versions ahead
    # the retry succeeds on both: one namespace, the new weights', and no block remembered
    write_served(tmp_path, PolicyCheckpoint(1, "/v1-retry", "2" * 64))
    assert agg0.reset_cache() and agg1.reset_cache()
    assert agg0.ns == agg1.ns == "rf-kv/geometry/1:" + "2" * 16
    assert agg0._known == {} and agg1._known == {}
    # a restarted worker reads the same file
    assert _connector(served).ns == agg0.ns


def test_a_served_policy_that_cannot_be_read_fails_the_reset(tmp_path):
    served = write_served(tmp_path, PolicyCheckpoint(0, "/m", "0" * 64))
    c = _connector(served)
    served.write_text("{broken")
    assert c.reset_cache() is False  # vLLM then fails the reset, and the update with it


def test_a_block_s_key_is_its_hash_under_the_namespace_and_known_blocks_are_bounded(
        tmp_path, monkeypatch):
    """The blocks a connector knows the tier holds: the latest kept, the oldest dropped past
    the bound; a disabled connector has no cache to reset."""
    c = _connector(write_served(tmp_path, PolicyCheckpoint(0, "/m", "0" * 64)))
    assert c.key(b"\x01\xff") == c.ns + "/01ff"
    monkeypatch.setattr(connector, "KNOWN_MAX", 3)
    c._known = {}
    c._remember([b"a", b"b", b"c"])
    c._remember([b"a"])
    c._remember([b"d"])
    assert list(c._known) == [b"c", b"a", b"d"]
    c._forget([b"a", b"x"])
    assert list(c._known) == [b"c", b"d"]
    c.enabled = False
    assert c.reset_cache() is None

"""The Mooncake KV tier without engines: real master, store process and bus; fake KV caches."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import replace

import pytest
import torch

from serving.config import ServingConfig
from serving.engine.kvtier.blocks import BlockLayout, block_key, namespace, planes_of
from serving.engine.kvtier.client import Saved, TierClient
from serving.errors import ServingError
from serving.kvtier import MooncakeTier, kv_transfer_config
from serving.process import wait_until
from tests.procs import new_job_processes, process_table

CFG = ServingConfig(kv_tier="mooncake", kv_tier_gib=0.25)


def _caches(layers=4, blocks=16, seed=0):
    """CPU-backend shaped caches: [blocks, kv_heads, block_tokens, 2 * head_dim], bf16."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(blocks, 2, 8, 2 * 16, generator=g).to(torch.bfloat16)
            for _ in range(layers)]


def test_a_block_object_is_all_layers_of_one_block_in_layer_order():
    caches = _caches()
    layout = BlockLayout.from_caches(caches, 16)
    per_layer = caches[0][0].numel() * 2
    assert layout.object_bytes == 4 * per_layer
    rows = torch.zeros(2, layout.object_bytes, dtype=torch.uint8)
    layout.gather([5, 9], rows)
    for layer, cache in enumerate(caches):
        region = rows[1, layer * per_layer:(layer + 1) * per_layer]
        assert torch.equal(region, cache[9].contiguous().view(torch.uint8).flatten())
    other = [torch.zeros_like(c) for c in caches]
    BlockLayout.from_caches(other, 16).scatter(rows, [0, 3])
    for cache, copy in zip(caches, other, strict=True):
        assert torch.equal(copy[3], cache[9]) and torch.equal(copy[0], cache[5])
        assert not copy[1].any()


def test_layouts_with_a_leading_kv_dimension_and_unknown_ones():
    kv = torch.arange(2 * 6 * 4, dtype=torch.int16).reshape(2, 6, 4)
    planes = planes_of(kv, 6)
    assert len(planes) == 2 and planes[0].shape == (6, 8)
    with pytest.raises(ValueError, match="no block dimension"):
        planes_of(torch.zeros(3, 5), 6)


def test_keys_are_the_block_hash_under_a_geometry_namespace():
    ns = namespace("/m", "torch.bfloat16", 128, 4, 65536)
    assert ns != namespace("/m", "torch.bfloat16", 128, 4, 32768)
    assert re.fullmatch(r"rf-kv/[0-9a-f]{16}", ns)
    assert block_key(ns, b"\x01\xff") == f"{ns}/01ff"


def test_a_leading_kv_dimension_gives_the_k_plane_then_the_v_plane_at_any_rank():
    """[2, blocks, ...] of any rank from 2 on; a leading dimension of another size is not K/V."""
    for kv in (torch.arange(2 * 6 * 4, dtype=torch.uint8).reshape(2, 6, 4),
               torch.arange(2 * 6, dtype=torch.int16).reshape(2, 6)):
        k, v = planes_of(kv, 6)
        raw = kv.view(torch.uint8).reshape(2, 6, -1)
        assert torch.equal(k, raw[0]) and torch.equal(v, raw[1])
    with pytest.raises(ValueError, match=r"KV cache of shape \(3, 6\) has no block dimension"):
        planes_of(torch.zeros(3, 6), 6)
    with pytest.raises(ValueError, match=r"^KV cache of shape \(4, 6\) is not contiguous$"):
        planes_of(torch.zeros(6, 4).t(), 6)
    with pytest.raises(ValueError, match="^no KV caches to lay out$"):
        BlockLayout.from_caches([], 6)


def test_moving_no_block_changes_nothing():
    caches = _caches()
    layout = BlockLayout.from_caches(caches, 16)
    rows = torch.zeros(1, layout.object_bytes, dtype=torch.uint8)
    layout.gather([], rows)
    layout.scatter(rows, [])
    assert not rows.any() and all(torch.equal(a, b) for a, b in zip(caches, _caches(),
                                                                      strict=True))


def test_kv_transfer_config_per_role():
    cfg = ServingConfig()
    assert kv_transfer_config(cfg, "agg") is None
    assert kv_transfer_config(cfg, "prefill")["kv_connector"] == "NixlConnector"
    tier = {"store": "127.0.0.1:1"}
    own = kv_transfer_config(cfg, "agg", tier)
    assert own["kv_connector"] == "MooncakeTierConnector"
    assert own["kv_connector_module_path"] == "serving.engine.kvtier.connector"
    assert own["kv_load_failure_policy"] == "recompute"
    multi = kv_transfer_config(cfg, "decode", tier)
    assert multi["kv_connector"] == "MultiConnector" and multi["kv_role"] == "kv_consumer"
    names = [c["kv_connector"] for c in multi["kv_connector_extra_config"]["connectors"]]
    assert names == ["NixlConnector", "MooncakeTierConnector"]


def test_a_zero_capacity_tier_is_refused():
    with pytest.raises(ServingError, match="kv_tier_gib"):
        MooncakeTier(replace(CFG, kv_tier_gib=0), None)


@pytest.fixture
def tier(tmp_path):
    before = process_table()
    t = MooncakeTier(CFG, tmp_path)
    try:
        t.start()
        yield t
    finally:
        t.stop()
        time.sleep(0.5)
        assert new_job_processes(before) == []


def _client(tier, retry_s=2.0):
    extra = tier.extra_config()
    client = TierClient(extra["store"], extra["bus_xsub"], extra["bus_xpub"], 8 << 20, retry_s)
    assert client.usable()
    return client


def _saved(ns, hashes, ids):
    return [Saved(block_id=i, key=block_key(ns, h), block_hash=h,
                  parent_hash=hashes[k - 1] if k else None, token_ids=[k] * 4)
            for k, (h, i) in enumerate(zip(hashes, ids, strict=True))]


def test_blocks_saved_by_one_engine_load_into_another(tier):
    every = [(p.name, p) for p in (tier.master, tier.store, tier.bus)]
    assert all(p.alive() for _, p in every), every
    writer, reader = _client(tier), _client(tier)
    src, dst = _caches(seed=1), [torch.zeros_like(c) for c in _caches()]
    assert writer.attach(BlockLayout.from_caches(src, 16))
    assert reader.attach(BlockLayout.from_caches(dst, 16))
    ns, hashes = "rf-kv/test", [bytes([i]) * 32 for i in range(1, 5)]
    time.sleep(0.3)  # the bus subscriber joins before anything is announced
    writer.save(ns, _saved(ns, hashes, [2, 7, 11, 3]))
    keys = [block_key(ns, h) for h in hashes]
    assert wait_until(lambda: reader.hits(keys) == 4, 10, 0.05)
    assert reader.hits(keys[:2] + [block_key(ns, b"\x09" * 32)] + keys[2:]) == 2
    assert reader.load(keys, [0, 1, 2, 5]) == 4
    for a, b in zip(src, dst, strict=True):
        assert torch.equal(b[0], a[2]) and torch.equal(b[1], a[7])
        assert torch.equal(b[2], a[11]) and torch.equal(b[5], a[3])
    msgs = [m for m in reader.bus.drain() if m["op"] == "stored"]
    got = [b for m in msgs for b in m["blocks"]]
    assert [b["h"] for b in got] == [h.hex() for h in hashes]
    assert got[1]["p"] == hashes[0].hex() and got[0]["p"] is None and got[2]["t"] == [2] * 4
    # a key that is not there: nothing loads past it, and the miss is announced
    missing = [keys[0], block_key(ns, b"\x08" * 32), keys[1]]
    assert reader.load(missing, [0, 1, 2]) == 1
    time.sleep(0.3)
    assert any(m["op"] == "removed" for m in writer.bus.drain())
    writer.close()
    reader.close()


def test_a_dead_master_degrades_the_tier_and_the_supervisor_brings_it_back(tier):
    client = _client(tier, retry_s=1.0)
    caches = _caches(seed=2)
    assert client.attach(BlockLayout.from_caches(caches, 16))
    ns, hashes = "rf-kv/test", [bytes([i]) * 32 for i in range(10, 13)]
    client.save(ns, _saved(ns, hashes, [1, 2, 3]))
    keys = [block_key(ns, h) for h in hashes]
    assert wait_until(lambda: client.hits(keys) == 3, 10, 0.05)
    os.kill(tier.master.pid, signal.SIGKILL)
    tier.master.proc.wait()
    start = time.monotonic()
    assert client.hits(keys) == 0  # a lookup answers "miss", it does not raise
    assert client.load(keys, [4, 5, 6]) == 0  # vLLM recomputes these
    client.save(ns, _saved(ns, hashes, [1, 2, 3]))  # dropped or failed, never raised
    assert time.monotonic() - start < 5
    assert client.stats.down_events >= 1
    assert wait_until(lambda: "master" in tier.restarts and tier.master.alive(), 15)
    # the new master knows nothing; once the client's down window passes, saves work again
    assert wait_until(lambda: client.hits(keys) == 0 and client.usable(), 15)

    def saved_again() -> bool:
        client.save(ns, _saved(ns, hashes, [1, 2, 3]))
        return wait_until(lambda: client.hits(keys) == 3, 2, 0.1)

    assert wait_until(saved_again, 30, 0.5)
    client.close()


def test_no_tier_means_misses_not_errors(tmp_path):
    client = TierClient("127.0.0.1:1", None, None, 1 << 20, retry_s=30)
    start = time.monotonic()
    assert client.hits(["a", "b"]) == 0
    assert client.load(["a"], [0]) == 0
    assert time.monotonic() - start < 20
    assert json.dumps(client.stats.__dict__)

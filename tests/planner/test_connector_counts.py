"""The descriptor model against counts taken from the real NIXL connector (issue 50): vLLM 0.31's
NixlConnector on a CPU `disagg` cluster, logged by scripts/probe_nixl_descriptors.py into
bench/nixl_descriptor_counts.json, and NIXL's merge rule itself on a block-major region."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from planner import connector, descriptors

PROBE = json.loads(connector.COUNTS.read_text())


def test_nixl_posts_regions_times_runs_of_the_blocks_the_connector_hands_it():
    """Every transfer of the probe: the connector handed NIXL one descriptor per (region,
    block), and NIXL posted regions x runs (blocks whose ids climb by one on both sides merge),
    as its own telemetry and the addresses both say. Both kinds occur, so neither regions x
    blocks nor regions alone would pass."""
    transfers = PROBE["transfers"]
    regions = {e["regions"] for e in PROBE["engines"]}
    assert len(transfers) >= 50 and len(regions) == 1
    for t in transfers:
        assert t["regions"] in regions and t["same_blocks_every_region"]
        assert t["handed"] == t["regions"] * len(t["local_blocks"])
        assert t["posted"] == t["posted_by_address"]
        assert t["posted"] == descriptors.posted(t["regions"], t["local_blocks"],
                                                 t["remote_blocks"])
    merged = sum(t["posted"] < t["handed"] for t in transfers)
    whole = sum(t["posted"] == t["regions"] for t in transfers if len(t["local_blocks"]) > 1)
    unmerged = sum(t["posted"] == t["handed"] for t in transfers if len(t["local_blocks"]) > 1)
    assert merged >= 10 and whole >= 5 and unmerged >= 5


def test_once_the_cache_has_turned_over_most_blocks_run_alone():
    """A fresh engine hands out blocks in order (a whole transfer merges into one run per
    region); after its pool has turned over, blocks come back last first and most runs are one
    block long. The fitted share is the steady state's."""
    pool = PROBE["parameters"]["blocks"]
    share = descriptors.run_share(PROBE["transfers"], pool, "probe")
    first = PROBE["transfers"][:5]
    fresh = (sum(descriptors.runs(t["local_blocks"], t["remote_blocks"]) for t in first)
             / sum(len(t["local_blocks"]) for t in first))
    assert fresh < 0.3 < 0.6 < share.low <= share.share <= share.high < 1.0
    assert connector.run_share().share == share.share


def test_runs_count_only_climbing_neighbours_on_both_sides():
    assert descriptors.runs([5, 6, 7], [1, 2, 3]) == 1
    assert descriptors.runs([7, 6, 5], [3, 2, 1]) == 3  # handed back last first: no merge
    assert descriptors.runs([5, 6, 7], [1, 2, 9]) == 2  # the remote side breaks the run
    assert descriptors.posted(101, [1, 2, 4], [8, 9, 10]) == 202


def test_nixl_merges_neighbouring_blocks_of_one_block_major_region(monkeypatch):
    """No CPU attention backend of vLLM 0.31 takes a block-outermost layout, so the block-major
    side is checked on NIXL alone: two agents, one region each whose blocks hold every layer
    (block stride = layers x page), transfers of climbing, falling and broken block runs."""
    nixl_api = pytest.importorskip("nixl._api")
    monkeypatch.setenv("UCX_TLS", "tcp,self,sm")  # as the project's CPU workers run it
    monkeypatch.setenv("UCX_NET_DEVICES", "lo")
    config = nixl_api.nixl_agent_config(backends=["UCX"], capture_telemetry=True)
    a, b = nixl_api.nixl_agent("bm-a", config), nixl_api.nixl_agent("bm-b", config)
    layers, page, blocks = 6, 512, 32
    stride = layers * page
    mine, theirs = np.zeros(stride * blocks, np.uint8), np.ones(stride * blocks, np.uint8)
    a.register_memory([(mine.ctypes.data, mine.nbytes, 0, "")], "DRAM")
    b.register_memory([(theirs.ctypes.data, theirs.nbytes, 0, "")], "DRAM")
    a.add_remote_agent(b.get_agent_metadata())
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(mine.ctypes.data + i * stride, stride, 0)
                                                  for i in range(blocks)], "DRAM")
    remote = a.prep_xfer_dlist("bm-b", [(theirs.ctypes.data + i * stride, stride, 0)
                                         for i in range(blocks)], "DRAM")
    for mine_ids, their_ids in (([0, 1, 2, 3], [8, 9, 10, 11]), ([9, 8, 7], [3, 2, 1]),
                                ([4, 5, 6, 20, 21], [0, 1, 2, 3, 4])):
        handle = a.make_prepped_xfer("READ", local, np.array(mine_ids, np.int32), remote,
                                     np.array(their_ids, np.int32))
        a.transfer(handle)
        deadline = time.monotonic() + 30
        while a.check_xfer_state(handle) == "PROC" and time.monotonic() < deadline:
            time.sleep(0.001)
        assert a.check_xfer_state(handle) == "DONE"
        assert a.get_xfer_telemetry(handle).descCount == descriptors.posted(1, mine_ids,
                                                                           their_ids)
        a.release_xfer_handle(handle)

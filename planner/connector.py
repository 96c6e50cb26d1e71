"""What the real NIXL connector does, as the planner uses it: the probe's committed counts
(bench/nixl_descriptor_counts.json, scripts/probe_nixl_descriptors.py) give the runs per moved
block once a cache has turned over; with a layout's regions and a transport's constants that
times a transfer, in `layouts`' predictions and in the replay's handoffs alike."""

from __future__ import annotations

import functools
import json

from planner import descriptors, offline, perf
from rollfleet.paths import ROOT

COUNTS = ROOT / "bench" / "nixl_descriptor_counts.json"


@functools.cache
def run_share() -> descriptors.RunShare:
    """Runs per block in the probe's steady state (after its prefill pool turned over once)."""
    probe = json.loads(COUNTS.read_text())
    pool = probe["parameters"]["blocks"]
    return descriptors.run_share(probe["transfers"], pool, f"{COUNTS.name} ({probe['date']})")


def descriptors_per_token(kv_cache_dtype: str, layout: str, share: float | None = None) -> float:
    """Descriptors a GLM-5.3 rank's transfer posts per token moved."""
    geo = perf.kv_geometry(kv_cache_dtype, offline.BLOCK)
    share = run_share().share if share is None else share
    return descriptors.LAYOUTS[layout](geo) * share / geo.block


def transfer_gbps(kv_cache_dtype: str, layout: str, transport: str,
                  share: float | None = None) -> float:
    """The bandwidth per rank that moves a token as the transport moves its bytes and posts its
    descriptors (Dynamo's mocker times a handoff by bytes over one bandwidth)."""
    return descriptors.TRANSPORTS[transport].effective_gbps(
        perf.kv_bytes_per_token(kv_cache_dtype),
        descriptors_per_token(kv_cache_dtype, layout, share))

"""How many descriptors one request's KV transfer posts, and how long it takes (issue 27's
question, answered from the real connector in issue 50).

Measured on vLLM 0.31's NIXL connector with NIXL 1.5.1 (scripts/probe_nixl_descriptors.py,
bench/nixl_descriptor_counts.json): the connector hands NIXL one descriptor per (registered
region, block), region by region; NIXL merges a descriptor into the previous one when it
follows it in memory on both sides, so it posts regions x runs, a run being a stretch of blocks
whose ids climb by one on both sides at once. vLLM registers one region per layer cache (its
default per-layer layout), one for the whole cache when blocks are outermost (block-major,
BLHNC). vLLM hands a request blocks from its free queue, where a finished request's blocks go
back last first: after the cache has turned over, most transfers' blocks run downward and
almost none merge. `run_share` (runs per block) is fitted to the probe's steady state.

Time is two constants of a transport: a cost per posted descriptor and a bandwidth. Pure: no
I/O, no simulation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Geometry:
    """One rank's KV cache: `layers` caches of `row` bytes per token and `indexer_layers`
    caches of `indexer_row` bytes (GLM-5.x's DSA indexer keys, kept only by the layers that
    compute their own top-k), `block` tokens a block."""

    layers: int
    row: int  # bytes per token of one layer's cache
    block: int
    indexer_layers: int = 0
    indexer_row: int = 0

    @property
    def regions(self) -> int:
        """Layer caches, each a region vLLM registers with NIXL in its per-layer layout."""
        return self.layers + self.indexer_layers

    @property
    def bytes_per_token(self) -> int:
        return self.layers * self.row + self.indexer_layers * self.indexer_row

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.block)

    def bytes(self, tokens: int) -> int:
        """Whole blocks move, the last one partly filled."""
        return self.blocks(tokens) * self.block * self.bytes_per_token


# Regions per moved block, by layout: a registry, so a new layout is one entry.
LAYOUTS: dict[str, Callable[[Geometry], int]] = {
    "per_layer": lambda g: g.regions,
    "block_major": lambda g: 1,
}


def descriptors(layout: str, geometry: Geometry, tokens: int, run_share: float = 1.0) -> float:
    """Descriptors posted: regions x runs, runs = blocks x `run_share` (1: no two blocks merge,
    as in the project's own benchmarks, which scatter blocks at random)."""
    return LAYOUTS[layout](geometry) * geometry.blocks(tokens) * run_share


def runs(local: Sequence[int], remote: Sequence[int]) -> int:
    """Stretches of a transfer's blocks that NIXL merges: a block continues the stretch when its
    id is the previous one's + 1 on both sides."""
    return sum(1 for i in range(len(local))
               if i == 0 or local[i] != local[i - 1] + 1 or remote[i] != remote[i - 1] + 1)


def posted(regions: int, local: Sequence[int], remote: Sequence[int]) -> int:
    """What NIXL posts for a transfer the connector hands it as regions x blocks."""
    return regions * runs(local, remote)


@dataclass(frozen=True)
class RunShare:
    """Runs per moved block once the cache has turned over, with the range of its halves."""

    share: float
    low: float
    high: float
    transfers: int
    source: str


def run_share(transfers: list[dict], pool_blocks: int, source: str) -> RunShare:
    """Runs per block over the transfers after the first `pool_blocks` blocks moved (a fresh
    cache hands out blocks in order; the seed's engines ran for hours), and the share in each
    half of those transfers as its range."""
    moved, steady = 0, []
    for t in transfers:
        if moved >= pool_blocks:
            steady.append(t)
        moved += len(t["local_blocks"])
    if len(steady) < 2:
        raise ValueError(f"{source}: {len(steady)} transfers after the cache turned over")

    def share(ts: list[dict]) -> float:
        return (sum(runs(t["local_blocks"], t["remote_blocks"]) for t in ts)
                / sum(len(t["local_blocks"]) for t in ts))

    halves = [share(steady[:len(steady) // 2]), share(steady[len(steady) // 2:])]
    return RunShare(share(steady), min(halves), max(halves), len(steady), source)


@dataclass(frozen=True)
class Transport:
    """t = descriptors x descriptor_us + bytes / gbps."""

    descriptor_us: float
    gbps: float
    source: str

    def ms(self, descriptors: float, nbytes: float) -> float:
        return descriptors * self.descriptor_us / 1e3 + nbytes / (self.gbps * 1e6)

    def effective_gbps(self, bytes_per_token: float, descriptors_per_token: float) -> float:
        """The one bandwidth that moves a token in the same time as its bytes and its share of
        descriptors do (what a simulator that knows only a bandwidth is given)."""
        us = bytes_per_token / (self.gbps * 1e3) + descriptors_per_token * self.descriptor_us
        return bytes_per_token / (us * 1e3)


def fit(points: list[tuple[int, int, float]], source: str) -> Transport:
    """Least squares in relative error over (descriptors, bytes, ms) measurements."""
    import numpy as np

    a = np.array([[n, b] for n, b, _ in points], dtype=float)
    y = np.array([ms for _, _, ms in points], dtype=float)
    (per_desc, per_byte), *_ = np.linalg.lstsq(a / y[:, None], np.ones_like(y), rcond=None)
    return Transport(float(per_desc) * 1e3, 1.0 / float(per_byte) / 1e6, source)


def from_post_share(descriptors: int, nbytes: float, post_share: float, gbps: float,
                    source: str) -> Transport:
    """A transport known by the share of its time spent posting `descriptors` while moving
    `nbytes` at `gbps` (what vLLM issue 55434 reports for NIXL on GB200)."""
    move_ms = nbytes / (gbps * 1e6)
    total_ms = move_ms / (1.0 - post_share)
    return Transport(post_share * total_ms / descriptors * 1e3, gbps, source)


# Transports with their constants' sources. Measured here (bench/kv_layout.json) and on an H200
# pair (kernels/results/h200x2_bench_kv_transfer.json: 24 runs, fit within 9%); the GB200 one from
# published NIXL figures: GLM-5.3 P/D on GB200, 91k-120k descriptors per TP-rank transfer of
# ~4.9 GB, cuda_ipc spends 56.9% of the transfer posting them and moves at the rate of IB
# (vLLM issue 55434); one 400 Gb/s rail per GPU (a GB200 tray: 4 GPUs, 4 ConnectX-7) = 50 GB/s.
# Its range: the same report at either end of its descriptor counts.
GB200_SOURCE = ("vLLM issue 55434: NIXL cuda_ipc on GB200, 91k-120k descriptors per 4.9 GB rank "
                "transfer, 56.9% of the time posting, moving at one 400 Gb/s rail per GPU")
TRANSPORTS: dict[str, Transport] = {
    "mooncake_tcp_loopback": Transport(
        13.47, 3.53, "fit to bench/kv_layout.json (Mooncake TransferEngine, TCP on loopback, "
                     "this 2-core VM; 2 runs, 2 constants)"),
    "cudamemcpy_h200_nvlink": Transport(
        6.66, 319.0, "fit to kernels/results/h200x2_bench_kv_transfer.json (cudaMemcpyAsync "
                     "from Python, H200 -> H200 over NVLink; 24 runs)"),
    "nixl_cuda_ipc_gb200": from_post_share(105_500, 4.9e9, 0.569, 50.0, GB200_SOURCE),
}
TRANSPORT_RANGES: dict[str, tuple[Transport, Transport]] = {
    "nixl_cuda_ipc_gb200": (from_post_share(120_000, 4.9e9, 0.569, 50.0, GB200_SOURCE),
                            from_post_share(91_000, 4.9e9, 0.569, 50.0, GB200_SOURCE)),
}


@dataclass(frozen=True)
class Comparison:
    """One transfer under both layouts."""

    tokens: int
    per_layer: float
    block_major: float
    nbytes: int
    per_layer_ms: float
    block_major_ms: float


def compare(geometry: Geometry, tokens: int, transport: Transport,
            run_share: float = 1.0) -> Comparison:
    a, b = (descriptors(x, geometry, tokens, run_share) for x in ("per_layer", "block_major"))
    nbytes = geometry.bytes(tokens)
    return Comparison(tokens, a, b, nbytes, transport.ms(a, nbytes), transport.ms(b, nbytes))


def error(predicted: float, published: float) -> float:
    """Signed relative error of a prediction."""
    return predicted / published - 1.0 if published else math.nan

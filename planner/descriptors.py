"""How many transfer descriptors one request's KV takes from prefill to decode, and how long they
take, for the two KV layouts (issue 27: the seed publishes 19,559 -> ~1,940 descriptors and
146 -> 78 ms per TP8 worker; is that what the layouts imply?).

The count follows from geometry alone: a per-layer cache ([layer][block][token x row], vLLM's
default) needs one descriptor per (layer, block); a block-major cache (BLHNC: [block][layer]
[token x row]) one per block. Time is two constants of a transport: a cost per descriptor (posting
and completing it) and a bandwidth for the bytes. Pure: no I/O, no simulation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Geometry:
    """One rank's KV cache: `layers` caches of `row` bytes per token, `block` tokens a block."""

    layers: int
    row: int  # bytes per token and layer that move together (MLA row + DSA indexer row)
    block: int

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.block)

    def bytes(self, tokens: int) -> int:
        """Whole blocks move, the last one partly filled."""
        return self.blocks(tokens) * self.block * self.layers * self.row


# Descriptors per moved block, by layout: a registry, so a new layout is one entry.
LAYOUTS: dict[str, Callable[[Geometry], int]] = {
    "per_layer": lambda g: g.layers,
    "block_major": lambda g: 1,
}


def descriptors(layout: str, geometry: Geometry, tokens: int) -> int:
    return LAYOUTS[layout](geometry) * geometry.blocks(tokens)


@dataclass(frozen=True)
class Transport:
    """t = descriptors x descriptor_us + bytes / gbps."""

    descriptor_us: float
    gbps: float
    source: str

    def ms(self, descriptors: int, nbytes: int) -> float:
        return descriptors * self.descriptor_us / 1e3 + nbytes / (self.gbps * 1e6)


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
TRANSPORTS: dict[str, Transport] = {
    "mooncake_tcp_loopback": Transport(
        13.47, 3.53, "fit to bench/kv_layout.json (Mooncake TransferEngine, TCP on loopback, "
                     "this 2-core VM; 2 runs, 2 constants)"),
    "cudamemcpy_h200_nvlink": Transport(
        6.66, 319.0, "fit to kernels/results/h200x2_bench_kv_transfer.json (cudaMemcpyAsync "
                     "from Python, H200 -> H200 over NVLink; 24 runs)"),
    "nixl_cuda_ipc_gb200": from_post_share(
        105_500, 4.9e9, 0.569, 50.0,
        "vLLM issue 55434: NIXL cuda_ipc on GB200, 91k-120k descriptors per 4.9 GB rank "
        "transfer, 56.9% of the time posting, moving at one 400 Gb/s rail per GPU"),
}


@dataclass(frozen=True)
class Comparison:
    """One transfer under both layouts."""

    tokens: int
    per_layer: int
    block_major: int
    nbytes: int
    per_layer_ms: float
    block_major_ms: float


def compare(geometry: Geometry, tokens: int, transport: Transport) -> Comparison:
    a, b = (descriptors(x, geometry, tokens) for x in ("per_layer", "block_major"))
    nbytes = geometry.bytes(tokens)
    return Comparison(tokens, a, b, nbytes, transport.ms(a, nbytes), transport.ms(b, nbytes))


def error(predicted: float, published: float) -> float:
    """Signed relative error of a prediction."""
    return predicted / published - 1.0 if published else math.nan

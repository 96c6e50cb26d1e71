"""Block-major (BLHNC) tier objects: one stored object per KV block, all its layers contiguous.

An engine keeps one KV tensor per attention layer (vLLM's CPU backend: `[blocks, kv_heads,
block_tokens, 2 * head_dim]`, the block outermost). A tier object for block `b` is the
concatenation, in the engine's layer order, of each layer's region of `b` (for a layout with a
leading K/V dimension, `[2, blocks, ...]`, the K region then the V region of each layer): the
BLHNC order of kv-formats.md, so moving a block is one transfer, not one per layer.

Objects are keyed by the block-hash chain vLLM's prefix cache computes (`Request.block_hashes`:
each hash covers the block's tokens and its parent's hash), under a namespace that fingerprints
the model and the cache geometry, so an engine only ever loads objects of its own shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


def namespace(model: str, dtype: str, block_tokens: int, layers: int, block_bytes: int) -> str:
    """The key prefix of one model and cache geometry (engines that share it share objects)."""
    text = f"{model}|{dtype}|{block_tokens}|{layers}|{block_bytes}"
    return "rf-kv/" + hashlib.sha256(text.encode()).hexdigest()[:16]


def block_key(ns: str, block_hash: bytes) -> str:
    return f"{ns}/{block_hash.hex()}"


def planes_of(cache: torch.Tensor, num_blocks: int) -> list[torch.Tensor]:
    """One layer's cache as byte planes `[num_blocks, bytes]`, each block a contiguous row."""
    if not cache.is_contiguous():
        raise ValueError(f"KV cache of shape {tuple(cache.shape)} is not contiguous")
    raw = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
    if cache.shape[0] == num_blocks:
        return [raw.reshape(num_blocks, -1)]
    if cache.dim() >= 2 and cache.shape[0] == 2 and cache.shape[1] == num_blocks:
        kv = raw.reshape(2, num_blocks, -1)
        return [kv[0], kv[1]]
    raise ValueError(f"KV cache of shape {tuple(cache.shape)} has no block dimension of "
                     f"{num_blocks} in front; this tier does not know its layout")


@dataclass
class BlockLayout:
    """Where each byte of a block object lives in the engine's per-layer caches."""

    planes: list[torch.Tensor]  # uint8 [num_blocks, plane_bytes], in object order

    @classmethod
    def from_caches(cls, caches: list[torch.Tensor], num_blocks: int) -> BlockLayout:
        planes = [p for cache in caches for p in planes_of(cache, num_blocks)]
        if not planes:
            raise ValueError("no KV caches to lay out")
        return cls(planes)

    @property
    def object_bytes(self) -> int:
        return sum(p.shape[1] for p in self.planes)

    def gather(self, block_ids: list[int], rows: torch.Tensor) -> None:
        """Copy blocks `block_ids` into `rows` (uint8 `[>= len(block_ids), object_bytes]`)."""
        idx = torch.tensor(block_ids, dtype=torch.long)
        n, at = len(block_ids), 0
        for plane in self.planes:
            width = plane.shape[1]
            rows[:n, at:at + width] = plane.index_select(0, idx)
            at += width

    def scatter(self, rows: torch.Tensor, block_ids: list[int]) -> None:
        """Write `rows[:len(block_ids)]` back into blocks `block_ids` of every layer."""
        idx = torch.tensor(block_ids, dtype=torch.long)
        n, at = len(block_ids), 0
        for plane in self.planes:
            width = plane.shape[1]
            plane.index_copy_(0, idx, rows[:n, at:at + width])
            at += width

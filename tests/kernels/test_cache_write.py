"""Quantize-on-write writes exactly the reference bytes, and only at mapped slots."""

import pytest
import torch

pytest.importorskip("triton")

from kernels.cache_write import write_kv_cache  # noqa: E402
from kernels.kv_formats import KV_DIM, ROW_BYTES, KVFormat, quantize_rows  # noqa: E402
from kernels.testdata import heavy_tailed  # noqa: E402

FORMATS = [KVFormat.NVFP4, KVFormat.FP8, KVFormat.FP8_DS]


def _check_write(fmt: KVFormat, n: int, blocks: int, gen: torch.Generator) -> None:
    dev = gen.device
    kv = heavy_tailed((n, KV_DIM), gen)
    kv[0] = 0  # an all-zero token: zero scales
    scale = kv.float().abs().max().item() / 448
    cache = torch.full((blocks, 16, ROW_BYTES[fmt]), 0xAB, dtype=torch.uint8, device=dev)
    slots = torch.randperm(blocks * 16, generator=gen, device=dev)[:n]
    slots[1::5] = -1
    write_kv_cache(kv, slots, cache, fmt, scale)
    flat = cache.view(-1, ROW_BYTES[fmt])
    keep = slots >= 0
    assert torch.equal(flat[slots[keep]], quantize_rows(kv[keep], fmt, scale))
    untouched = torch.ones(blocks * 16, dtype=torch.bool, device=dev)
    untouched[slots[keep]] = False
    assert (flat[untouched] == 0xAB).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_reference_bytes(fmt: KVFormat, gen: torch.Generator) -> None:
    _check_write(fmt, n=10, blocks=2, gen=gen)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_reference_bytes_at_scale(fmt: KVFormat, gen: torch.Generator) -> None:
    _check_write(fmt, n=20000, blocks=4096, gen=gen)

"""The FP8-staging comparison path computes the same attention as the reference."""

import math

import pytest
import torch

pytest.importorskip("triton")

from kernels.fp8_staging import staged_decode  # noqa: E402
from kernels.kv_formats import KV_DIM, KVFormat, dequantize_rows, quantize_rows  # noqa: E402
from kernels.ref_decode import attend, gather_rows, sparse_mla_decode_ref  # noqa: E402
from kernels.sparse_decode import DecodeConfig  # noqa: E402
from kernels.testdata import heavy_tailed, logit_scaled_q, nvfp4_exact_kv, ragged_topk  # noqa: E402


def test_lossless_staging_matches_nvfp4_reference(gen: torch.Generator) -> None:
    # Power-of-two NVFP4 scales and stage scale: the FP8 copy is exact, whatever the rounding.
    pool, bsz, heads, topk = 48, 3, 16, 40
    kv = nvfp4_exact_kv(pool, gen)
    rows = quantize_rows(kv, KVFormat.NVFP4)
    rows[0] = 0x7F
    cache = rows.view(3, 16, -1)
    q = logit_scaled_q(bsz, heads, kv, 0.1, gen)
    idx = ragged_topk(bsz, topk, pool, gen)
    cfg = DecodeConfig(block_h=16, block_t=16, num_splits=2, num_warps=4)
    out, lse = staged_decode(q, cache, idx, 0.1, stage_scale=2.0, config=cfg)
    ref_out, ref_lse = sparse_mla_decode_ref(q, cache, idx, KVFormat.NVFP4, 0.1)
    assert (out[0] == 0).all() and (lse[0] == -math.inf).all()
    err = (out[1:].float() - ref_out[1:]).norm() / ref_out[1:].norm()
    assert err < 1e-2, err
    torch.testing.assert_close(lse[1:], ref_lse[1:], rtol=0, atol=1e-3)


@pytest.mark.gpu
def test_staging_matches_requantized_reference(gen: torch.Generator) -> None:
    pool, bsz, heads, topk = 1 << 16, 6, 64, 2048
    kv = heavy_tailed((pool, KV_DIM), gen)
    cache = quantize_rows(kv, KVFormat.NVFP4).view(pool // 16, 16, -1)
    q = logit_scaled_q(bsz, heads, kv, 0.07, gen)
    idx = ragged_topk(bsz, topk, pool, gen)
    stage_scale = kv.float().abs().max().item() / 448
    out, lse = staged_decode(q, cache, idx, 0.07, stage_scale=stage_scale)
    deq = dequantize_rows(gather_rows(cache, idx, KVFormat.NVFP4), KVFormat.NVFP4)
    staged = dequantize_rows(
        quantize_rows(deq.reshape(-1, KV_DIM), KVFormat.FP8, stage_scale), KVFormat.FP8, stage_scale
    ).view(bsz, topk, KV_DIM)
    valid = idx >= 0
    ref_out, ref_lse = attend(q.float(), staged.masked_fill(~valid[..., None], 0), valid, 0.07)
    err = (out[1:].float() - ref_out[1:]).norm() / ref_out[1:].norm()
    assert err < 2e-2, err
    torch.testing.assert_close(lse[1:], ref_lse[1:], rtol=0, atol=2e-2)

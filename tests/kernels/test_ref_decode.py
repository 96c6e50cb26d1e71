"""The reference decode against a float64 attention written out query by query."""

import math

import pytest
import torch

from kernels.kv_formats import KV_DIM, ROW_BYTES, KVFormat, dequantize_rows, quantize_rows
from kernels.ref_decode import sparse_mla_decode_ref
from kernels.testdata import heavy_tailed, logit_scaled_q, ragged_topk


@pytest.mark.parametrize("fmt", [KVFormat.NVFP4, KVFormat.FP8, KVFormat.FP8_DS, KVFormat.BF16])
def test_matches_float64_attention(fmt: KVFormat, gen: torch.Generator) -> None:
    pool, bsz, heads, topk, sm_scale, kv_scale = 40, 4, 3, 24, 0.07, 0.5
    kv_in = heavy_tailed((pool, KV_DIM), gen)
    rows = quantize_rows(kv_in, fmt, kv_scale)
    rows[0] = 0x7F  # NaN in every E4M3 field: padding must never read it
    cache = rows.view(5, 8, ROW_BYTES[fmt])
    q = logit_scaled_q(bsz, heads, kv_in, sm_scale, gen)
    idx = ragged_topk(bsz, topk, pool, gen)
    out, lse = sparse_mla_decode_ref(q, cache, idx, fmt, sm_scale, kv_scale)

    kv = dequantize_rows(rows, fmt, kv_scale).double()
    for b in range(bsz):
        slots = [s for s in idx[b].tolist() if s >= 0]
        if not slots:
            assert (out[b] == 0).all() and (lse[b] == -math.inf).all()
            continue
        k = kv[slots]
        s = q[b].double() @ k.T * sm_scale
        want_lse = torch.logsumexp(s, dim=-1)
        want = torch.softmax(s, dim=-1) @ k[:, :512]
        torch.testing.assert_close(lse[b].double(), want_lse, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out[b].double(), want, rtol=1e-4, atol=1e-4 * want.abs().max())

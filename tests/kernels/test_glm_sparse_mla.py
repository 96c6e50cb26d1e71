"""kernels/glm_sparse_mla.py: one GLM-5.x layer's sparse MLA decode over the paged NVFP4 cache,
against an independent float64 computation (the cache read request by request through its pages,
softmax and both projections in float64)."""

import math

import pytest
import torch

from kernels.glm_sparse_mla import GLM5, MLADims, sparse_mla_decode_layer, topk_to_slots
from kernels.kv_formats import (
    KV_DIM,
    LATENT_DIM,
    ROW_BYTES,
    KVFormat,
    dequantize_rows,
    quantize_rows,
)
from kernels.testdata import heavy_tailed

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def test_topk_to_slots_maps_through_the_block_table() -> None:
    table = torch.tensor([[7, 2, 5], [1, 0, 3]], dtype=torch.int32)
    seq_lens = torch.tensor([40, 20])
    topk = torch.tensor([[0, 15, 16, 39, 40, -1], [19, 3, 20, 200, -1, 0]], dtype=torch.int32)
    got = topk_to_slots(topk, table, seq_lens, 16)
    # row 0: 0 -> block 7 + 0, 15 -> 7 + 15, 16 -> 2 + 0, 39 -> 5 + 7, 40 past the end;
    # row 1: 19 -> 0 + 3, 3 -> 1 + 3, 20 and 200 past the end, 0 -> 1 + 0
    want = [[112, 127, 32, 87, -1, -1], [3, 19, -1, -1, -1, 16]]
    assert got.tolist() == want


def _layer(dims: MLADims, seq_lens: list[int], block_size: int, gen: torch.Generator) -> dict:
    """Random weights and queries for one layer, a paged NVFP4 cache whose blocks are handed out
    in a shuffled order, and each request's top-k (distinct positions below its length, a few
    past it, padded with -1)."""
    dev = gen.device
    bsz, h = len(seq_lens), dims.heads
    nblk = [math.ceil(s / block_size) for s in seq_lens]
    pool = sum(nblk) + 3
    perm = torch.randperm(pool, generator=gen, device=dev).to(torch.int32)
    table = torch.full((bsz, max(nblk)), -1, dtype=torch.int32, device=dev)
    at = 0
    for b, n in enumerate(nblk):
        table[b, :n] = perm[at : at + n]
        at += n
    rows = quantize_rows(heavy_tailed((pool * block_size, KV_DIM), gen), KVFormat.NVFP4)
    cache = rows.view(pool, block_size, ROW_BYTES[KVFormat.NVFP4])
    topk = torch.full((bsz, dims.topk), -1, dtype=torch.int32, device=dev)
    for b, s in enumerate(seq_lens):
        n = min(s, dims.topk)
        topk[b, :n] = torch.randperm(s, generator=gen, device=dev)[:n].to(torch.int32)
        if n + 2 <= dims.topk:
            topk[b, n : n + 2] = torch.tensor(
                [s, s + 5], dtype=torch.int32, device=dev
            )  # past the end
    # shuffle each row so that padding and past-the-end positions sit anywhere
    order = torch.rand(bsz, dims.topk, generator=gen, device=dev).argsort(dim=1)
    topk = topk.gather(1, order)
    q_nope = (torch.randn(bsz, h, dims.qk_nope, generator=gen, device=dev)).to(torch.bfloat16)
    q_pe = (torch.randn(bsz, h, dims.qk_rope, generator=gen, device=dev) * 0.3).to(torch.bfloat16)
    w_uk = (torch.randn(h, dims.qk_nope, LATENT_DIM, generator=gen, device=dev) * 0.01).to(
        torch.bfloat16
    )
    w_uv = (torch.randn(h, LATENT_DIM, dims.v_head, generator=gen, device=dev) * 0.05).to(
        torch.bfloat16
    )
    return dict(
        q_nope=q_nope, q_pe=q_pe, w_uk=w_uk, w_uv=w_uv, cache=cache, block_table=table,
        seq_lens=torch.tensor(seq_lens, device=dev), topk_tokens=topk,
    )  # fmt: skip


def _reference(x: dict, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64: each request's logical cache is its pages in table order, cut at its length."""
    outs, lses = [], []
    bs = x["cache"].shape[1]
    for b, s in enumerate(x["seq_lens"].tolist()):
        pages = x["block_table"][b, : math.ceil(s / bs)].long()
        rows = x["cache"][pages].reshape(-1, x["cache"].shape[-1])[:s]
        kv = dequantize_rows(rows, KVFormat.NVFP4).double()
        t = x["topk_tokens"][b].long()
        t = t[(t >= 0) & (t < s)]
        k = kv[t]  # [n, 576]
        q_lat = torch.einsum("hd,hdl->hl", x["q_nope"][b].double(), x["w_uk"].double())
        q = torch.cat([q_lat, x["q_pe"][b].double()], dim=-1)
        scores = (q @ k.T) * sm_scale
        p = torch.softmax(scores, dim=-1)
        o_lat = p @ k[:, :LATENT_DIM]
        outs.append(torch.einsum("hl,hlv->hv", o_lat, x["w_uv"].double()))
        lses.append(torch.logsumexp(scores, dim=-1))
    return torch.stack(outs), torch.stack(lses)


def test_reference_path_matches_float64_on_any_device(gen: torch.Generator) -> None:
    dims = MLADims(heads=4, topk=96)
    x = _layer(dims, [130, 40, 96, 7], 16, gen)
    out, lse = sparse_mla_decode_layer(**x, sm_scale=dims.sm_scale, path="ref")
    ref, ref_lse = _reference(x, dims.sm_scale)
    assert out.shape == (4, 4, dims.v_head) and out.dtype == torch.bfloat16
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
    # the layer's q is bf16 (the kernels' interface), the reference's float64
    torch.testing.assert_close(lse.double(), ref_lse, rtol=5e-3, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_SM90, reason="the CUDA kernel is built for sm_90a only")
@pytest.mark.parametrize("block_size", [64, 16])
def test_cuda_layer_at_glm5_dims_matches_float64(block_size: int, gen: torch.Generator) -> None:
    # GLM-5.x: 64 heads, qk_nope 192, rope 64, v_head 256, latent 512, top-k 2048; a ragged batch
    # (one request shorter than the top-k, so most of its row is padding; one of exactly 2048 + 1
    # tokens; two long ones) over shuffled pages
    x = _layer(GLM5, [3000, 700, 2049, 5000, 64], block_size, gen)
    out, lse = sparse_mla_decode_layer(**x, sm_scale=GLM5.sm_scale, path="cuda")
    ref, ref_lse = _reference(x, GLM5.sm_scale)
    assert torch.isfinite(out).all()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err
    torch.testing.assert_close(lse.double(), ref_lse, rtol=5e-3, atol=2e-2)

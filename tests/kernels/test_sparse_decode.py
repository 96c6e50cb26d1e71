"""The Triton sparse decode against the reference: ragged top-k, -1 padding, poisoned outputs
and a poisoned (NaN) slot 0 that padding must never read."""

import math
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import pytest
import torch

pytest.importorskip("triton")

from kernels.cuda_decode import VARIANTS  # noqa: E402
from kernels.kv_formats import KV_DIM, ROW_BYTES, KVFormat, quantize_rows  # noqa: E402
from kernels.ref_decode import sparse_mla_decode_ref  # noqa: E402
from kernels.sparse_decode import DecodeConfig, default_config, sparse_mla_decode  # noqa: E402
from kernels.testdata import heavy_tailed, logit_scaled_q, ragged_topk  # noqa: E402

HAS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
sm90 = pytest.mark.skipif(not HAS_SM90, reason="the CUDA kernel is built for sm_90a only")


def _check(
    fmt: KVFormat,
    bsz: int,
    heads: int,
    topk: int,
    pool: int,
    gen: torch.Generator,
    config: DecodeConfig | None,
    rtol: float,
    std: float = 3.0,
    decode: Callable | None = None,
) -> None:
    dev = gen.device
    kv = heavy_tailed((pool, KV_DIM), gen)
    kv_scale = kv.float().abs().max().item() / 448
    rows = quantize_rows(kv, fmt, kv_scale)
    rows[0] = 0x7F
    cache = rows.view(pool // 16, 16, ROW_BYTES[fmt])
    sm_scale = 1 / math.sqrt(192)
    q = logit_scaled_q(bsz, heads, kv, sm_scale, gen, std=std)
    idx = ragged_topk(bsz, topk, pool, gen)
    out = torch.full((bsz, heads, 512), float("nan"), dtype=torch.bfloat16, device=dev)
    lse = torch.full((bsz, heads), float("nan"), device=dev)
    if decode is None:
        sparse_mla_decode(q, cache, idx, fmt, sm_scale, kv_scale, config=config, out=out, lse=lse)
    else:  # the CUDA kernel: NVFP4 only, no config
        decode(q, cache, idx, sm_scale, out=out, lse=lse)
    ref_out, ref_lse = sparse_mla_decode_ref(q, cache, idx, fmt, sm_scale, kv_scale)

    assert not out.isnan().any() and not lse.isnan().any()  # every element written
    assert (out[0] == 0).all() and (lse[0] == -math.inf).all()  # query 0 has no valid slot
    err = (out[1:].float() - ref_out[1:]).norm() / ref_out[1:].norm()
    assert err < rtol, err
    torch.testing.assert_close(lse[1:], ref_lse[1:], rtol=0, atol=rtol)


@pytest.mark.parametrize("fmt", [KVFormat.NVFP4, KVFormat.FP8])
@pytest.mark.parametrize("splits", [1, 2])
def test_matches_reference_small(fmt: KVFormat, splits: int, gen: torch.Generator) -> None:
    # 20 heads over blocks of 16 (a partial head block); 96 slots in one split (written
    # directly) or two of 64 and 32 (merged by the combine kernel).
    cfg = DecodeConfig(block_h=16, block_t=32, num_splits=splits, num_warps=4)
    _check(fmt, bsz=3, heads=20, topk=96, pool=64, gen=gen, config=cfg, rtol=1e-2)


@pytest.mark.parametrize("fmt", [KVFormat.NVFP4, KVFormat.FP8])
@pytest.mark.parametrize(("splits", "std"), [(1, 3.0), (3, 3.0), (1, 12.0)])
def test_lazy_rescale_matches_reference(
    fmt: KVFormat, splits: int, std: float, gen: torch.Generator
) -> None:
    # Rescaling only when the running max grows by > 2**8: with scores of std 3 most tiles after
    # the first skip the rescale; with std 12 the max keeps jumping and many tiles take it.
    cfg = DecodeConfig(block_h=16, block_t=16, num_splits=splits, num_warps=4, lazy_rescale=True)
    _check(fmt, bsz=3, heads=20, topk=160, pool=64, gen=gen, config=cfg, rtol=1e-2, std=std)


@pytest.mark.parametrize("fmt", [KVFormat.NVFP4, KVFormat.FP8])
@pytest.mark.parametrize("splits", [1, 2])
def test_split_v_matches_reference(fmt: KVFormat, splits: int, gen: torch.Generator) -> None:
    # Two programs per head block, each accumulating one half of the output dims.
    cfg = DecodeConfig(block_h=16, block_t=32, num_splits=splits, num_warps=4, split_v=True)
    _check(fmt, bsz=3, heads=20, topk=96, pool=64, gen=gen, config=cfg, rtol=1e-2)


def test_combine_merges_many_splits(gen: torch.Generator) -> None:
    # 20 splits of 16 slots: the combine kernel walks them 16 at a time.
    cfg = DecodeConfig(block_h=16, block_t=16, num_splits=20, num_warps=4)
    _check(KVFormat.NVFP4, bsz=2, heads=16, topk=320, pool=64, gen=gen, config=cfg, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [KVFormat.NVFP4, KVFormat.FP8])
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_matches_reference_glm_shapes(fmt: KVFormat, heads: int, gen: torch.Generator) -> None:
    _check(fmt, bsz=6, heads=heads, topk=2048, pool=1 << 16, gen=gen, config=None, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [KVFormat.NVFP4, KVFormat.FP8])
@pytest.mark.parametrize(("heads", "block_t"), [(16, 32), (64, 32), (128, 64)])
def test_split_v_matches_on_gpu(
    fmt: KVFormat, heads: int, block_t: int, gen: torch.Generator
) -> None:
    cfg = replace(default_config(heads, fmt), block_t=block_t, num_warps=4, split_v=True)
    _check(fmt, bsz=6, heads=heads, topk=2048, pool=1 << 16, gen=gen, config=cfg, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [KVFormat.NVFP4, KVFormat.FP8])
@pytest.mark.parametrize(("stages", "maxnreg", "pps"), [(3, 168, 3), (1, 128, 4), (2, 168, 3)])
def test_register_capped_configs_match_on_gpu(
    fmt: KVFormat, stages: int, maxnreg: int, pps: int, gen: torch.Generator
) -> None:
    cfg = DecodeConfig(16, 32, 0, 4, stages, pps, decode_pure=False, maxnreg=maxnreg)
    _check(fmt, bsz=8, heads=16, topk=2048, pool=1 << 16, gen=gen, config=cfg, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 64])
def test_lazy_rescale_matches_on_gpu(heads: int, gen: torch.Generator) -> None:
    cfg = replace(default_config(heads, KVFormat.NVFP4), lazy_rescale=True)
    _check(
        KVFormat.NVFP4, bsz=6, heads=heads, topk=2048, pool=1 << 16, gen=gen, config=cfg, rtol=2e-2
    )


@pytest.mark.gpu
@pytest.mark.parametrize("decoder", ["portable", "prmt", "e4m3"])
@pytest.mark.parametrize("pure", [True, False])
@pytest.mark.parametrize("heads", [16, 64])
def test_every_decoder_matches_on_gpu(
    decoder: str, pure: bool, heads: int, gen: torch.Generator
) -> None:
    cfg = replace(default_config(heads, KVFormat.NVFP4), decoder=decoder, decode_pure=pure)
    _check(
        KVFormat.NVFP4, bsz=4, heads=heads, topk=512, pool=1 << 14, gen=gen, config=cfg, rtol=2e-2
    )


def _cuda(splits: int = 0, variant: int | None = None) -> Callable:
    from kernels.cuda_decode import sparse_mla_decode_cuda

    return partial(sparse_mla_decode_cuda, num_splits=splits, variant=variant)


# Every kernel variant (kernels/cuda_decode.py's VARIANTS) runs the small and exact tests; ids v0..
variants = pytest.mark.parametrize("variant", sorted(VARIANTS), ids=lambda v: f"v{v}")


@pytest.mark.gpu
@sm90
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_cuda_matches_reference_glm_shapes(heads: int, gen: torch.Generator) -> None:
    _check(
        KVFormat.NVFP4, bsz=6, heads=heads, topk=2048, pool=1 << 16, gen=gen, config=None,
        rtol=2e-2, decode=_cuda(),
    )  # fmt: skip


@pytest.mark.gpu
@sm90
@variants
@pytest.mark.parametrize("heads", [16, 64])
def test_cuda_variants_match_reference_glm_shapes(
    variant: int, heads: int, gen: torch.Generator
) -> None:
    _check(
        KVFormat.NVFP4, bsz=6, heads=heads, topk=2048, pool=1 << 16, gen=gen, config=None,
        rtol=2e-2, decode=_cuda(variant=variant),
    )  # fmt: skip


@pytest.mark.gpu
@sm90
@variants
@pytest.mark.parametrize(
    ("heads", "topk", "splits"),
    [
        (20, 96, 1), (20, 96, 2), (72, 200, 1), (16, 2048, 32), (128, 1000, 3), (64, 448, 1),
        (16, 1000, 1), (16, 448, 2),
    ],
)  # fmt: skip
def test_cuda_matches_reference_small(
    variant: int, heads: int, topk: int, splits: int, gen: torch.Generator
) -> None:
    # Partial head blocks (20; 72 = 64 + 8), partial tiles (96 = 64 + 32 rows), one split (the
    # kernel writes out itself) or several (the combine kernel merges them; 32: two steps of 16);
    # 7 tiles in one split (both stages reused: an odd count ends on stage 0); at 16 heads 16 tiles
    # in one split, the last one partial (variants 6, 7: the raw ring and both stages wrap many
    # times, and group 1 of 7 ends on an odd tile), and 4 tiles per split.
    _check(
        KVFormat.NVFP4, bsz=3, heads=heads, topk=topk, pool=1 << 12, gen=gen, config=None,
        rtol=1e-2, decode=_cuda(splits, variant),
    )  # fmt: skip


@pytest.mark.gpu
@sm90
@variants
@pytest.mark.parametrize(("heads", "topk"), [(16, 2048), (12, 448)])
def test_cuda_two_splits_match_reference(
    variant: int, heads: int, topk: int, gen: torch.Generator
) -> None:
    # Two splits at few heads, as H16 B64 runs: 16 tiles a split (two consumer groups from variant
    # 24 on) or 4 (one group), merged by a combine kernel, by the last split (14) or by the split
    # pair's cluster (27, 28); ragged, so that whole splits see only padding.
    _check(
        KVFormat.NVFP4, bsz=5, heads=heads, topk=topk, pool=1 << 12, gen=gen, config=None,
        rtol=1e-2, decode=_cuda(2, variant),
    )  # fmt: skip


@pytest.mark.gpu
@sm90
@variants
@pytest.mark.parametrize("heads", [64, 16])
def test_cuda_one_slot_returns_its_row(variant: int, heads: int, gen: torch.Generator) -> None:
    # One valid slot per query: softmax is exactly 1, so out must be that row's dequantized
    # latent bit for bit (exact in bf16) in every head: checks the decoder and the V layout alone.
    from kernels.kv_formats import dequantize_rows

    dev, pool, topk = gen.device, 4096, 192
    rows = quantize_rows(heavy_tailed((pool, KV_DIM), gen), KVFormat.NVFP4)
    q = heavy_tailed((4, heads, KV_DIM), gen)
    idx = torch.full((4, topk), -1, dtype=torch.int32, device=dev)
    slots = torch.randint(0, pool, (4,), generator=gen, device=dev, dtype=torch.int32)
    idx[torch.arange(4), torch.tensor([0, 63, 64, 191])] = slots
    out, lse = _cuda(1, variant)(q, rows.view(pool // 16, 16, -1), idx, 0.1)
    want = dequantize_rows(rows[slots.long()], KVFormat.NVFP4)
    assert torch.equal(out.float(), want[:, None, :512].expand(-1, heads, -1))
    scores = (q.float() @ want[:, :, None]).squeeze(-1) * 0.1
    torch.testing.assert_close(lse, scores, rtol=1e-3, atol=1e-2)


@pytest.mark.gpu
@sm90
@variants
def test_cuda_zero_q_averages_rows(variant: int, gen: torch.Generator) -> None:
    # q = 0: every score is 0, so out is the mean of the valid rows: the P.V path without Q.K.
    dev, pool = gen.device, 4096
    rows = quantize_rows(heavy_tailed((pool, KV_DIM), gen), KVFormat.NVFP4)
    cache = rows.view(pool // 16, 16, -1)
    q = torch.zeros(3, 16, KV_DIM, dtype=torch.bfloat16, device=dev)
    idx = ragged_topk(3, 256, pool, gen)
    out, lse = _cuda(1, variant)(q, cache, idx, 0.1)
    ref, ref_lse = sparse_mla_decode_ref(q, cache, idx, KVFormat.NVFP4, 0.1)
    assert (out[0] == 0).all() and (lse[0] == -math.inf).all()
    assert ((out[1:].float() - ref[1:]).norm() / ref[1:].norm()) < 1e-2
    torch.testing.assert_close(lse[1:], ref_lse[1:], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@sm90
@pytest.mark.parametrize("variant", [36, 38, 39, 40, 43, 44], ids=lambda v: f"v{v}")
@pytest.mark.parametrize("heads", [64, 72])
def test_cuda_staged_output_matches_direct_stores(
    variant: int, heads: int, gen: torch.Generator
) -> None:
    # Variants 38-44 stage the 64-head output in shared memory and store it 16 bytes at a time
    # when out's rows are 16-byte aligned; rows 1032 bytes apart are not, and take the direct
    # 4-byte stores of 36. Both paths must give the same bits, and neither may write the padding.
    dev, pool, bsz, topk = gen.device, 4096, 3, 448
    kv = heavy_tailed((pool, KV_DIM), gen)
    cache = quantize_rows(kv, KVFormat.NVFP4).view(pool // 16, 16, -1)
    q = logit_scaled_q(bsz, heads, kv, 1 / math.sqrt(192), gen)
    idx = ragged_topk(bsz, topk, pool, gen)
    aligned, lse = _cuda(1, variant)(q, cache, idx, 0.1)
    padded = torch.full((bsz, heads, 516), float("nan"), dtype=torch.bfloat16, device=dev)
    direct, lse2 = _cuda(1, variant)(q, cache, idx, 0.1, out=padded[..., :512])
    assert torch.equal(aligned, direct) and torch.equal(lse, lse2)
    assert padded[..., 512:].isnan().all()
    ref, _ = sparse_mla_decode_ref(q, cache, idx, KVFormat.NVFP4, 0.1)
    assert ((aligned[1:].float() - ref[1:]).norm() / ref[1:].norm()) < 1e-2


@pytest.mark.gpu
@sm90
def test_cuda_fused_merge_leaves_its_counters_at_zero(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Variant 14: the last split of each query to finish merges the partials and sets its counter
    # back to 0; so a second launch (and a CUDA graph's replays) must give the same bits, and the
    # counters must read 0 after each. Ragged top-k: later splits of short queries see only
    # padding (lse -inf partials), query 0 no row at all. The merge is used at 2 splits only;
    # more are let through here, so that the kernel's general path is checked too.
    from kernels import cuda_decode
    from kernels.cuda_decode import sparse_mla_decode_cuda, split_counters

    monkeypatch.setattr(cuda_decode, "FUSE_MAX_SPLITS", 512)

    dev, pool, bsz, heads, topk = gen.device, 4096, 5, 12, 1000
    kv = heavy_tailed((pool, KV_DIM), gen)
    cache = quantize_rows(kv, KVFormat.NVFP4).view(pool // 16, 16, -1)
    q = logit_scaled_q(bsz, heads, kv, 0.1, gen)
    idx = ragged_topk(bsz, topk, pool, gen)
    ref, ref_lse = sparse_mla_decode_ref(q, cache, idx, KVFormat.NVFP4, 0.1)
    for splits in (2, 5, 16):
        out, lse = sparse_mla_decode_cuda(q, cache, idx, 0.1, splits, variant=14)
        out2, lse2 = sparse_mla_decode_cuda(q, cache, idx, 0.1, splits, variant=14)
        assert (split_counters(dev, bsz)[:bsz] == 0).all()
        assert torch.equal(out, out2) and torch.equal(lse, lse2)
        assert (out[0] == 0).all() and (lse[0] == -math.inf).all()
        assert ((out[1:].float() - ref[1:]).norm() / ref[1:].norm()) < 1e-2
        torch.testing.assert_close(lse[1:], ref_lse[1:], rtol=0, atol=1e-2)
    out_g = torch.full_like(out, float("nan"))
    lse_g = torch.full_like(lse, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_mla_decode_cuda(q, cache, idx, 0.1, 16, out=out_g, lse=lse_g, variant=14)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out_g, out) and torch.equal(lse_g, lse)
    assert (split_counters(dev, bsz)[:bsz] == 0).all()

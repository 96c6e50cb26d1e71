"""Sparse MLA decode that reads NVFP4 (or FP8) cache rows directly: no staging buffer.

Flash-decoding split: program (b, split, head block) walks its share of the query's top-k slots,
dequantizes each tile of rows in registers once, and feeds it to both products (q.k over 576
dims, p.v over 512); a combine kernel merges the splits by their log-sum-exp. Splitting the
top-k range keeps all SMs busy when B x head blocks alone would not.
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.kv_formats import KV_DIM, LATENT_DIM, ROW_BYTES, KVFormat
from kernels.triton_codecs import DECODERS, FORMAT_ID, NVFP4, load_latent_tile

_TL_DTYPE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@dataclass(frozen=True)
class DecodeConfig:
    block_h: int = 64  # heads per program (the MMA's M)
    block_t: int = 64  # cached rows per tile
    num_splits: int = 0  # top-k splits per query; 0: from programs_per_sm
    num_warps: int = 8
    num_stages: int = 2
    programs_per_sm: int = 1  # auto splits aim at this many programs per SM
    # E2M1 decoder: "e4m3" (inline PTX via the hardware E4M3 -> fp16 convert), "prmt" (round 1's
    # inline-PTX table), "portable" (integer ops; always used by the CPU interpreter)
    decoder: str = "e4m3"
    decode_pure: bool = True  # False: decode a tile once even where two MMA layouts want it
    lazy_rescale: bool = False  # rescale out/l only when the running max grows by > 2**8
    # two programs per (query, split, head block), each accumulating half of the 512 output
    # dims (both compute the full scores): half the accumulator registers, twice the programs
    split_v: bool = False
    maxnreg: int | None = None  # register cap per thread (ptxas), for more programs per SM


def default_config(num_heads: int, fmt: KVFormat) -> DecodeConfig:
    """The fastest of scripts/bench_kernels.py's candidates on the H200 (kernels/README.md):
    H <= 16: 64-row tiles on 4 warps, 2 programs per SM (NVFP4: 2 stages and each tile decoded
    once; FP8: 3 stages); H >= 64: 8 warps over 64 heads."""
    nvfp4 = fmt == KVFormat.NVFP4
    if num_heads <= 16:
        return DecodeConfig(16, 64, num_warps=4, num_stages=2 if nvfp4 else 3, programs_per_sm=2,
                            decode_pure=not nvfp4)  # fmt: skip
    return DecodeConfig(64, 64, num_warps=8, num_stages=3 if nvfp4 else 1)


@triton.jit
def _split_kernel(
    q_ptr,
    cache_ptr,
    idx_ptr,
    opart_ptr,
    lpart_ptr,
    out_ptr,
    lse_ptr,
    qk_scale,
    v_scale,
    H,
    topk,
    split_len,
    stride_qb,
    stride_qh,
    stride_ib,
    stride_ob,
    stride_oh,
    FMT: tl.constexpr,
    ROW: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    DOT: tl.constexpr,
    DIRECT: tl.constexpr,
    DEC: tl.constexpr,
    PURE: tl.constexpr,
    LAZY: tl.constexpr,
    SPLIT_V: tl.constexpr,
):
    b = tl.program_id(0)
    split = tl.program_id(1)
    nsplit = tl.num_programs(1)
    if SPLIT_V:  # two programs per head block, each accumulating one half of the output
        hblock = tl.program_id(2) // 2
        half = tl.program_id(2) % 2
    else:
        hblock = tl.program_id(2)
        half = 0
    heads = hblock * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    # the scores (so lse) are the same in both halves: one writes it
    lmask = hmask & (heads * 0 + half == 0) if SPLIT_V else hmask
    d = tl.arange(0, 256)
    # the halves the tile loader produces: even / odd latent dims (NVFP4), first / second 256
    # (FP8); with SPLIT_V, half "a" is the one this program accumulates (its `half`)
    if FMT == NVFP4:
        dim_a = 2 * d + half
        dim_b = 2 * d + 1 - half
    else:
        dim_a = d + 256 * half
        dim_b = d + 256 - 256 * half
    qrow = q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
    if FMT == NVFP4:  # one contiguous load, split into even / odd dims in registers
        q_lat = tl.load(qrow + tl.arange(0, 512)[None, :], mask=hmask[:, None], other=0)
        q_even, q_odd = tl.split(tl.reshape(q_lat.to(tl.float32), [BLOCK_H, 256, 2]))
        q_a = tl.where(half == 0, q_even, q_odd)
        q_b = tl.where(half == 0, q_odd, q_even)
    else:
        q_a = tl.load(qrow + dim_a[None, :], mask=hmask[:, None], other=0).to(tl.float32)
        q_b = tl.load(qrow + dim_b[None, :], mask=hmask[:, None], other=0).to(tl.float32)
    q_r = tl.load(qrow + 512 + tl.arange(0, 64)[None, :], mask=hmask[:, None], other=0)
    q_r = q_r.to(tl.float32)
    # A power of two that brings max|q| to 2**14: bf16 q then fits an fp16 MMA operand exactly
    # (but for components 2**28 below the largest); the scores take it back.
    q_max = tl.maximum(tl.max(tl.abs(q_a)), tl.maximum(tl.max(tl.abs(q_b)), tl.max(tl.abs(q_r))))
    q_up = tl.exp2(14.0 - tl.ceil(tl.log2(tl.maximum(q_max, 1e-30))))
    q_a = (q_a * q_up).to(DOT)
    q_b = (q_b * q_up).to(DOT)
    q_r = (q_r * q_up).to(DOT)
    qk_scale = qk_scale / q_up

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc_a = tl.zeros([BLOCK_H, 256], tl.float32)
    acc_b = tl.zeros([BLOCK_H, 256 if not SPLIT_V else 16], tl.float32)  # unused with SPLIT_V
    start = split * split_len
    end = tl.minimum(start + split_len, topk)
    for t0 in range(start, end, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        idx = tl.load(idx_ptr + b.to(tl.int64) * stride_ib + t, mask=t < end, other=-1)
        valid = idx >= 0
        k_a, k_b, k_r = load_latent_tile(
            cache_ptr, idx, valid, FMT, ROW, BLOCK_T, DOT, DEC, PURE, half, SPLIT_V
        )
        s = tl.dot(q_a, tl.trans(k_a))
        s = tl.dot(q_b, tl.trans(k_b), s)
        s = tl.dot(q_r, tl.trans(k_r), s)
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))  # log2 units
        m_tile = tl.max(s, axis=1)
        if LAZY:
            # Rescale only when some row's max grew by more than 2**8: any reference max works
            # for the online softmax as long as p stays in range (p <= 2**8 here, exact scale
            # factors either way), and most tiles after the first few skip the [H, 512] multiply.
            grow = tl.where(m_tile > m_i, m_tile - m_i, 0.0)
            if tl.max(grow, axis=0) > 8.0:
                m_new = tl.maximum(m_i, m_tile)
                alpha = tl.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))
                l_i = l_i * alpha
                acc_a = acc_a * alpha[:, None]
                acc_b = acc_b * alpha[:, None]
                m_i = m_new
            m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i + tl.sum(p, axis=1)
            p = p.to(DOT)
            acc_a = tl.dot(p, k_a, acc_a)
            if not SPLIT_V:
                acc_b = tl.dot(p, k_b, acc_b)
        else:
            m_new = tl.maximum(m_i, m_tile)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no -inf - -inf on empty tiles
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            p = p.to(DOT)
            acc_a = tl.dot(p, k_a, acc_a * alpha[:, None])
            if not SPLIT_V:
                acc_b = tl.dot(p, k_b, acc_b * alpha[:, None])
            m_i = m_new

    empty = l_i == 0  # every slot of this split was padding: acc is 0, lse -inf
    l_safe = tl.where(empty, 1.0, l_i)
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(l_safe))
    if DIRECT:  # one split: final output, no combine pass
        w = (v_scale / l_safe)[:, None]
        dst = out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh
        tl.store(lse_ptr + b * H + heads, lse2 * 0.6931471805599453, mask=lmask)
    else:  # opart [B, splits, H, 512] in natural dim order, like out
        w = 1.0 / l_safe[:, None]
        part = (b * nsplit + split).to(tl.int64) * H + heads
        dst = opart_ptr + part[:, None] * 512
        tl.store(lpart_ptr + part, lse2, mask=lmask)
    if FMT == NVFP4 and not SPLIT_V:  # interleave even / odd dims: one contiguous store
        o = tl.reshape(tl.join(acc_a * w, acc_b * w), [BLOCK_H, 512])
        tl.store(dst + tl.arange(0, 512)[None, :], o.to(dst.dtype.element_ty), mask=hmask[:, None])
    else:
        tl.store(dst + dim_a[None, :], (acc_a * w).to(dst.dtype.element_ty), mask=hmask[:, None])
        if not SPLIT_V:
            tl.store(dst + dim_b[None, :], (acc_b * w).to(dst.dtype.element_ty),
                     mask=hmask[:, None])


@triton.jit
def _combine_kernel(
    opart_ptr,
    lpart_ptr,
    out_ptr,
    lse_ptr,
    v_scale,
    H,
    nsplit,
    stride_ob,
    stride_oh,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    smask = s < nsplit
    part = (b * nsplit + s).to(tl.int64) * H + h
    lse2 = tl.load(lpart_ptr + part, mask=smask, other=float("-inf"))
    m = tl.max(lse2, axis=0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse2 - m_use)
    total = tl.sum(w, axis=0)
    e = tl.arange(0, 512)
    c = tl.arange(0, 16)
    o = tl.zeros([512], tl.float32)
    for s0 in range(0, nsplit, 16):  # 16 splits a step: loads in flight, registers bounded
        cmask = s0 + c < nsplit
        p = (b * nsplit + s0 + c).to(tl.int64) * H + h
        wc = tl.exp2(tl.load(lpart_ptr + p, mask=cmask, other=float("-inf")) - m_use)
        oc = tl.load(opart_ptr + p[:, None] * 512 + e[None, :], mask=cmask[:, None], other=0.0)
        o += tl.sum(wc[:, None] * oc, axis=0)
    empty = total == 0
    total = tl.where(empty, 1.0, total)
    o = o * (v_scale / total)
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + e, o.to(tl.bfloat16))
    lse = tl.where(empty, float("-inf"), (m_use + tl.log2(total)) * 0.6931471805599453)
    tl.store(lse_ptr + b * H + h, lse)


def sparse_mla_decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    fmt: KVFormat,
    sm_scale: float,
    kv_scale: float = 1.0,
    config: DecodeConfig | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    dot_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, 576], cache [blocks, block_size, row] (NVFP4 or FP8), indices [B, topk] int32
    flat slots (-1 = padding) -> (out [B, H, 512] bf16, lse [B, H] fp32, natural log).

    `kv_scale` is FP8's per-tensor scale. `dot_dtype` is the MMA input type: fp16 on the GPU
    (dequantized NVFP4 and FP8 values are exact in fp16; q is rescaled by a power of two to fit,
    and p gets 3 more mantissa bits than bf16), float32 in the CPU interpreter (default there;
    its bf16 dot is broken).
    """
    assert fmt in (KVFormat.NVFP4, KVFormat.FP8), fmt
    bsz, num_heads, dim = q.shape
    assert dim == KV_DIM and q.stride(-1) == 1 and indices.stride(-1) == 1
    assert cache.dtype == torch.uint8 and cache.is_contiguous()
    assert cache.shape[-1] == ROW_BYTES[fmt]
    assert out is None or (out.dtype == torch.bfloat16 and out.stride(-1) == 1)
    assert lse is None or lse.is_contiguous()
    topk = indices.shape[1]
    cfg = config or default_config(num_heads, fmt)
    head_blocks = triton.cdiv(num_heads, cfg.block_h)
    programs = bsz * head_blocks * (2 if cfg.split_v else 1)
    nsplit = cfg.num_splits or _auto_splits(q.device, programs, cfg.programs_per_sm)
    split_len = triton.cdiv(triton.cdiv(topk, nsplit), cfg.block_t) * cfg.block_t
    nsplit = triton.cdiv(topk, split_len)
    if out is None:
        out = torch.empty(bsz, num_heads, LATENT_DIM, dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty(bsz, num_heads, dtype=torch.float32, device=q.device)
    direct = nsplit == 1
    shape = (0,) if direct else (bsz, nsplit, num_heads)
    opart = torch.empty(*shape, LATENT_DIM, dtype=torch.float32, device=q.device)
    lpart = torch.empty(shape, dtype=torch.float32, device=q.device)
    v_scale = kv_scale if fmt == KVFormat.FP8 else 1.0
    dot = _TL_DTYPE[dot_dtype or (torch.float16 if q.is_cuda else torch.float32)]
    extra = {"maxnreg": cfg.maxnreg} if cfg.maxnreg and q.is_cuda else {}
    _split_kernel[(bsz, nsplit, head_blocks * (2 if cfg.split_v else 1))](
        q, cache, indices, opart, lpart, out, lse, sm_scale * v_scale * math.log2(math.e),
        v_scale, num_heads, topk, split_len, q.stride(0), q.stride(1), indices.stride(0),
        out.stride(0), out.stride(1), FMT=FORMAT_ID[fmt], ROW=ROW_BYTES[fmt],
        BLOCK_H=cfg.block_h, BLOCK_T=cfg.block_t, DOT=dot, DIRECT=direct,
        DEC=DECODERS[cfg.decoder if q.is_cuda else "portable"], PURE=cfg.decode_pure,
        LAZY=cfg.lazy_rescale, SPLIT_V=cfg.split_v,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra)  # fmt: skip
    if not direct:
        _combine_kernel[(bsz, num_heads)](
            opart, lpart, out, lse, v_scale, num_heads, nsplit, out.stride(0), out.stride(1),
            BLOCK_S=triton.next_power_of_2(nsplit), num_warps=8)  # fmt: skip
    return out, lse


def _auto_splits(device: torch.device, programs: int, per_sm: int) -> int:
    """Top-k splits that give about `per_sm` programs per SM: one wave, or two."""
    if device.type != "cuda":
        return 2
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, round(per_sm * sms / programs))

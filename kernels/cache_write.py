"""Quantize-on-write: new tokens' latents go straight into their paged-cache slots.

One program per token. Bytes match `kv_formats.quantize_rows` exactly: divisions are IEEE
(`div_rn`) and E4M3 rounding is the shared round-to-nearest-even encoder.
"""

import torch
import triton
import triton.language as tl

from kernels.kv_formats import KV_DIM, ROW_BYTES, KVFormat
from kernels.triton_codecs import FORMAT_ID, FP8, NVFP4, e4m3_encode


@triton.jit
def _write_nvfp4(x_ptr, row):
    blk = tl.arange(0, 32)[:, None, None]
    pair = tl.arange(0, 8)[None, :, None]
    nib = tl.arange(0, 2)[None, None, :]
    x = tl.load(x_ptr + blk * 16 + pair * 2 + nib).to(tl.float32)  # [32 blocks, 8 pairs, 2]
    amax = tl.max(tl.max(tl.abs(x), axis=2), axis=1)
    scale8 = e4m3_encode(tl.math.div_rn(amax, 6.0))
    s = scale8.to(tl.float8e4nv, bitcast=True).to(tl.float32)[:, None, None]
    a = tl.abs(x)
    mag = (
        (a > 0.25 * s).to(tl.int32)
        + (a >= 0.75 * s).to(tl.int32)
        + (a > 1.25 * s).to(tl.int32)
        + (a >= 1.75 * s).to(tl.int32)
        + (a > 2.5 * s).to(tl.int32)
        + (a >= 3.5 * s).to(tl.int32)
        + (a > 5.0 * s).to(tl.int32)
    )
    mag = tl.where(s > 0, mag, 0)
    code = mag | ((x < 0).to(tl.int32) << 3)
    packed = tl.sum(code << (nib * 4), axis=2).to(tl.uint8)  # value 2i low nibble, 2i+1 high
    byte = tl.arange(0, 32)[:, None] * 8 + tl.arange(0, 8)[None, :]
    tl.store(row + byte, packed)
    rope = tl.load(x_ptr + 512 + tl.arange(0, 64)).to(tl.float32)
    tl.store(row + 256 + tl.arange(0, 64), e4m3_encode(rope))
    tl.store(row + 320 + tl.arange(0, 32), scale8)


@triton.jit
def _write_fp8_ds(x_ptr, row):
    x = tl.load(x_ptr + tl.arange(0, 4)[:, None] * 128 + tl.arange(0, 128)[None, :])
    x = x.to(tl.float32)
    scale = tl.math.div_rn(tl.max(tl.abs(x), axis=1), 448.0)
    safe = tl.where(scale > 0, scale, 1.0)[:, None]
    q = e4m3_encode(tl.math.div_rn(x, safe))
    tl.store(row + tl.arange(0, 4)[:, None] * 128 + tl.arange(0, 128)[None, :], q)
    tl.store((row + 512).to(tl.pointer_type(tl.float32)) + tl.arange(0, 4), scale)
    rope = tl.load(x_ptr + 512 + tl.arange(0, 64)).to(tl.bfloat16)
    tl.store((row + 528).to(tl.pointer_type(tl.bfloat16)) + tl.arange(0, 64), rope)


@triton.jit
def _cache_write_kernel(
    kv_ptr, slot_ptr, cache_ptr, scale, stride_kv, FMT: tl.constexpr, ROW: tl.constexpr
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok)
    if slot < 0:  # -1: the token is not cached (vLLM's padded slot mapping)
        return
    x_ptr = kv_ptr + tok.to(tl.int64) * stride_kv
    row = cache_ptr + slot.to(tl.int64) * ROW
    if FMT == NVFP4:
        _write_nvfp4(x_ptr, row)
    elif FMT == FP8:
        lat = tl.load(x_ptr + tl.arange(0, 512)).to(tl.float32)
        rope = tl.load(x_ptr + 512 + tl.arange(0, 64)).to(tl.float32)
        tl.store(row + tl.arange(0, 512), e4m3_encode(tl.math.div_rn(lat, scale)))
        tl.store(row + 512 + tl.arange(0, 64), e4m3_encode(tl.math.div_rn(rope, scale)))
    else:
        _write_fp8_ds(x_ptr, row)


def write_kv_cache(
    kv: torch.Tensor,
    slot_mapping: torch.Tensor,
    cache: torch.Tensor,
    fmt: KVFormat,
    scale: float = 1.0,
) -> None:
    """Quantize kv [N, 576] into cache [blocks, block_size, row] at flat slots (-1: skip).

    `scale` is FP8's per-tensor scale; the other formats carry their own scales.
    """
    assert kv.shape[-1] == KV_DIM and kv.stride(-1) == 1
    assert cache.dtype == torch.uint8 and cache.is_contiguous()
    assert cache.shape[-1] == ROW_BYTES[fmt] and slot_mapping.shape[0] == kv.shape[0]
    if kv.shape[0] == 0:
        return
    _cache_write_kernel[(kv.shape[0],)](
        kv, slot_mapping, cache, scale, kv.stride(0), FMT=FORMAT_ID[fmt], ROW=ROW_BYTES[fmt]
    )

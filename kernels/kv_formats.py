"""MLA KV-cache row formats, byte for byte, and their PyTorch reference (de)quantizers.

A row is one token's MLA latent for one layer: 512 latent values then 64 rope values.
The references define the formats: the Triton kernels must match them bit for bit (writes) or
within matmul rounding (decode). They run on any device, CPU included.
"""

from enum import StrEnum

import torch

LATENT_DIM = 512
ROPE_DIM = 64
KV_DIM = LATENT_DIM + ROPE_DIM
E4M3_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16  # latent values per E4M3 scale
FP8_DS_TILE = 128  # latent values per fp32 scale in the FlashMLA row

# NVFP4 row: [0, 256) E2M1 pairs, [256, 320) E4M3 rope, [320, 352) E4M3 block scales.
NVFP4_ROPE_OFFSET = LATENT_DIM // 2
NVFP4_SCALE_OFFSET = NVFP4_ROPE_OFFSET + ROPE_DIM
# FlashMLA FP8 row: [0, 512) E4M3 latent, [512, 528) 4 fp32 scales, [528, 656) bf16 rope.
FP8_DS_SCALE_OFFSET = LATENT_DIM
FP8_DS_ROPE_OFFSET = FP8_DS_SCALE_OFFSET + 4 * (LATENT_DIM // FP8_DS_TILE)

# The E2M1 value of each 4-bit code: bit 3 is the sign, bits 2..1 the exponent, bit 0 the mantissa.
E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
# Midpoints between neighbouring E2M1 magnitudes, and whether a tie rounds up: a tie goes to the
# even code (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4).
E2M1_MIDPOINTS = (
    (0.25, False),
    (0.75, True),
    (1.25, False),
    (1.75, True),
    (2.5, False),
    (3.5, True),
    (5.0, False),
)


class KVFormat(StrEnum):
    NVFP4 = "nvfp4"  # 352 B: this project's Hopper format
    FP8 = "fp8"  # 576 B: per-tensor scale (FlashInfer's sparse MLA row)
    FP8_DS = "fp8_ds"  # 656 B: FlashMLA / vLLM `fp8_ds_mla`
    BF16 = "bf16"  # 1152 B: unquantized


ROW_BYTES = {KVFormat.NVFP4: 352, KVFormat.FP8: 576, KVFormat.FP8_DS: 656, KVFormat.BF16: 1152}


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """float -> E4M3 (round to nearest even), saturating at +-448 instead of making NaN."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _div(x: torch.Tensor, d: float) -> torch.Tensor:
    """IEEE x / d: a Python-scalar divisor may become a multiply by 1/d (PyTorch on CUDA)."""
    return x / torch.full_like(x, d)


def _as_e4m3(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(torch.float8_e4m3fn).float()


def quantize_rows(kv: torch.Tensor, fmt: KVFormat, scale: float = 1.0) -> torch.Tensor:
    """[N, 576] float -> [N, ROW_BYTES[fmt]] uint8. `scale` is the per-tensor scale of FP8."""
    assert kv.dim() == 2 and kv.shape[1] == KV_DIM, kv.shape
    x = kv.float()
    if fmt == KVFormat.NVFP4:
        return _quantize_nvfp4(x)
    if fmt == KVFormat.FP8:
        return e4m3(_div(x, scale)).view(torch.uint8)
    if fmt == KVFormat.FP8_DS:
        return _quantize_fp8_ds(x)
    return kv.to(torch.bfloat16, copy=True).contiguous().view(torch.uint8)  # never aliases kv


def dequantize_rows(rows: torch.Tensor, fmt: KVFormat, scale: float = 1.0) -> torch.Tensor:
    """[..., ROW_BYTES[fmt]] uint8 -> [..., 576] float32."""
    assert rows.dtype == torch.uint8 and rows.shape[-1] == ROW_BYTES[fmt], rows.shape
    lead = rows.shape[:-1]
    r = rows.reshape(-1, rows.shape[-1])
    if fmt == KVFormat.NVFP4:
        out = _dequantize_nvfp4(r)
    elif fmt == KVFormat.FP8:
        out = _as_e4m3(r) * scale
    elif fmt == KVFormat.FP8_DS:
        out = _dequantize_fp8_ds(r)
    else:
        out = r.contiguous().view(torch.bfloat16).float()
    return out.reshape(*lead, KV_DIM)


def e2m1_codes(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round x / scale to the E2M1 grid (ties to even) as 4-bit codes; scale 0 gives code 0.

    Compares |x| with midpoint * scale instead of dividing: both products are exact in fp32, so
    the rounding is that of the exact quotient, with no division rounding in between.
    """
    a = x.abs()
    mag = torch.zeros_like(a, dtype=torch.uint8)
    for mid, tie_up in E2M1_MIDPOINTS:
        t = mid * scale
        mag += (a >= t if tie_up else a > t).to(torch.uint8)
    mag = torch.where(scale > 0, mag, torch.zeros_like(mag))
    return mag | ((x < 0).to(torch.uint8) << 3)


def _quantize_nvfp4(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    lat = x[:, :LATENT_DIM].reshape(n, LATENT_DIM // NVFP4_BLOCK, NVFP4_BLOCK)
    scale8 = e4m3(_div(lat.abs().amax(-1), E2M1_MAX))  # [N, 32]
    codes = e2m1_codes(lat, scale8.float()[..., None]).reshape(n, LATENT_DIM // 2, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)  # value 2i: low nibble, value 2i+1: high
    rope = e4m3(x[:, LATENT_DIM:]).view(torch.uint8)
    return torch.cat([packed, rope, scale8.view(torch.uint8)], dim=1)


def _dequantize_nvfp4(r: torch.Tensor) -> torch.Tensor:
    packed = r[:, :NVFP4_ROPE_OFFSET]
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(r.shape[0], LATENT_DIM)
    table = torch.tensor(E2M1_VALUES, device=r.device)
    scale = _as_e4m3(r[:, NVFP4_SCALE_OFFSET:]).repeat_interleave(NVFP4_BLOCK, dim=1)
    rope = _as_e4m3(r[:, NVFP4_ROPE_OFFSET:NVFP4_SCALE_OFFSET])
    return torch.cat([table[codes.long()] * scale, rope], dim=1)


def _quantize_fp8_ds(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    lat = x[:, :LATENT_DIM].reshape(n, -1, FP8_DS_TILE)
    scale = _div(lat.abs().amax(-1), E4M3_MAX)  # [N, 4] fp32
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))[..., None]
    q = e4m3(lat / safe).view(torch.uint8).reshape(n, LATENT_DIM)
    rope = x[:, LATENT_DIM:].to(torch.bfloat16).view(torch.uint8)
    return torch.cat([q, scale.view(torch.uint8), rope], dim=1)


def _dequantize_fp8_ds(r: torch.Tensor) -> torch.Tensor:
    scale = r[:, FP8_DS_SCALE_OFFSET:FP8_DS_ROPE_OFFSET].contiguous().view(torch.float32)
    lat = _as_e4m3(r[:, :LATENT_DIM]) * scale.repeat_interleave(FP8_DS_TILE, dim=1)
    rope = r[:, FP8_DS_ROPE_OFFSET:].contiguous().view(torch.bfloat16).float()
    return torch.cat([lat, rope], dim=1)

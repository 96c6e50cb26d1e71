"""Triton device helpers shared by the kernels: E2M1 / E4M3 codecs and the row tile loader.

Format ids are small ints so that kernels can branch on them at compile time.
"""

import triton
import triton.language as tl

from kernels.kv_formats import KVFormat

FORMAT_ID = {KVFormat.NVFP4: 0, KVFormat.FP8: 1, KVFormat.FP8_DS: 2}
NVFP4: tl.constexpr = tl.constexpr(0)
FP8: tl.constexpr = tl.constexpr(1)
FP8_DS: tl.constexpr = tl.constexpr(2)


@triton.jit
def e2m1_scaled_down(code):
    """4-bit E2M1 code -> its value * 2**-14, exactly, as fp32.

    Placing the code's magnitude bits in fp16's exponent/mantissa field makes an fp16 worth
    value * 2**-14 (code 1, 0.5, lands on the subnormal 2**-15): a few integer ops, no table.
    Callers fold the 2**14 into the block scale.
    """
    c = code.to(tl.uint16)
    bits = ((c & 8) << 12) | ((c & 7) << 9)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


# E2M1 pairs -> fp16 pairs times their scales, for sm_90. Input $4: 4 packed bytes; $5, $6: the
# fp16 scales of bytes (0, 1) and (2, 3); outputs $0, $1: values of the low nibbles, $2, $3: of
# the high nibbles. An E2M1 magnitude in fp16 has a zero low byte, so one byte permute (prmt)
# through an 8-entry table of high bytes {00 38 3C 3E 40 42 44 46} decodes two values at once;
# the sign bits are moved into place and the pair is multiplied by its scales (exact in fp16).
_E2M1_ASM = tl.constexpr("""{
.reg .b32 ta, tb, m, sel, v, w, x;
mov.b32 ta, 0x3E3C3800;
mov.b32 tb, 0x46444240;
and.b32 m, $4, 0x07070707;
shl.b32 sel, m, 4;
prmt.b32 v, ta, tb, sel;
shl.b32 w, $4, 12;
and.b32 w, w, 0x8000;
shl.b32 x, $4, 20;
and.b32 x, x, 0x80000000;
or.b32 v, v, w;
or.b32 v, v, x;
mul.rn.f16x2 $0, v, $5;
shr.b32 sel, m, 12;
prmt.b32 v, ta, tb, sel;
shr.b32 w, $4, 4;
and.b32 w, w, 0x8000;
shl.b32 x, $4, 4;
and.b32 x, x, 0x80000000;
or.b32 v, v, w;
or.b32 v, v, x;
mul.rn.f16x2 $1, v, $6;
shr.b32 m, $4, 4;
and.b32 m, m, 0x07070707;
shl.b32 sel, m, 4;
prmt.b32 v, ta, tb, sel;
shl.b32 w, $4, 8;
and.b32 w, w, 0x8000;
shl.b32 x, $4, 16;
and.b32 x, x, 0x80000000;
or.b32 v, v, w;
or.b32 v, v, x;
mul.rn.f16x2 $2, v, $5;
shr.b32 sel, m, 12;
prmt.b32 v, ta, tb, sel;
shr.b32 w, $4, 8;
and.b32 w, w, 0x8000;
and.b32 x, $4, 0x80000000;
or.b32 v, v, w;
or.b32 v, v, x;
mul.rn.f16x2 $3, v, $6;
}""")


@triton.jit
def e2m1_pairs_asm(packed, scale):
    """uint8 E2M1 pairs and their fp16 scales (same shape) -> (low-nibble values, high-nibble
    values) as fp16, exact: about 4 instructions per value instead of ~15. GPU only."""
    return tl.inline_asm_elementwise(
        _E2M1_ASM, "=r,=r,=r,=r,r,r,r", [packed, scale], dtype=(tl.float16, tl.float16),
        is_pure=True, pack=4)  # fmt: skip


@triton.jit
def e4m3_encode(x):
    """fp32 -> E4M3 byte, round to nearest even, saturating at +-448.

    Rounds with the add-and-subtract trick at the E4M3 ulp of |x|, then packs the bits. Exact on
    the GPU and in the CPU interpreter alike (the interpreter's own fp8 cast does not round
    ties to even), so written bytes can be compared with the reference bit for bit.
    """
    xb = x.to(tl.int32, bitcast=True)
    a = tl.minimum(tl.abs(x), 448.0)
    ulp_exp = tl.maximum((a.to(tl.int32, bitcast=True) >> 23) - 3, 127 - 9)
    magic = ((ulp_exp + 23) << 23).to(tl.float32, bitcast=True)
    r = (a + magic) - magic
    rb = r.to(tl.int32, bitcast=True)
    normal = (((rb >> 23) - 120) << 3) | ((rb >> 20) & 7)
    code = tl.where(r >= 0.015625, normal, (r * 512.0).to(tl.int32))
    return (code | ((xb >> 24) & 128)).to(tl.uint8)


@triton.jit
def load_latent_tile(
    cache_ptr,
    idx,
    valid,
    FMT: tl.constexpr,
    ROW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    DOT: tl.constexpr,
    ASM: tl.constexpr,
):
    """Rows at slots `idx` -> (lat_a [T, 256], lat_b [T, 256], rope [T, 64]) in dtype DOT.

    NVFP4 splits the latent by nibble (lat_a = even dims, lat_b = odd dims), FP8 by half
    (dims 0..255, 256..511): no interleaving in registers, the caller permutes q and out.
    FP8 values come unscaled (the per-tensor scale is folded into the scores and output).
    Invalid rows load as zeros, so garbage (NaN bytes) in unused slots never reaches the MMA.
    ASM picks the inline-PTX E2M1 decoder (GPU); otherwise the portable bit arithmetic.
    """
    row = cache_ptr + idx.to(tl.int64) * ROW
    m = valid[:, None]
    if FMT == NVFP4:
        packed = tl.load(row[:, None] + tl.arange(0, 256)[None, :], mask=m, other=0)
        sc = tl.load(row[:, None] + 320 + tl.arange(0, 32)[None, :], mask=m, other=0)
        sc = sc.to(tl.float8e4nv, bitcast=True)  # scale j: bytes 8j..8j+7 (values 16j..16j+15)
        # convert the 32 scales of a row first, then give each of its 256 bytes its own
        sc = sc.to(tl.float16) if ASM else sc.to(tl.float32) * 16384.0
        sc = tl.reshape(tl.broadcast_to(sc[:, :, None], (BLOCK_T, 32, 8)), (BLOCK_T, 256))
        if ASM:
            lat_a, lat_b = e2m1_pairs_asm(packed, sc)
            lat_a = lat_a.to(DOT)
            lat_b = lat_b.to(DOT)
        else:
            lat_a = (e2m1_scaled_down(packed & 15) * sc).to(DOT)
            lat_b = (e2m1_scaled_down(packed >> 4) * sc).to(DOT)
        rope_off = 256
    else:
        lat_a = tl.load(row[:, None] + tl.arange(0, 256)[None, :], mask=m, other=0)
        lat_b = tl.load(row[:, None] + 256 + tl.arange(0, 256)[None, :], mask=m, other=0)
        lat_a = lat_a.to(tl.float8e4nv, bitcast=True).to(DOT)
        lat_b = lat_b.to(tl.float8e4nv, bitcast=True).to(DOT)
        rope_off = 512
    rope = tl.load(row[:, None] + rope_off + tl.arange(0, 64)[None, :], mask=m, other=0)
    return lat_a, lat_b, rope.to(tl.float8e4nv, bitcast=True).to(DOT)

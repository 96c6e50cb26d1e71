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
def e2m1_as_e4m3(packed):
    """uint8 E2M1 pairs -> (low-nibble, high-nibble) values as E4M3 bytes worth value * 2**-6.

    An E2M1 code `s e1 e0 m` becomes the E4M3 byte `s 0 0 e1 e0 m 0 0`: its magnitude bits land
    on E4M3's two low exponent bits and top mantissa bit, so the byte is the value times 2**-6
    exactly (code 1, 0.5, becomes the subnormal 2**-7). Callers fold the 2**6 into the scale.
    The same bit logic as `_E2M1_ASM`, one byte at a time (portable, and the interpreter's).
    """
    lo = ((packed << 2) & 0x1C) | ((packed << 4) & 0x80)
    hi = ((packed >> 2) & 0x1C) | (packed & 0x80)
    return lo.to(tl.float8e4nv, bitcast=True), hi.to(tl.float8e4nv, bitcast=True)


# E2M1 pairs -> fp16 values times their scales, for sm_90. Input $4: 4 packed bytes; $5, $6: the
# fp16 scales (times 2**6) of bytes (0, 1) and (2, 3); outputs $0, $1: values of the low nibbles
# of bytes (0, 1) and (2, 3), $2, $3: of the high nibbles. Each nibble becomes the E4M3 byte
# `s 0 0 e1 e0 m 0 0` (value * 2**-6, exact; see e2m1_as_e4m3) with word-wide shifts and masks,
# four at a time, then the hardware converts E4M3 pairs to fp16 pairs (cvt ... e4m3x2) and one
# fp16x2 multiply applies the scales: ~2 instructions per value (the prmt table version took 5).
_E2M1_ASM = tl.constexpr("""{
.reg .b32 lo, hi, t;
.reg .b16 l0, l1, h0, h1;
shl.b32 lo, $4, 2;
and.b32 lo, lo, 0x1C1C1C1C;
shl.b32 t, $4, 4;
and.b32 t, t, 0x80808080;
or.b32 lo, lo, t;
shr.b32 hi, $4, 2;
and.b32 hi, hi, 0x1C1C1C1C;
and.b32 t, $4, 0x80808080;
or.b32 hi, hi, t;
mov.b32 {l0, l1}, lo;
mov.b32 {h0, h1}, hi;
cvt.rn.f16x2.e4m3x2 $0, l0;
cvt.rn.f16x2.e4m3x2 $1, l1;
cvt.rn.f16x2.e4m3x2 $2, h0;
cvt.rn.f16x2.e4m3x2 $3, h1;
mul.rn.f16x2 $0, $0, $5;
mul.rn.f16x2 $1, $1, $6;
mul.rn.f16x2 $2, $2, $5;
mul.rn.f16x2 $3, $3, $6;
}""")

# The previous decoder (round 1), kept for comparison: an 8-entry prmt table of fp16 high bytes
# {00 38 3C 3E 40 42 44 46}, sign bits moved in one by one; scales NOT premultiplied by 2**6.
_E2M1_PRMT_ASM = tl.constexpr("""{
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

# Decoder choices (DecodeConfig.decoder): portable integer ops, the E4M3-route PTX, the prmt PTX.
DEC_PORTABLE: tl.constexpr = tl.constexpr(0)
DEC_E4M3: tl.constexpr = tl.constexpr(1)
DEC_PRMT: tl.constexpr = tl.constexpr(2)
DECODERS = {"portable": 0, "e4m3": 1, "prmt": 2}


# Swap the two nibbles of every byte when $2 (4 copies of the shift byte) is 4; no-op at 0.
_NIBBLE_SWAP_ASM = tl.constexpr("""{
.reg .b32 s, u, w;
and.b32 s, $2, 0xFF;
shr.b32 u, $1, s;
and.b32 u, u, 0x0F0F0F0F;
shl.b32 w, $1, s;
and.b32 w, w, 0xF0F0F0F0;
or.b32 $0, u, w;
}""")


@triton.jit
def nibble_swap(packed, shift, ASM: tl.constexpr):
    """uint8 bytes with their nibbles swapped where `shift` (uint8, same shape) is 4."""
    if ASM:
        return tl.inline_asm_elementwise(
            _NIBBLE_SWAP_ASM, "=r,r,r", [packed, shift], dtype=tl.uint8, is_pure=True, pack=4
        )
    else:
        p = packed.to(tl.int32)
        k = shift.to(tl.int32)
        return (((p >> k) & 0x0F) | ((p << k) & 0xF0)).to(tl.uint8)


@triton.jit
def e2m1_pairs_asm(packed, scale, DEC: tl.constexpr, PURE: tl.constexpr):
    """uint8 E2M1 pairs and their fp16 scales (same shape) -> (low-nibble values, high-nibble
    values) as fp16, exact. GPU only. DEC_E4M3 wants the scales times 2**6, DEC_PRMT plain.
    PURE=False keeps the compiler from running the block again in a second register layout (it
    may otherwise decode once per MMA operand layout) at the price of a layout conversion."""
    if DEC == DEC_E4M3:
        return tl.inline_asm_elementwise(
            _E2M1_ASM, "=r,=r,=r,=r,r,r,r", [packed, scale], dtype=(tl.float16, tl.float16),
            is_pure=PURE, pack=4)  # fmt: skip
    else:
        return tl.inline_asm_elementwise(
            _E2M1_PRMT_ASM, "=r,=r,=r,=r,r,r,r", [packed, scale],
            dtype=(tl.float16, tl.float16), is_pure=PURE, pack=4)  # fmt: skip


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
    DEC: tl.constexpr,
    PURE: tl.constexpr,
    half,
    SWAP: tl.constexpr,
):
    """Rows at slots `idx` -> (lat_a [T, 256], lat_b [T, 256], rope [T, 64]) in dtype DOT.

    NVFP4 splits the latent by nibble (lat_a = even dims, lat_b = odd dims), FP8 by half
    (dims 0..255, 256..511): no interleaving in registers, the caller permutes q and out.
    FP8 values come unscaled (the per-tensor scale is folded into the scores and output).
    Invalid rows load as zeros, so garbage (NaN bytes) in unused slots never reaches the MMA.
    DEC picks the NVFP4 decoder: DEC_PORTABLE (integer ops; the CPU interpreter), DEC_E4M3 or
    DEC_PRMT (inline PTX, GPU only). With SWAP, `half` (0 or 1) picks which half comes first:
    half 1 returns (odd dims, even dims) for NVFP4 and (dims 256.., dims 0..) for FP8.
    """
    row = cache_ptr + idx.to(tl.int64) * ROW
    m = valid[:, None]
    if FMT == NVFP4:
        packed = tl.load(row[:, None] + tl.arange(0, 256)[None, :], mask=m, other=0)
        if SWAP:
            shift = tl.zeros([BLOCK_T, 256], tl.uint8) + (4 * half).to(tl.uint8)
            packed = nibble_swap(packed, shift, DEC != DEC_PORTABLE)
        sc = tl.load(row[:, None] + 320 + tl.arange(0, 32)[None, :], mask=m, other=0)
        sc = sc.to(tl.float8e4nv, bitcast=True)  # scale j: bytes 8j..8j+7 (values 16j..16j+15)
        # convert the 32 scales of a row first, then give each of its 256 bytes its own
        if DEC == DEC_PRMT:
            sc = sc.to(tl.float16)
        elif DEC == DEC_E4M3:
            sc = sc.to(tl.float16) * 64.0  # exact: at most 448 * 64 = 28672
        else:
            sc = sc.to(tl.float32) * 64.0
        sc = tl.reshape(tl.broadcast_to(sc[:, :, None], (BLOCK_T, 32, 8)), (BLOCK_T, 256))
        if DEC == DEC_PORTABLE:
            lo, hi = e2m1_as_e4m3(packed)
            lat_a = (lo.to(tl.float32) * sc).to(DOT)
            lat_b = (hi.to(tl.float32) * sc).to(DOT)
        else:
            lat_a, lat_b = e2m1_pairs_asm(packed, sc, DEC, PURE)
            lat_a = lat_a.to(DOT)
            lat_b = lat_b.to(DOT)
        rope_off = 256
    else:
        off_a = 256 * half if SWAP else 0
        off_b = 256 - 256 * half if SWAP else 256
        lat_a = tl.load(row[:, None] + off_a + tl.arange(0, 256)[None, :], mask=m, other=0)
        lat_b = tl.load(row[:, None] + off_b + tl.arange(0, 256)[None, :], mask=m, other=0)
        lat_a = lat_a.to(tl.float8e4nv, bitcast=True).to(DOT)
        lat_b = lat_b.to(tl.float8e4nv, bitcast=True).to(DOT)
        rope_off = 512
    rope = tl.load(row[:, None] + rope_off + tl.arange(0, 64)[None, :], mask=m, other=0)
    return lat_a, lat_b, rope.to(tl.float8e4nv, bitcast=True).to(DOT)

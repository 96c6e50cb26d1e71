"""The inline-PTX E2M1 decoders, run through a small emulator of the PTX they use, on every byte
value in every byte position, against the format's value table. CPU only: the GPU tests run the
real instructions."""

import re
import struct

import pytest
import torch

pytest.importorskip("triton")

from kernels.kv_formats import E2M1_VALUES  # noqa: E402
from kernels.triton_codecs import _E2M1_ASM, _E2M1_PRMT_ASM, _NIBBLE_SWAP_ASM  # noqa: E402

M32 = 0xFFFFFFFF


def _f16(bits: int) -> float:
    return struct.unpack("<e", struct.pack("<H", bits))[0]


def _f16_bits(x: float) -> int:
    return struct.unpack("<H", struct.pack("<e", x))[0]


def _e4m3(byte: int) -> float:
    return torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()


def _prmt(a: int, b: int, sel: int) -> int:
    src = (b << 32) | a
    out = 0
    for i in range(4):
        out |= ((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i)
    return out


def run_ptx(asm: str, operands: dict[int, int]) -> dict[int, int]:
    """Interprets the instructions the decoders use (b32/b16 registers as Python ints)."""
    regs = {f"${k}": v for k, v in operands.items()}

    def val(tok: str) -> int:
        tok = tok.strip()
        return int(tok, 0) if tok[0].isdigit() else regs[tok]

    for line in str(getattr(asm, "value", asm)).splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        if op == "mov.b32" and args.startswith("{"):
            lo, hi, src = re.match(r"\{(\w+), (\w+)\}, (\S+)", args).groups()
            regs[lo], regs[hi] = val(src) & 0xFFFF, val(src) >> 16
            continue
        d, *srcs = [a.strip() for a in args.split(",")]
        x = [val(s) for s in srcs]
        if op == "mov.b32":
            r = x[0]
        elif op == "and.b32":
            r = x[0] & x[1]
        elif op == "or.b32":
            r = x[0] | x[1]
        elif op == "shl.b32":
            r = (x[0] << x[1]) & M32
        elif op == "shr.b32":
            r = x[0] >> x[1]
        elif op == "prmt.b32":
            r = _prmt(x[0], x[1], x[2])
        elif op == "cvt.rn.f16x2.e4m3x2":
            r = _f16_bits(_e4m3(x[0] & 0xFF)) | (_f16_bits(_e4m3(x[0] >> 8)) << 16)
        elif op == "mul.rn.f16x2":
            halves = [
                _f16_bits(_f16((x[0] >> s) & 0xFFFF) * _f16((x[1] >> s) & 0xFFFF)) for s in (0, 16)
            ]
            r = halves[0] | (halves[1] << 16)
        else:
            raise AssertionError(f"unemulated instruction {op}")
        regs[d] = r
    return {k: regs[f"${k}"] for k in range(4) if f"${k}" in regs}


@pytest.mark.parametrize(("asm", "unit"), [(_E2M1_ASM, 64.0), (_E2M1_PRMT_ASM, 1.0)])
def test_decoder_gives_every_code_in_every_byte(asm: str, unit: float) -> None:
    # Scales (as the kernel passes them: times 2**6 for the E4M3 route) differ per byte pair,
    # and every byte value appears in every position of the word.
    s01 = _f16_bits(0.5 * unit) | (_f16_bits(2.0 * unit) << 16)
    s23 = _f16_bits(0.25 * unit) | (_f16_bits(8.0 * unit) << 16)
    scale = [0.5, 2.0, 0.25, 8.0]
    for byte in range(256):
        for pos in range(4):
            word = (byte << (8 * pos)) | (((byte * 37 + 11) & 0xFF) << (8 * ((pos + 1) % 4)))
            out = run_ptx(asm, {4: word, 5: s01, 6: s23})
            lo = [out[0] & 0xFFFF, out[0] >> 16, out[1] & 0xFFFF, out[1] >> 16]
            hi = [out[2] & 0xFFFF, out[2] >> 16, out[3] & 0xFFFF, out[3] >> 16]
            for k in range(4):
                b = (word >> (8 * k)) & 0xFF
                assert _f16(lo[k]) == E2M1_VALUES[b & 15] * scale[k], (byte, pos, k)
                assert _f16(hi[k]) == E2M1_VALUES[b >> 4] * scale[k], (byte, pos, k)


def test_nibble_swap() -> None:
    gen = torch.Generator().manual_seed(0)
    for word in torch.randint(0, 2**32, (200,), generator=gen, dtype=torch.int64).tolist():
        assert run_ptx(_NIBBLE_SWAP_ASM, {1: word, 2: 0})[0] == word
        swapped = run_ptx(_NIBBLE_SWAP_ASM, {1: word, 2: 0x04040404})[0]
        for k in range(4):
            b = (word >> (8 * k)) & 0xFF
            assert (swapped >> (8 * k)) & 0xFF == ((b & 15) << 4) | (b >> 4)

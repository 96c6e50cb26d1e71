"""The row formats byte for byte, and their reference round trips."""

import pytest
import torch

from kernels.kv_formats import (
    E2M1_VALUES,
    FP8_DS_ROPE_OFFSET,
    FP8_DS_SCALE_OFFSET,
    KV_DIM,
    NVFP4_ROPE_OFFSET,
    NVFP4_SCALE_OFFSET,
    ROW_BYTES,
    KVFormat,
    dequantize_rows,
    e4m3,
    quantize_rows,
)
from kernels.testdata import heavy_tailed, nvfp4_exact_kv


@pytest.mark.parametrize("fmt", list(KVFormat))
def test_row_widths(fmt: KVFormat, gen: torch.Generator) -> None:
    rows = quantize_rows(heavy_tailed((5, KV_DIM), gen), fmt)
    assert rows.dtype == torch.uint8 and rows.shape == (5, ROW_BYTES[fmt])
    assert dequantize_rows(rows, fmt).shape == (5, KV_DIM)
    assert dict(ROW_BYTES) == {
        KVFormat.NVFP4: 352,
        KVFormat.FP8: 576,
        KVFormat.FP8_DS: 656,
        KVFormat.BF16: 1152,
    }


def test_nvfp4_round_trip_is_exact_on_representable_values(gen: torch.Generator) -> None:
    kv = nvfp4_exact_kv(64, gen)
    back = dequantize_rows(quantize_rows(kv, KVFormat.NVFP4), KVFormat.NVFP4)
    assert torch.equal(back, kv)


def test_nvfp4_nibble_and_scale_order(device: torch.device) -> None:
    kv = torch.zeros(1, KV_DIM, device=device)
    scales = torch.exp2(torch.arange(32, device=device) % 12 - 6.0)  # block j: 2**(j % 12 - 6)
    kv[0, :512] = scales.repeat_interleave(16)  # every value at its block's scale: code 2 (1.0)
    kv[0, 0:512:16] = 6 * scales  # first value of each block sets amax = 6 * scale: code 7
    kv[0, 1] = -0.5 * scales[0]  # second value of block 0: code 0b1001
    kv[0, 512:] = torch.linspace(-3, 3, 64, device=device)
    row = quantize_rows(kv, KVFormat.NVFP4)[0].cpu()
    assert row[0] == 0x97  # value 0 in the low nibble, value 1 in the high nibble
    assert row[1] == 0x22 and row[8] == 0x27  # byte 8 starts block 1 (values 16, 17)
    expected_scales = ((torch.arange(32) % 12 - 6 + 7) << 3).to(torch.uint8)  # E4M3 of 2**e
    assert torch.equal(row[NVFP4_SCALE_OFFSET:], expected_scales)
    rope = e4m3(kv[0, 512:]).view(torch.uint8).cpu()
    assert torch.equal(row[NVFP4_ROPE_OFFSET:NVFP4_SCALE_OFFSET], rope)


def test_nvfp4_rounds_ties_to_even(device: torch.device) -> None:
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=device)
    want = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0], device=device)
    kv = torch.zeros(1, KV_DIM, device=device)
    kv[0, 0] = 6.0  # amax: scale 1
    kv[0, 1:15] = torch.cat([mids, -mids])
    back = dequantize_rows(quantize_rows(kv, KVFormat.NVFP4), KVFormat.NVFP4)[0, :16]
    assert torch.equal(back[1:8], want) and torch.equal(back[8:15], -want)
    nudged = kv.clone()
    nudged[0, 1:8] = torch.nextafter(mids, torch.full_like(mids, 9.0))  # just above: round up
    up = dequantize_rows(quantize_rows(nudged, KVFormat.NVFP4), KVFormat.NVFP4)[0, 1:8]
    grid = torch.tensor(E2M1_VALUES[:8], device=device)
    assert torch.equal(up, grid[1:])


def test_nvfp4_error_is_within_half_a_grid_step(gen: torch.Generator) -> None:
    kv = heavy_tailed((256, KV_DIM), gen).float()
    rows = quantize_rows(kv, KVFormat.NVFP4)
    back = dequantize_rows(rows, KVFormat.NVFP4)
    scale = rows[:, NVFP4_SCALE_OFFSET:].view(torch.float8_e4m3fn).float()
    scale = scale.repeat_interleave(16, dim=1)
    ratio = kv[:, :512].abs() / scale
    half_step = torch.where(ratio <= 2, 0.25, torch.where(ratio <= 4, 0.5, 1.0))
    err = (kv[:, :512] - back[:, :512]).abs()
    assert (err <= half_step * scale).all()
    assert (err > 0).any()  # heavy tails do not sit on the grid
    rope_err = (kv[:, 512:] - back[:, 512:]).abs()
    assert (rope_err <= kv[:, 512:].abs() * 2**-4 + 2**-10).all()  # E4M3: half an ulp


def test_nvfp4_zero_block_has_zero_scale(device: torch.device) -> None:
    kv = torch.zeros(2, KV_DIM, device=device)
    rows = quantize_rows(kv, KVFormat.NVFP4)
    assert (rows == 0).all()
    assert (dequantize_rows(rows, KVFormat.NVFP4) == 0).all()


def test_fp8_per_tensor_round_trip(gen: torch.Generator) -> None:
    raw = torch.randint(0, 256, (32, KV_DIM), generator=gen, device=gen.device, dtype=torch.uint8)
    vals = raw.view(torch.float8_e4m3fn).float()
    vals = torch.where(vals.isnan(), 0.0, vals)
    kv = vals * 0.125  # E4M3 values times a power-of-two scale: exact
    back = dequantize_rows(quantize_rows(kv, KVFormat.FP8, 0.125), KVFormat.FP8, 0.125)
    assert torch.equal(back, kv)
    x = heavy_tailed((64, KV_DIM), gen).float()
    s = x.abs().max().item() / 448
    err = (dequantize_rows(quantize_rows(x, KVFormat.FP8, s), KVFormat.FP8, s) - x).abs()
    assert (err <= x.abs() * 2**-4 + 2**-10 * s).all()


def test_fp8_saturates_instead_of_nan(device: torch.device) -> None:
    kv = torch.full((1, KV_DIM), 1e6, device=device)
    kv[0, ::2] = -1e6
    for fmt in (KVFormat.FP8, KVFormat.NVFP4):
        back = dequantize_rows(quantize_rows(kv, fmt), fmt)
        assert back.isfinite().all()
    back = dequantize_rows(quantize_rows(kv, KVFormat.FP8), KVFormat.FP8)
    assert back.abs().max() == 448


def test_fp8_ds_layout_and_round_trip(gen: torch.Generator) -> None:
    raw = torch.randint(0, 256, (8, 4, 128), generator=gen, device=gen.device, dtype=torch.uint8)
    vals = raw.view(torch.float8_e4m3fn).float()
    vals = torch.where(vals.isnan(), 0.0, vals)
    vals[..., 0] = 448.0  # amax / 448 is then the power of two below
    tile_scale = torch.exp2(torch.randint(-8, 8, (8, 4, 1), generator=gen, device=gen.device))
    kv = torch.cat([(vals * tile_scale).reshape(8, 512), heavy_tailed((8, 64), gen).float()], dim=1)
    rows = quantize_rows(kv, KVFormat.FP8_DS)
    scales = rows[:, FP8_DS_SCALE_OFFSET:FP8_DS_ROPE_OFFSET].contiguous().view(torch.float32)
    assert torch.equal(scales, tile_scale[..., 0])
    assert torch.equal(dequantize_rows(rows, KVFormat.FP8_DS), kv)

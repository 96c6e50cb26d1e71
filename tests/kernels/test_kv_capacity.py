"""Capacity per GB: the NVFP4 gain, diluted by the DSA indexer row."""

import pytest

from kernels.kv_capacity import bytes_per_token, capacity_table, tokens_per_gb
from kernels.kv_formats import KVFormat


def test_nvfp4_gain_over_fp8() -> None:
    gain = tokens_per_gb(KVFormat.NVFP4) / tokens_per_gb(KVFormat.FP8)
    assert gain == pytest.approx((576 + 132) / (352 + 132))  # 1.46x
    bare = tokens_per_gb(KVFormat.NVFP4, indexer=False) / tokens_per_gb(KVFormat.FP8, indexer=False)
    assert bare == pytest.approx(576 / 352)  # 1.64x


def test_bytes_per_token_counts_every_layer() -> None:
    assert bytes_per_token(KVFormat.NVFP4, layers=78) == 78 * 484
    assert tokens_per_gb(KVFormat.FP8, layers=1) == pytest.approx(1e9 / 708)


def test_table_orders_formats_by_row_size() -> None:
    table = capacity_table()
    assert {row["format"] for row in table} == {f.value for f in KVFormat}
    by_size = sorted(table, key=lambda r: r["row_bytes"])
    assert [r["format"] for r in by_size] == ["nvfp4", "fp8", "fp8_ds", "bf16"]
    tokens = [r["tokens_per_gb"] for r in by_size]
    assert tokens == sorted(tokens, reverse=True) and len(set(tokens)) == len(tokens)

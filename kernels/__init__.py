"""MLA KV-cache formats (NVFP4, FP8) and Hopper sparse-MLA decode kernels.

The torch-only parts (formats, references, capacity) import here; the Triton kernels live in
`kernels.cache_write`, `kernels.sparse_decode` and `kernels.fp8_staging` and need `triton`.
"""

from kernels.kv_capacity import capacity_table, tokens_per_gb
from kernels.kv_formats import ROW_BYTES, KVFormat, dequantize_rows, quantize_rows
from kernels.ref_decode import sparse_mla_decode_ref

__all__ = [
    "ROW_BYTES",
    "KVFormat",
    "capacity_table",
    "dequantize_rows",
    "quantize_rows",
    "sparse_mla_decode_ref",
    "tokens_per_gb",
]

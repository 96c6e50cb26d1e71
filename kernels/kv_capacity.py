"""How many tokens fit in the KV cache per GB, per row format.

The DSA indexer keeps its own 132-byte row per token per layer (128 B fp8 key + a 4-byte fp32
scale) whatever the MLA row format is, so it dilutes the gain of a smaller MLA row.
"""

from kernels.kv_formats import ROW_BYTES, KVFormat

INDEXER_ROW_BYTES = 132
GLM5_LAYERS = 78


def bytes_per_token(fmt: KVFormat, layers: int = GLM5_LAYERS, indexer: bool = True) -> int:
    """Cache bytes one token takes across all layers."""
    return layers * (ROW_BYTES[fmt] + (INDEXER_ROW_BYTES if indexer else 0))


def tokens_per_gb(fmt: KVFormat, layers: int = GLM5_LAYERS, indexer: bool = True) -> float:
    """Cached tokens per 1e9 bytes of cache memory."""
    return 1e9 / bytes_per_token(fmt, layers, indexer)


def capacity_table(layers: int = GLM5_LAYERS) -> list[dict]:
    """One row per format: bytes per token-layer, tokens per GB, gain over the 576-byte row."""
    fp8 = tokens_per_gb(KVFormat.FP8, layers)
    return [
        {
            "format": fmt.value,
            "row_bytes": ROW_BYTES[fmt],
            "bytes_per_token_layer": ROW_BYTES[fmt] + INDEXER_ROW_BYTES,
            "tokens_per_gb": tokens_per_gb(fmt, layers),
            "vs_fp8": tokens_per_gb(fmt, layers) / fp8,
        }
        for fmt in KVFormat
    ]

"""PyTorch reference for sparse MLA decode over a paged, quantized KV cache.

Semantics shared with the Triton kernels: `indices` are flat cache slots
(block * block_size + offset, as FlashMLA's sparse interface takes them), -1 marks padding; the
value of a cached token is its first 512 dequantized values; `lse` is the natural-log
log-sum-exp of the scaled scores. A query with no valid index gets out = 0 and lse = -inf.
"""

import torch

from kernels.kv_formats import LATENT_DIM, ROW_BYTES, KVFormat, dequantize_rows


def gather_rows(cache: torch.Tensor, indices: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """Paged cache [blocks, block_size, row], slots [B, topk] -> rows [B, topk, row].

    Padding (-1) gathers slot 0; callers mask it.
    """
    rows = cache.reshape(-1, ROW_BYTES[fmt])
    return rows[indices.clamp(min=0).long()]


def sparse_mla_decode_ref(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    fmt: KVFormat,
    sm_scale: float,
    kv_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, 576] -> (out [B, H, 512], lse [B, H]), computed in `dtype` on q's device."""
    valid = indices >= 0
    kv = dequantize_rows(gather_rows(cache, indices, fmt), fmt, kv_scale).to(dtype)
    kv = kv.masked_fill(~valid[..., None], 0.0)  # padding must not read slot 0's bytes
    return attend(q.to(dtype), kv, valid, sm_scale)


def attend(
    q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor, sm_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention of q [B, H, 576] over kv [B, T, 576] with values kv[..., :512]."""
    s = torch.einsum("bhd,btd->bht", q, kv) * sm_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(nan=0.0)  # all-padding rows: -inf - -inf
    return torch.einsum("bht,btd->bhd", p, kv[..., :LATENT_DIM]), lse

"""The peers' path, for comparison: gather the top-k NVFP4 rows into an FP8 staging buffer,
then run the FP8 sparse decode over it.

This is what vLLM's FlashInfer path and TRT-LLM's DSA path do on hardware without an NVFP4
kernel: an extra pass that writes (and re-reads) B x topk x 576 bytes, and a second rounding of
the values (NVFP4 products need up to 6 significant bits, E4M3 keeps 4).
"""

import torch
import triton
import triton.language as tl

from kernels.kv_formats import KV_DIM, ROW_BYTES, KVFormat
from kernels.sparse_decode import DecodeConfig, sparse_mla_decode
from kernels.triton_codecs import DECODERS, NVFP4, load_latent_tile


@triton.jit
def _gather_kernel(
    cache_ptr, idx_ptr, stage_ptr, stage_idx_ptr, inv_scale, n, BLOCK_R: tl.constexpr,
    DEC: tl.constexpr
):  # fmt: skip
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < n
    idx = tl.load(idx_ptr + r, mask=rmask, other=-1)
    valid = idx >= 0
    lo, hi, rope = load_latent_tile(
        cache_ptr, idx, valid, NVFP4, 352, BLOCK_R, tl.float32, DEC, True, 0, False
    )
    lat = tl.reshape(tl.join(lo, hi), (BLOCK_R, 512))  # back to dims 0, 1, 2, ...
    lat = tl.minimum(tl.maximum(lat * inv_scale, -448.0), 448.0).to(tl.float8e4nv)
    rope = tl.minimum(tl.maximum(rope * inv_scale, -448.0), 448.0).to(tl.float8e4nv)
    out = stage_ptr + r.to(tl.int64)[:, None] * 576
    m = (rmask & valid)[:, None]
    tl.store(out + tl.arange(0, 512)[None, :], lat.to(tl.uint8, bitcast=True), mask=m)
    tl.store(out + 512 + tl.arange(0, 64)[None, :], rope.to(tl.uint8, bitcast=True), mask=m)
    tl.store(stage_idx_ptr + r, tl.where(valid, r, -1), mask=rmask)


def staged_decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    stage_scale: float,
    stage: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    dot_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 cache -> FP8 staging rows (per-tensor `stage_scale`) -> FP8 sparse decode.

    `stage` is an optional preallocated [B * topk, 576] uint8 workspace, as peers keep one.
    """
    assert cache.shape[-1] == ROW_BYTES[KVFormat.NVFP4] and indices.is_contiguous()
    n = indices.numel()
    if stage is None:
        stage = torch.empty(n, KV_DIM, dtype=torch.uint8, device=q.device)
    stage_idx = torch.empty_like(indices)
    block_r = 16
    _gather_kernel[(triton.cdiv(n, block_r),)](
        cache, indices, stage, stage_idx, 1.0 / stage_scale, n, BLOCK_R=block_r,
        DEC=DECODERS["e4m3" if q.is_cuda else "portable"], num_warps=4)  # fmt: skip
    return sparse_mla_decode(
        q,
        stage[:n].view(n, 1, KV_DIM),
        stage_idx,
        KVFormat.FP8,
        sm_scale,
        kv_scale=stage_scale,
        config=config,
        out=out,
        lse=lse,
        dot_dtype=dot_dtype,
    )

"""One GLM-5.x layer's sparse MLA decode over the paged NVFP4 cache: the compute entry point an
attention backend calls (serving/engine/nvfp4_sparse_mla.py names it; this module imports no vLLM).

Absorbed MLA decode (DeepSeek-V2's weight absorption, as vLLM's MLA backends run it): the query's
no-rope part is projected into the 512-dim latent space by W_UK, concatenated with its rope part
(576 dims, the cache row's layout), attended over the DSA indexer's top-k cached tokens, and the
latent output projected to the heads' value dims by W_UV:

    q_lat[b, h] = q_nope[b, h] @ W_UK[h]          ([192] @ [192, 512])
    o_lat[b, h] = softmax(sm_scale * [q_lat, q_pe] . K[slots(b)]) @ K[slots(b), :512]
    out[b, h]   = o_lat[b, h] @ W_UV[h]           ([512] @ [512, 256])

The indexer's top-k are token positions inside each request (-1 = none; positions at or past the
request's length are ignored, so ragged batches share one [B, topk] tensor), mapped to flat cache
slots through the request's block table (vLLM's paging: slot = block_table[b, t // bs] * bs +
t % bs). The attention runs on the CUDA sm_90a kernel (`kernels.cuda_decode`), the Triton kernel,
or the PyTorch reference (`kernels.ref_decode`, any device).
"""

from dataclasses import dataclass

import torch

from kernels.kv_formats import KV_DIM, LATENT_DIM, ROPE_DIM, KVFormat


@dataclass(frozen=True)
class MLADims:
    """One attention layer's dimensions. Defaults: GLM-5.x (glm_moe_dsa; ../shared/notes/glm.md)."""

    heads: int = 64
    qk_nope: int = 192
    qk_rope: int = ROPE_DIM
    v_head: int = 256
    kv_lora: int = LATENT_DIM
    topk: int = 2048

    @property
    def sm_scale(self) -> float:
        return (self.qk_nope + self.qk_rope) ** -0.5


GLM5 = MLADims()


def topk_to_slots(
    topk_tokens: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int
) -> torch.Tensor:
    """[B, topk] token positions per request (-1 = none) -> [B, topk] int32 flat cache slots
    through each request's block table; positions outside [0, seq_len) become -1."""
    t = topk_tokens.long()
    valid = (t >= 0) & (t < seq_lens.long()[:, None])
    tc = torch.where(valid, t, 0)
    blocks = block_table.long().gather(1, tc // block_size)
    slots = blocks * block_size + tc % block_size
    return torch.where(valid, slots, -1).to(torch.int32)


def absorb_q(q_nope: torch.Tensor, q_pe: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """q_nope [B, H, qk_nope], q_pe [B, H, rope], W_UK [H, qk_nope, 512] -> q [B, H, 576] bf16
    (the product in fp32)."""
    q_lat = torch.einsum("bhd,hdl->bhl", q_nope.float(), w_uk.float())
    return torch.cat([q_lat, q_pe.float()], dim=-1).to(torch.bfloat16)


def sparse_mla_decode_layer(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    topk_tokens: torch.Tensor,
    sm_scale: float,
    path: str = "cuda",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's decode: -> (out [B, H, v_head] bf16, lse [B, H] fp32, natural log).
    cache [num_blocks, block_size, 352] uint8 NVFP4 rows; block_table [B, max_blocks] int32;
    seq_lens [B]; topk_tokens [B, topk] int32. path: "cuda" (sm_90a), "triton" or "ref"."""
    block_size = cache.shape[1]
    q = absorb_q(q_nope, q_pe, w_uk)
    slots = topk_to_slots(topk_tokens, block_table, seq_lens, block_size)
    assert q.shape[-1] == KV_DIM
    if path == "cuda":
        from kernels.cuda_decode import sparse_mla_decode_cuda

        o_lat, lse = sparse_mla_decode_cuda(q, cache, slots, sm_scale)
    elif path == "triton":
        from kernels.sparse_decode import sparse_mla_decode

        o_lat, lse = sparse_mla_decode(q, cache, slots, KVFormat.NVFP4, sm_scale)
    elif path == "ref":
        from kernels.ref_decode import sparse_mla_decode_ref

        o_lat, lse = sparse_mla_decode_ref(q, cache, slots, KVFormat.NVFP4, sm_scale)
    else:
        raise ValueError(f"path {path!r}: cuda, triton or ref")
    out = torch.einsum("bhl,hlv->bhv", o_lat.float(), w_uv.float()).to(torch.bfloat16)
    return out, lse

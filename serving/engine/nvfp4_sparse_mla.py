"""The attention backend the project's vLLM plugin would register for GLM-5.x's sparse (DSA) MLA
decode over the NVFP4 cache on Hopper (sm_90a): `Nvfp4SparseMLABackend`, registered as vLLM's
`AttentionBackendEnum.CUSTOM` by `register()`.

What it declares: MLA, sparse, head size 576 (512 latent + 64 rope), bf16 activations, the
`nvfp4_ds_mla` cache dtype in this project's 352-byte row (kernels/README.md: 256 B of E2M1
pairs, 64 B of E4M3 rope, 32 E4M3 block scales; not vLLM's own SM100 layout of that name), pages
of 64 tokens, compute capability 9.x only, no sinks, no multimodal prefix. Its compute is
`kernels.glm_sparse_mla` (the CUDA sm_90a kernel behind one call; no vLLM there), imported when
vLLM first runs the implementation: only a GPU engine builds the kernel.

Not done (issue 51): the engine-side wiring. vLLM's sparse MLA impls also own the prefill path,
the indexer's shared top-k buffer and its logical-to-physical index groups
(`SparseMLACommonImpl`); `Nvfp4SparseMLAImpl.forward_decode` takes decode tokens only, with the
indexer's per-request top-k token positions, and nothing has run it inside an engine yet.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import AttentionBackend
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

KV_CACHE_DTYPE = "nvfp4_ds_mla"
ROW_BYTES = 352  # one token's latent row (kernels.kv_formats.ROW_BYTES[NVFP4])
HEAD_SIZE = 576  # kv_lora_rank 512 + qk_rope_head_dim 64
BLOCK_SIZE = 64  # tokens per page: the kernel's tile
NAME = "ROLLFLEET_NVFP4_SPARSE_MLA"


class Nvfp4SparseMLAImpl:
    """The compute behind the backend: decode tokens only (one query token per request)."""

    def __init__(self, num_heads: int, scale: float, kv_lora_rank: int = 512, **_: Any) -> None:
        self.num_heads, self.scale, self.kv_lora_rank = num_heads, scale, kv_lora_rank

    def forward_decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        topk_tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, H, 576] bf16 (W_UK already absorbed, as vLLM's MLA layer hands it), the paged
        cache [blocks, 64, 352] uint8, block_table [B, max_blocks], seq_lens [B], the indexer's
        top-k token positions [B, topk] (-1 = none) -> (latent out [B, H, 512] bf16, lse [B, H])."""
        from kernels.cuda_decode import sparse_mla_decode_cuda
        from kernels.glm_sparse_mla import topk_to_slots

        slots = topk_to_slots(topk_tokens, block_table, seq_lens, kv_cache.shape[1])
        return sparse_mla_decode_cuda(q, kv_cache, slots, self.scale)


class Nvfp4SparseMLABackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = [KV_CACHE_DTYPE]

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls() -> type:
        return Nvfp4SparseMLAImpl

    @staticmethod
    def get_builder_cls() -> type:
        # block tables, sequence lengths and the request of every token: what the decode needs
        from vllm.model_executor.layers.attention.sparse_mla_attention import (
            SparseMLACommonMetadataBuilder,
        )

        return SparseMLACommonMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[Any]:
        return [BLOCK_SIZE]

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = KV_CACHE_DTYPE,
    ) -> tuple[int, int, int]:
        """One 352-byte row per token (uint8): [num_blocks, block_size, 352]."""
        assert num_kv_heads == 1 and head_size == HEAD_SIZE, (num_kv_heads, head_size)
        return (num_blocks, block_size, ROW_BYTES)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [HEAD_SIZE]

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability: Any) -> bool:
        return capability.major == 9  # wgmma and setmaxnreg: sm_90a only

    @classmethod
    def supports_combination(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: Any,
        block_size: int | None,
        use_mla: bool,
        has_sink: bool,
        use_sparse: bool,
        use_mm_prefix: bool,
        device_capability: Any,
    ) -> str | None:
        if not (use_mla and use_sparse):
            return f"{NAME} serves sparse MLA (DSA) only"
        if has_sink or use_mm_prefix:
            return f"{NAME} has no attention sinks and no multimodal prefix"
        return None


def register() -> type[Nvfp4SparseMLABackend]:
    """Registers the backend as vLLM's CUSTOM attention backend (what the engine plugin calls;
    `--attention-backend CUSTOM` then selects it) and returns the class."""
    register_backend(AttentionBackendEnum.CUSTOM, f"{__name__}.{Nvfp4SparseMLABackend.__name__}")
    return Nvfp4SparseMLABackend

"""serving/engine/nvfp4_sparse_mla.py on CPU: the backend registers as vLLM's CUSTOM attention
backend, vLLM's own validation accepts it for GLM-5.x's sparse MLA on sm_90 and refuses it
elsewhere, and its compute entry point resolves (the kernel itself is tested on the GPU in
tests/kernels)."""

import ast
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402

from serving.engine import nvfp4_sparse_mla as mod  # noqa: E402


@pytest.fixture
def registered():
    AttentionBackendEnum.CUSTOM.clear_override()
    yield mod.register()
    AttentionBackendEnum.CUSTOM.clear_override()


GLM5 = dict(
    head_size=576, dtype=torch.bfloat16, kv_cache_dtype="nvfp4_ds_mla", block_size=64,
    use_mla=True, has_sink=False, use_sparse=True, use_mm_prefix=False,
    use_per_head_quant_scales=False, attn_type="decoder",
)  # fmt: skip


def test_register_makes_it_vllms_custom_backend(registered) -> None:
    assert AttentionBackendEnum.CUSTOM.is_overridden()
    assert AttentionBackendEnum.CUSTOM.get_class() is mod.Nvfp4SparseMLABackend
    assert AttentionBackendEnum.CUSTOM.get_path() == (
        "serving.engine.nvfp4_sparse_mla.Nvfp4SparseMLABackend"
    )
    assert registered.get_name() == "ROLLFLEET_NVFP4_SPARSE_MLA"
    assert registered.get_impl_cls() is mod.Nvfp4SparseMLAImpl


def test_vllm_validation_accepts_glm5_sparse_mla_on_sm90_only(registered) -> None:
    ok = registered.validate_configuration(**GLM5, device_capability=DeviceCapability(9, 0))
    assert ok == []
    for cap in (DeviceCapability(8, 0), DeviceCapability(10, 0)):
        bad = registered.validate_configuration(**GLM5, device_capability=cap)
        assert bad == ["compute capability not supported"]
    sm90 = DeviceCapability(9, 0)
    assert "kv_cache_dtype not supported" in registered.validate_configuration(
        **(GLM5 | {"kv_cache_dtype": "fp8_ds_mla"}), device_capability=sm90
    )
    assert "head_size not supported" in registered.validate_configuration(
        **(GLM5 | {"head_size": 512}), device_capability=sm90
    )
    assert "block_size not supported" in registered.validate_configuration(
        **(GLM5 | {"block_size": 16}), device_capability=sm90
    )
    assert "non-sparse not supported" in registered.validate_configuration(
        **(GLM5 | {"use_sparse": False}), device_capability=sm90
    )
    assert registered.supports_combination(
        576, torch.bfloat16, "nvfp4_ds_mla", 64, True, True, True, False, sm90
    )  # a sink: refused with a reason


def test_kv_cache_is_one_352_byte_row_per_token(registered) -> None:
    assert registered.get_kv_cache_shape(1000, 64, 1, 576) == (1000, 64, 352)
    assert registered.get_supported_kernel_block_sizes() == [64]
    assert registered.is_mla() and registered.is_sparse()


def test_compute_entry_point_resolves_and_imports_no_vllm() -> None:
    from kernels import glm_sparse_mla as entry

    assert callable(entry.sparse_mla_decode_layer) and callable(entry.topk_to_slots)
    tree = ast.parse(Path(entry.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(name.split(".")[0] == "vllm" for name in names), names

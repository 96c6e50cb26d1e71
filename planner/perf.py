"""The GLM-5.x perf model for simulated engines, built from NVIDIA's aiconfigurator-core data.

Dynamo 1.6.1's mocker takes its timing from one of three places: built-in polynomials, an
AISimulate estimator (`--ais-perf-model`, which needs the `aisimulate` package: a placeholder on
PyPI that cannot install here), or a profile table (`--planner-profile-data`, a `.npz` with
`prefill_isl`/`prefill_ttft_ms` and a `decode_active_kv_tokens` x `decode_context_length` grid of
`decode_itl`). This module takes the third way: it compiles the model with aiconfigurator-core
(measured per-operation data of GB200, B200, H200 ... for vLLM, SGLang and TensorRT-LLM) and
evaluates it on the grids the mocker reads. The mocker then owns scheduling, batching, prefix
caching, KV capacity and transfers, as it does for any profile.

What the table cannot say, and how it is handled:
- The mocker looks prefill up by the tokens computed in an iteration only, not by the cached
  prefix they attend to. For GLM-5's sparse attention the cost per new token still grows with
  the prefix (the DSA indexer scores every earlier token; aiconfigurator's vLLM data on GB200:
  6k new tokens take 0.31 s after no prefix and 1.29 s after 134k). The prefill column is
  therefore evaluated at the workload's new-token-weighted mean prefix: since the cost is close
  to linear in the prefix, the prefill work summed over a workload is right, while a single
  turn's TTFT is spread less than it would be.
- MTP (one draft token): each decode step verifies 2 tokens per request (Dynamo's own AIS
  adapter queries the same way) and yields 1 + acceptance tokens; the step time goes in the
  table and `1 + acceptance` becomes the mocker's `decode_speedup_ratio`.
- Attention DP (EP wider than TP: "DEP8" is TP1 EP8): aiconfigurator times a step by one DP
  rank's batch (its MoE sees every rank's tokens), and the mocker runs each rank as an engine of
  its own (`dp_size`), with its own batch and KV cache. So ranks are timed as if equally loaded;
  a real step waits for the busiest rank at every MoE layer, which the table does not charge.
- No aiconfigurator kernel data reads an NVFP4 KV cache: decode time is that of the FP8 cache,
  and the NVFP4 cache changes capacity (bytes per token) and transfer volume only.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from kernels.kv_capacity import INDEXER_ROW_BYTES
from kernels.kv_formats import ROW_BYTES, KVFormat
from planner.descriptors import Geometry

log = logging.getLogger(__name__)

# vLLM's --kv-cache-dtype -> the MLA row format (kernels/kv_formats.py holds the row sizes):
# "fp8" is the seed's 576-byte per-tensor row, "fp8_ds_mla" vLLM's 656-byte FlashMLA row. The
# layers that compute their own top-k also keep the DSA indexer's key row, which no format
# shrinks (`indexer_caches`).
ROW_FORMATS = {"nvfp4": KVFormat.NVFP4, "fp8": KVFormat.FP8, "fp8_ds_mla": KVFormat.FP8_DS,
               "auto": KVFormat.BF16, "bfloat16": KVFormat.BF16}
KV_LAYERS = 78 + 1  # GLM-5.x: 78 decoder layers and the MTP layer each keep a KV cache

# Which checkpoint aiconfigurator models on each system: Blackwell runs the NVFP4 weights, Hopper
# has no FP4 tensor cores and runs the FP8 checkpoint.
CHECKPOINTS = {"gb200": "nvidia/GLM-5.3-NVFP4", "gb300": "nvidia/GLM-5.3-NVFP4",
               "b200_sxm": "nvidia/GLM-5.3-NVFP4", "b300_sxm": "nvidia/GLM-5.3-NVFP4",
               "h200_sxm": "zai-org/GLM-5.3-FP8", "h100_sxm": "zai-org/GLM-5.3-FP8"}


@dataclass(frozen=True)
class PerfSpec:
    """Everything the table depends on (its cache key)."""

    system: str = "gb200"
    backend: str = "vllm"  # whose measured kernels: vllm, sglang or trtllm
    backend_version: str = "current"
    model: str | None = None  # None: CHECKPOINTS[system]
    tp: int = 8  # attention TP per rank group
    moe_ep: int = 8  # experts spread over this many GPUs: > tp adds attention DP, < tp MoE TP
    nextn: int = 1  # MTP draft tokens (0: off)
    mtp_acceptance: float = 0.85  # P(draft accepted); Dynamo's default rate for the first draft
    mean_prefix: int = 0  # tokens of cached prefix the prefill column is evaluated at
    max_batched_tokens: int = 16384
    max_context: int = 204800
    # what a deployment gets out of the measured kernels: the table's times are divided by these
    # (issue 27 fits them to the seed's published point; 1.0 = the data as measured)
    prefill_efficiency: float = 1.0
    decode_efficiency: float = 1.0

    @property
    def checkpoint(self) -> str:
        if self.model:
            return self.model
        if self.system not in CHECKPOINTS:
            raise ValueError(f"no GLM-5.3 checkpoint known for system {self.system!r}; "
                             f"known: {sorted(CHECKPOINTS)} (or set the model)")
        return CHECKPOINTS[self.system]

    @property
    def attention_dp(self) -> int:
        """Attention data-parallel ranks, each with its own batch and KV cache."""
        return max(1, self.moe_ep // self.tp)

    @property
    def moe_tp(self) -> int:
        return max(1, self.tp // self.moe_ep)

    def parallel(self) -> dict[str, int]:
        """aiconfigurator's parallel sizes (tp x attention DP == MoE TP x EP: the worker's GPUs)."""
        if max(self.tp, self.moe_ep) % min(self.tp, self.moe_ep):
            raise ValueError(f"TP{self.tp} EP{self.moe_ep}: one must divide the other "
                             "(a worker's GPUs are TP x attention DP = MoE TP x EP)")
        return {"tp_size": self.tp, "attention_dp_size": self.attention_dp,
                "moe_tp_size": self.moe_tp, "moe_ep_size": self.moe_ep}

    @property
    def decode_speedup(self) -> float:
        """Tokens one decode step yields per request (MTP's accepted drafts + 1)."""
        return 1.0 + (self.mtp_acceptance if self.nextn else 0.0)

    def key(self) -> str:
        blob = json.dumps({**asdict(self), "aic": aic_version()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def aic_version() -> str:
    try:
        return metadata.version("aiconfigurator-core")
    except metadata.PackageNotFoundError:
        return "missing"


def _aic():
    """aiconfigurator-core's compile step and its data roots (set once per process)."""
    try:
        from aiconfigurator_core.sdk import rust_engine_step
        from aiconfigurator_core.sdk.engine import EngineHandle
    except ImportError as exc:  # pragma: no cover - the project installs it
        raise RuntimeError("aiconfigurator-core is not installed (pip install -e .)") from exc
    rust_engine_step._configure_default_data_roots()
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return EngineHandle


def compile_engine(spec: PerfSpec, nextn: int | None = None):
    EngineHandle = _aic()
    return EngineHandle.compile(spec.checkpoint, spec.system, spec.backend,
                                backend_version=spec.backend_version, **spec.parallel(),
                                nextn=spec.nextn if nextn is None else nextn)


def version_label(spec: PerfSpec) -> str:
    scaled = ("" if spec.prefill_efficiency == spec.decode_efficiency == 1.0 else
              f", efficiency prefill x{spec.prefill_efficiency:.2f} decode "
              f"x{spec.decode_efficiency:.2f}")
    return (f"aiconfigurator-core {aic_version()}: {spec.checkpoint} on {spec.system}, "
            f"{spec.backend} {spec.backend_version} data, TP{spec.tp} EP{spec.moe_ep}"
            f"{f' (attention DP{spec.attention_dp})' if spec.attention_dp > 1 else ''}, "
            f"MTP {spec.nextn} (acceptance {spec.mtp_acceptance}){scaled}")


def build_profile(spec: PerfSpec, cache_dir: Path, resolution: int = 80) -> Path:
    """The mocker-format `.npz` for `spec` (built once, then read from `cache_dir`); a table
    with efficiencies is the measured one's, scaled."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"glm_perf_{spec.key()}.npz"
    if path.is_file():
        return path
    measured = replace(spec, prefill_efficiency=1.0, decode_efficiency=1.0)
    if measured == spec:
        table = _measure(spec, resolution)
    else:
        table = dict(np.load(build_profile(measured, cache_dir, resolution)))
        table["prefill_ttft_ms"] = table["prefill_ttft_ms"] / spec.prefill_efficiency
        table["decode_itl"] = table["decode_itl"] / spec.decode_efficiency
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")  # forked workers may build it at once
    np.savez(tmp, **table)
    os.replace(tmp, path)
    path.with_suffix(".json").write_text(json.dumps(
        {"spec": asdict(spec), "label": version_label(spec)}, indent=1))
    (log.debug if measured != spec else log.info)("perf table %s: %s", path.name,
                                                   version_label(spec))
    return path


class NoPerfData(ValueError):
    """aiconfigurator has no measured kernels for this layout on this system and backend."""


def _measure(spec: PerfSpec, resolution: int) -> dict[str, np.ndarray]:
    engine = compile_engine(spec)
    try:
        engine.predict_prefill_latency(1, 1024, 0)
    except RuntimeError as exc:  # aiconfigurator's PerfDataNotAvailableError
        if "perf database error" not in str(exc):
            raise
        raise NoPerfData(f"aiconfigurator-core {aic_version()} has no {spec.backend} data for "
                         f"TP{spec.tp} EP{spec.moe_ep} on {spec.system}: "
                         f"{str(exc).split(' at /')[0]}") from None
    # Prefill: tokens computed in one iteration -> ms, after the workload's mean prefix.
    isl = np.unique(np.concatenate([
        np.geomspace(16, spec.max_batched_tokens, resolution // 2),
        np.linspace(16, 2 * spec.max_batched_tokens, resolution // 2)]).astype(int))
    prefill = np.array([engine.predict_prefill_latency(1, int(n) + spec.mean_prefix,
                                                       spec.mean_prefix) for n in isl])
    # Decode: one step's time for a batch (of one attention-DP rank) whose KV sums to `kv`
    # tokens of mean length `ctx`.
    kv = np.linspace(0, 4_000_000, resolution)
    ctx = np.linspace(256, spec.max_context, resolution)
    itl = np.zeros((len(kv), len(ctx)))
    per_step = 1 + spec.nextn  # tokens verified per request and step
    for i, k in enumerate(kv):
        for j, c in enumerate(ctx):
            bs = int(min(512, max(1, round(k / c))))
            itl[i, j] = engine.decode_step_latency(bs * per_step, int(c), 2)
    return {"prefill_isl": isl.astype(float), "prefill_ttft_ms": prefill,
            "decode_active_kv_tokens": kv, "decode_context_length": ctx, "decode_itl": itl}


def kv_budget_bytes(spec: PerfSpec, gpu_memory_utilization: float = 0.9) -> float:
    """Bytes per GPU left for the KV cache after weights, activations and runtime overheads,
    by aiconfigurator's memory model (its FP8-KV estimate; MLA keeps a full copy per TP rank, so
    this is also what one attention-DP rank holds)."""
    _aic()
    from aiconfigurator_core.sdk import memory

    est = memory.estimate_kv_cache(
        spec.checkpoint, spec.system, spec.backend, spec.backend_version,
        max_num_tokens=spec.max_batched_tokens, max_batch_size=256,
        memory_fraction_kind="of_total", memory_fraction_value=gpu_memory_utilization,
        **spec.parallel(), kvcache_quant_mode="fp8",
        nextn=spec.nextn)
    return float(est["total_kv_size_bytes"])


@functools.cache
def indexer_caches(checkpoint: str = CHECKPOINTS["gb200"]) -> int:
    """Layers that keep a DSA indexer key cache: GLM-5.2/5.3's "IndexShare" layers reuse the
    previous full layer's top-k and keep none. aiconfigurator's model config lists them
    (`indexer_types`: 21 "full" of GLM-5.3's 78), plus the MTP layer's own; 79 + 22 = 101
    registered regions, the count vLLM issue 55434 reports for GLM-5.3 on GB200."""
    import aiconfigurator_core

    name = checkpoint.replace("/", "--") + "_config.json"
    config = json.loads((Path(aiconfigurator_core.__file__).parent / "model_configs" / name)
                        .read_text())
    text = config.get("text_config", config)
    kinds = text.get("indexer_types") or ["full"] * text["num_hidden_layers"]
    return kinds.count("full") + text.get("num_nextn_predict_layers", 0)


def kv_geometry(kv_cache_dtype: str, block: int) -> Geometry:
    """One rank's KV cache by cache format: every layer's MLA row, the indexer rows of the
    layers that keep one."""
    fmt = ROW_FORMATS.get(kv_cache_dtype)
    if fmt is None:
        raise ValueError(f"no MLA row size known for kv_cache_dtype {kv_cache_dtype!r}; "
                         f"known: {sorted(ROW_FORMATS)}")
    return Geometry(KV_LAYERS, ROW_BYTES[fmt], block, indexer_caches(), INDEXER_ROW_BYTES)


def kv_bytes_per_token(kv_cache_dtype: str) -> int:
    """Bytes one token's cache takes on each rank (all layers), by cache format."""
    return kv_geometry(kv_cache_dtype, 1).bytes_per_token


def capacity_tokens(spec: PerfSpec, kv_cache_dtype: str,
                    gpu_memory_utilization: float = 0.9) -> int:
    return int(kv_budget_bytes(spec, gpu_memory_utilization) // kv_bytes_per_token(kv_cache_dtype))


def describe(path: Path) -> dict[str, Any]:
    side = path.with_suffix(".json")
    return json.loads(side.read_text()) if side.is_file() else {}

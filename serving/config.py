"""Serving settings: one small dataclass per concern, built from the Hydra config groups."""

from __future__ import annotations

from dataclasses import dataclass, field


class ServingError(RuntimeError):
    """A serving problem the user can act on; its message is one line and says what to do."""


@dataclass(frozen=True)
class ModelConfig:
    """Which weights to serve. `path: null` selects the embedded tiny GLM model."""

    name: str = "tiny-glm"
    path: str | None = None
    tool_call_parser: str = "glm47"
    reasoning_parser: str | None = None
    enable_thinking: bool = False
    max_model_len: int = 16384
    dtype: str = "bfloat16"
    extra_args: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ServingConfig:
    """How to serve it: `embedded` starts vLLM here; `external` uses a running server."""

    mode: str = "embedded"
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port
    base_url: str | None = None  # for mode=external
    api_key: str = "EMPTY"
    kv_cache_gib: int = 1
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    seed: int = 0
    startup_timeout_s: float = 300.0
    request_timeout_s: float = 600.0
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)


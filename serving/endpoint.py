"""What the rest of the job may know of the serving cluster."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible front door and the model behind it.

    `front_door` names the adapter that spells requests for this server (serving.frontdoor:
    `vllm` for vLLM's own server, `dynamo` for NVIDIA Dynamo's frontend). `model_dir` is the
    local model folder whose tokenizer and chat template render prompts as token ids.
    """

    base_url: str  # ends with /v1
    model: str
    model_dir: str
    front_door: str = "vllm"
    api_key: str = "EMPTY"
    enable_thinking: bool = False
    max_model_len: int = 16384  # the context window: prompt + completion tokens
    request_timeout_s: float = 600.0
    logprobs_mode: str = "raw"  # raw | processed (serving.config.LOGPROBS_MODES)
    engine_ids: tuple[str, ...] = ()
    markup_token_ids: dict[str, int] = field(default_factory=dict)  # tool-call markup -> id
    metrics_urls: dict[str, str] = field(default_factory=dict)  # engine or router -> /metrics
    engine_names: dict[str, str] = field(default_factory=dict)  # Dynamo instance id (hex) -> name

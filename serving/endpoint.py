"""What the rest of the job may know of the serving cluster."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible front door.

    `token_ids` says how this server hands back the sampled token ids: `vllm` (request
    `return_token_ids`, read `prompt_token_ids` / `choices[].token_ids`), `dynamo` (Dynamo's
    frontend: request `nvext.extra_fields`, read `nvext.prompt_token_ids` /
    `nvext.completion_token_ids`, and the engine that served the turn from `nvext.worker_id`)
    or `none` (an external server that cannot; records then carry no ids and say so).
    """

    base_url: str  # ends with /v1
    model: str
    api_key: str = "EMPTY"
    token_ids: str = "vllm"
    enable_thinking: bool = False
    request_timeout_s: float = 600.0
    engine_ids: tuple[str, ...] = ()
    markup_token_ids: dict[str, int] = field(default_factory=dict)  # tool-call markup -> id
    metrics_urls: dict[str, str] = field(default_factory=dict)  # engine or router -> /metrics
    engine_names: dict[str, str] = field(default_factory=dict)  # Dynamo instance id (hex) -> name
    tokenizer_path: str = ""  # tokenizer.json: sampled token ids -> their bytes (token_ids=dynamo)

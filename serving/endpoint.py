"""What the rest of the job may know of the serving cluster: a fixed endpoint, a live roster."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from serving.metrics import KvState, kv_state, prefix_hits
from serving.toolcall import MARKUP_TOKENS


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible front door and the model behind it: facts that never change
    while the cluster runs.

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
    logprobs_mode: str = "behaviour"  # behaviour | raw (serving.config.LOGPROBS_MODES)
    markup_token_ids: dict[str, int] = field(default_factory=dict)  # tool-call markup -> id
    stop_token_ids: list[int] = field(default_factory=list)  # the engines' (engine_stop_ids)
    routed_experts: bool = False  # its engines return each token's MoE experts

    @property
    def missing_markup(self) -> list[str]:
        """Tool-call markup the model has no single token for (the project's grammar needs
        every one)."""
        return [m for m in MARKUP_TOKENS if m not in self.markup_token_ids]

    @property
    def constrainable(self) -> bool:
        return not self.missing_markup


@dataclass(frozen=True)
class EngineSlot:
    """One engine of the cluster as it is now; a restarted engine is a new slot, same name."""

    name: str  # "0" (embedded), "agg0", "prefill0", "decode1", "external"
    role: str = "agg"  # agg | prefill | decode
    metrics_url: str = ""  # its Prometheus /metrics; "" where it has none
    instance_id: str = ""  # the id its front door reports (Dynamo's worker id, hex); "" if none


class Roster:
    """The engines serving now, owned by the cluster and read on every use.

    A restart replaces a slot whole (never an object in place); readers take a snapshot
    (`engines()`, `names()`) and act on it, so a reader never sees half a change.
    """

    def __init__(self, engines: list[EngineSlot] = (), router_metrics: str = "") -> None:
        self._lock = threading.Lock()
        self._engines = tuple(engines)
        self.router_metrics = router_metrics  # the router's /metrics (Dynamo), not an engine's
        self.policy_version = 0  # the weights every engine serves (serving/policy.py)

    def fill(self, engines: list[EngineSlot], router_metrics: str = "") -> None:
        """The engines a cluster started."""
        with self._lock:
            self._engines, self.router_metrics = tuple(engines), router_metrics

    def engines(self) -> tuple[EngineSlot, ...]:
        with self._lock:
            return self._engines

    def replace(self, slot: EngineSlot) -> None:
        """`slot` takes the place of the engine of the same name."""
        with self._lock:
            if not any(e.name == slot.name for e in self._engines):
                raise KeyError(f"no engine named {slot.name!r} in the roster")
            self._engines = tuple(slot if e.name == slot.name else e for e in self._engines)

    def names(self) -> dict[str, str]:
        """The id a front door reports -> the engine's name."""
        return {e.instance_id: e.name for e in self.engines()}

    def metrics_urls(self) -> dict[str, str]:
        """Engine name -> its /metrics, for the engines that have one."""
        return {e.name: e.metrics_url for e in self.engines() if e.metrics_url}

    def kv_states(self) -> list[KvState]:
        """Every engine's KV cache now (MetricsError if one does not answer)."""
        return [kv_state(url) for url in self.metrics_urls().values()]

    def prefix_hits(self) -> dict[str, dict[str, float]]:
        """Per engine: prefix-cache queries and hits (tokens) so far."""
        return prefix_hits(self.metrics_urls())

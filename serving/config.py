"""Serving settings: one small dataclass per concern, built from the Hydra config groups."""

from __future__ import annotations

from dataclasses import dataclass, field

from rollfleet.cli import one_of
from serving.topologies import TOPOLOGIES

LOGPROBS_MODES = {  # serving.logprobs -> vLLM's --logprobs-mode
    # The behaviour policy's: the logprob of the distribution each token was drawn from, after
    # the tool-call grammar's mask and its UTF-8 guard, the logit bias, temperature and top-p,
    # renormalised (vLLM's processed logprobs; a forced token 0, a greedy one 0 too:
    # serving/engine/plugin.py). What an importance ratio divides by.
    "behaviour": "processed_logprobs",
    # The model's own log-softmax at temperature 1 over the whole vocabulary, before penalties,
    # top-p and the grammar's mask (serving/engine/plugin.py).
    "raw": "raw_logprobs",
}


ROUTER_MODES = ("kv", "round-robin", "random")
PAUSE_MODES = ("wait", "abort", "keep")  # what turns in flight do in a weight update (policy.py)
AFFINITY = ("soft", "hard", "off")
KV_TIERS = ("none", "mooncake")


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
    """How to serve it.

    `embedded`: one vLLM server. `kv_routed`: `engines` aggregated vLLM workers behind NVIDIA
    Dynamo's frontend and KV-aware router. `disagg`: `prefill_engines` prefill-only and
    `decode_engines` decode-only workers behind it, KV moved by NIXL. `external`: a running
    OpenAI-compatible server at `base_url`. `mocker`: `engines` simulated engines (NVIDIA
    Dynamo's mocker, no model) behind the same frontend, answering from `replay_trace` if set.
    """

    mode: str = one_of("embedded", TOPOLOGIES)
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port
    base_url: str | None = None  # for mode=external
    api_key: str = "EMPTY"
    kv_cache_gib: int = 1
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    seed: int = 0
    logprobs: str = one_of("behaviour", LOGPROBS_MODES)
    # MoE routing replay: each turn records the experts every token was routed to (vLLM's
    # --enable-return-routed-experts; it needs vLLM's Model Runner V2, which needs a GPU)
    routed_experts: bool = False
    startup_timeout_s: float = 300.0
    request_timeout_s: float = 600.0
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    # RL: which policy checkpoints the run folder keeps (serving/checkpoints.py): the last
    # `keep_checkpoints` versions and every `keep_every`-th (null: none), besides the served one
    keep_checkpoints: int = 2
    keep_every: int | None = None
    # Dynamo topologies (kv_routed, disagg)
    engines: int = 2
    prefill_engines: int = 1
    decode_engines: int = 1
    device: str = one_of("cpu", ("cpu", "cuda"))  # cuda: a GPU deployment, run where GPUs are
    tensor_parallel: int = 1
    data_parallel: int = 1
    kv_cache_dtype: str = "auto"
    prefill_args: list[str] = field(default_factory=list)
    decode_args: list[str] = field(default_factory=list)
    discovery: str = one_of("file", ("file", "etcd"))  # file: one host; etcd (+NATS): several
    etcd_url: str | None = None  # discovery=etcd: an existing etcd; null starts one on loopback
    nats_url: str | None = None  # discovery=etcd: an existing NATS; null starts one on loopback
    router_mode: str = one_of("kv", ROUTER_MODES)
    session_affinity: str = one_of("soft", AFFINITY)
    session_ttl_s: int = 600
    busy_threshold: float = 0.85  # KV use above which an engine is busy and yields its sessions
    frontends: int = 1
    # host-DRAM KV tier shared by all engines (serving/kvtier/), any topology but the mocker
    kv_tier: str = one_of("none", KV_TIERS)
    kv_tier_gib: float = 4.0  # host DRAM the tier holds (the Mooncake store's segment)
    # mocker topology (serving/dynamo/mocker.py)
    speedup_ratio: float = 1.0  # the mocker's simulated engine time is divided by this
    replay_trace: str | None = None  # Mooncake JSONL of completions to answer with


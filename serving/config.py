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

    name: str = "tiny-glm"  # the name requests use (the served model name)
    # the local model folder; null: the tiny GLM model, generated under .cache/models
    path: str | None = None
    tool_call_parser: str = "glm47"  # the server's tool-call parser (tool_constraint=stock)
    reasoning_parser: str | None = None  # the server's reasoning parser; null: none
    enable_thinking: bool = False  # the chat template's enable_thinking
    max_model_len: int = 16384  # the engines' context length (--max-model-len)
    dtype: str = "bfloat16"  # the weights' dtype (--dtype)
    # more vLLM server arguments this model needs
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

    # the topology: embedded, kv_routed, disagg, external, mocker (above)
    mode: str = one_of("embedded", TOPOLOGIES)
    # the address every server binds; another host's clients need this host's
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port
    base_url: str | None = None  # for mode=external
    api_key: str = "EMPTY"  # the bearer token sent to the server
    kv_cache_gib: int = 1  # KV cache per engine on CPU (GPUs size it by memory utilization)
    enforce_eager: bool = True  # vLLM's --enforce-eager: no CUDA graphs
    enable_prefix_caching: bool = True  # vLLM's prefix cache
    seed: int = 0  # the engines' sampling seed (the run's seed)
    # what a turn's logprobs are: behaviour (after every mask) or raw
    logprobs: str = one_of("behaviour", LOGPROBS_MODES)
    # MoE routing replay: each turn records the experts every token was routed to (vLLM's
    # --enable-return-routed-experts; it needs vLLM's Model Runner V2, which needs a GPU)
    routed_experts: bool = False
    startup_timeout_s: float = 300.0  # how long the topology may take to come up
    request_timeout_s: float = 600.0  # one request's limit (and a shed turn's retries')
    # more vLLM server arguments for every engine
    extra_args: list[str] = field(default_factory=list)
    # more environment variables for every engine
    extra_env: dict[str, str] = field(default_factory=dict)
    # RL: which policy checkpoints the run folder keeps (serving/checkpoints.py): the last
    # `keep_checkpoints` versions and every `keep_every`-th (null: none), besides the served one
    keep_checkpoints: int = 2
    keep_every: int | None = None  # also keep every k-th version (null: none)
    # Dynamo topologies (kv_routed, disagg)
    engines: int = 2  # kv_routed, mocker: aggregated workers
    prefill_engines: int = 1  # disagg: prefill-only workers
    decode_engines: int = 1  # disagg: decode-only workers
    device: str = one_of("cpu", ("cpu", "cuda"))  # cuda: a GPU deployment, run where GPUs are
    tensor_parallel: int = 1  # GPUs per worker (--tensor-parallel-size)
    data_parallel: int = 1  # attention data-parallel ranks per worker (--data-parallel-size)
    kv_cache_dtype: str = "auto"  # the KV cache's dtype (--kv-cache-dtype; nvfp4 on GPUs)
    prefill_args: list[str] = field(default_factory=list)  # more vLLM arguments for prefill workers
    decode_args: list[str] = field(default_factory=list)  # more vLLM arguments for decode workers
    discovery: str = one_of("file", ("file", "etcd"))  # file: one host; etcd (+NATS): several
    etcd_url: str | None = None  # discovery=etcd: an existing etcd; null starts one on loopback
    nats_url: str | None = None  # discovery=etcd: an existing NATS; null starts one on loopback
    router_mode: str = one_of("kv", ROUTER_MODES)  # how the Dynamo frontend picks an engine
    # a rollout's turns: soft preference for its engine, hard pin, off
    session_affinity: str = one_of("soft", AFFINITY)
    session_ttl_s: int = 600  # an idle session binding expires after this
    busy_threshold: float = 0.85  # KV use above which an engine is busy and yields its sessions
    frontends: int = 1  # Dynamo frontends (HTTP servers); bindings replicate between them
    # host-DRAM KV tier shared by all engines (serving/kvtier/), any topology but the mocker
    kv_tier: str = one_of("none", KV_TIERS)
    kv_tier_gib: float = 4.0  # host DRAM the tier holds (the Mooncake store's segment)
    # mocker topology (serving/dynamo/mocker.py)
    speedup_ratio: float = 1.0  # the mocker's simulated engine time is divided by this
    replay_trace: str | None = None  # Mooncake JSONL of completions to answer with


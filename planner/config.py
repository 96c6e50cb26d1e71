"""Settings of a fleet simulation (`python -m planner`): the hardware and perf data the
simulated engines are timed by, and the workload. The topology itself is a `serving=` config."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from planner.descriptors import LAYOUTS, TRANSPORTS
from planner.offline import POLICIES
from rollfleet.cli import ConfigError, one_of
from serving import ServingConfig

SYSTEMS = ("gb200", "gb300", "b200_sxm", "b300_sxm", "h200_sxm", "h100_sxm")
PERF_BACKENDS = ("vllm", "sglang", "trtllm")


@dataclass(frozen=True)
class SimulateConfig:
    """Defaults: the seed's deployment, GLM-5.3 on GB200 NVL72, timed by vLLM's measured kernels
    (the engine `serving=glm5_gpu` runs), with the seed's agent sessions."""

    system: str = one_of("gb200", SYSTEMS)  # the GPU system whose perf data times the engines
    perf_backend: str = one_of("vllm", PERF_BACKENDS)  # whose measured kernel times
    mtp_acceptance: float = 0.85  # P(the MTP draft token is accepted)
    prefill_efficiency: float = 1.0  # the perf data's prefill times are divided by this
    decode_efficiency: float = 1.0  # and its decode step times by this
    # KV transfers P -> D: a transport's cost per descriptor and bandwidth (planner/descriptors.py)
    # and the descriptors the layout posts per token time the replay's handoffs and `layouts`
    kv_transport: str = one_of("nixl_cuda_ipc_gb200", tuple(TRANSPORTS))
    kv_layout: str = one_of("per_layer", tuple(LAYOUTS))  # vLLM's default: per_layer
    # a fixed transfer bandwidth per rank in GB/s instead (no descriptor cost; null: the above)
    transfer_gbps: float | None = None
    # host-memory KV tier, GB of distinct KV per GPU of a worker (0: none, as serving=glm5_gpu):
    # a worker's tier is this x its GPUs, shared out among its attention-DP ranks
    host_kv_gb_per_gpu: float = 0.0
    host_gbps: float = 200.0  # host tier <-> GPU per rank, GB/s
    # the share of the fitted efficiencies' gain (over the perf data) that a worker of another
    # layout than the fit's gets: efficiency ** this (1: all of it, 0: the data as measured)
    layout_efficiency_carry: float = 1.0
    # an attention-DP prefill worker's ranks prefill side by side; aiconfigurator times each as
    # if all were equally busy. The share of that dp-fold rate it keeps: 1 (equal ranks), 0 (one
    # rank's rate: the ranks never overlap)
    dp_prefill_overlap: float = 1.0
    gpu_memory_utilization: float = 0.9  # share of GPU memory vLLM may use (sizes the KV cache)
    # workload: "seed"; "static" (aiconfigurator's question: one-turn requests of `isl` tokens,
    # the first `prefix` of them shared by all and cached, `osl` sampled); or a rollfleet run
    # folder whose records give the session shape
    workload: str = "seed"
    # static: the seed's mean turn (its prompt halfway from 8k to 140k; all but a turn's growth
    # cached; its output)
    isl: int = 74_000
    prefix: int = 68_000  # static: tokens of it cached, shared by all
    osl: int = 600  # static: tokens sampled
    total_gpus: int = 40  # static: the GPUs aiconfigurator may deploy (the `plan` answer's 40)
    static_batches: list[int] = field(default_factory=lambda: [1, 4, 8, 16])  # per decode worker
    token_scale: float = 1.0  # records: multiply their token counts by this
    first_prompt: int = 8000  # seed: a session's first prompt, tokens
    growth: int = 6000  # seed: prompt tokens a turn adds
    max_prompt: int = 140_000  # seed: a session ends when its prompt reaches this
    output: int = 600  # seed: tokens sampled a turn
    tool_s: float = 8.0  # seed: tool time between turns, seconds
    sessions: int = 66  # concurrent sessions (per fleet for `run`, per group elsewhere)
    groups: int = 1  # groups of `prefill_engines` P : `decode_engines` D
    lifetimes: int = 3  # sessions each lane runs; figures come from the middle ones
    # the router: kv, round_robin, kv_affine (hard affinity), kv_soft (live)
    policy: str = one_of("kv", (*POLICIES, "kv_soft"))
    # kv: what one cached block is worth against one block of queued prefill when the router
    # picks a worker (Dynamo's overlap_score_credit; null: Dynamo's own, 1.0 in 1.6.1): above 1,
    # sessions stay with the worker that holds their context at a larger load gap
    overlap_credit: float | None = None
    # kv: what a block the worker holds in its host tier (not on the GPU) counts for against a
    # block on the GPU (Dynamo's host_cache_hit_weight; null: Dynamo's own, 0.75 in 1.6.1)
    host_hit_weight: float | None = None
    target_tok_s: float = 100.0  # per user, decoding
    # which tok/s per user meets it: p10 (of the requests' own rates: what the slowest users
    # feel) or mean (over every decoded token)
    target_stat: str = one_of("p10", ("p10", "mean"))
    ttft_slo_s: float = 10.0  # p90 TTFT above this counts as broken
    seed: int = 0  # the workload's and router's seed
    # offline: Dynamo's replay on a virtual clock; live: mocker engines over HTTP
    mode: str = one_of("offline", ("offline", "live"))
    speedup_ratio: float = 20.0  # live mode: the mocker's clock runs this much faster
    out: str | None = None  # JSON of the figures
    plot: str | None = None  # sweep: PNG
    # sweep: the session counts
    sweep_sessions: list[int] = field(default_factory=lambda: [100, 250, 500, 1000, 2000])
    # sweep: the router policies
    sweep_policies: list[str] = field(default_factory=lambda: list(POLICIES))
    jobs: int = 1  # sweep, calibrate, plan: simulations side by side (processes; offline)
    # calibrate: take the knobs of this calibrate JSON, fit none; run, plan: simulate at them
    calibrated: str | None = None
    # calibrate (the fit point, predictions, sensitivity) and plan: over seeds seed ... +n-1
    seeds: int = 1
    predict_ratios: bool = True  # calibrate: search each P:D ratio's capacity (most of the cost)
    sensitivity_plot: str | None = None  # calibrate: sweep each knob's range, plot here (PNG)
    pareto_plot: str | None = None  # calibrate: the ratio search's points, tok/s per GPU vs user
    plan_max_prefill: int = 2  # plan: prefill workers tried, 1 ... this
    plan_max_decode: int = 8  # plan: decode workers tried, 1 ... this
    # plan: worker layouts each role may take: TP<n> (experts over the same n GPUs) or
    # TP<n>EP<m> (m > n: attention DP m/n, as TP1EP8 = "DEP8"; m < n: MoE TP n/m)
    plan_layouts: list[str] = field(default_factory=lambda: ["TP4", "TP8"])
    # calibrate, plan: the pinned knobs at their ranges' ends too (a plan's fleet counts only if it
    # meets the target at every end; ends that move the fit are refitted to the published point)
    knob_ends: bool = True
    rack_gpus: int = 72  # plan: GPUs of one NVLink rack (GB200 NVL72); beyond, KV crosses racks
    # plan: the transport KV takes between racks (null: the same as within one)
    cross_rack_transport: str | None = None


EXPERT_PARALLEL = "--enable-expert-parallel"  # vLLM: experts over TP x DP GPUs, not sliced


def topology(serving: ServingConfig) -> dict:
    """What a simulation takes from a serving config: workers per group, TP, EP, KV format, MTP.
    EP is vLLM's: TP x DP with `--enable-expert-parallel` in both roles' args; without it each
    expert is sliced over the TP GPUs (EP 1), and attention DP needs it here (aiconfigurator
    has no MoE data sliced over more GPUs than one TP group's)."""
    nextn, batched = 0, 16384
    for args in (serving.decode_args, serving.prefill_args):
        for i, arg in enumerate(args):
            if arg == "--speculative-config" and i + 1 < len(args):
                nextn = int(json.loads(args[i + 1]).get("num_speculative_tokens", 0))
            if arg == "--max-num-batched-tokens" and i + 1 < len(args) and args is \
                    serving.prefill_args:
                batched = int(args[i + 1])
    disagg = serving.mode == "disagg"
    ep_roles = {EXPERT_PARALLEL in args for args in (serving.decode_args, serving.prefill_args)}
    if len(ep_roles) > 1:
        raise ConfigError(f"serving: {EXPERT_PARALLEL} in one role's args only; the simulation "
                          "takes one layout for the serving config's workers (the planner's "
                          "simulate.plan_layouts set one per role)")
    tp, dp = serving.tensor_parallel, serving.data_parallel
    if dp > 1 and EXPERT_PARALLEL not in serving.decode_args:
        raise ConfigError(f"serving.data_parallel={dp} without {EXPERT_PARALLEL}: the "
                          "simulation models attention DP with the experts spread over its GPUs")
    return {"prefill": serving.prefill_engines if disagg else 0,
            "decode": serving.decode_engines if disagg else 0,
            "agg": 0 if disagg else serving.engines,
            "tp": tp, "ep": tp * dp if EXPERT_PARALLEL in serving.decode_args else 1,
            "kv_cache_dtype": serving.kv_cache_dtype,
            "nextn": nextn, "prefill_batched_tokens": batched,
            "router_mode": serving.router_mode, "session_affinity": serving.session_affinity}

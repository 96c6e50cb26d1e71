"""One long request's KV moved through Mooncake's transfer engine on loopback: per-(layer, block)
descriptors against block-major (BLHNC) descriptors, side by side in one run.

GLM-5 geometry: 78 layers, 352 bytes per token per layer (the NVFP4 MLA row of kv-formats.md),
16-token blocks, one request of `--tokens` tokens (20,480 by default: 1,280 blocks). A sender
process and a receiver process each run a `mooncake.engine.TransferEngine` (P2P handshake, TCP
on 127.0.0.1) over a KV pool of 1.25x the request's blocks; the request's blocks sit at random
places in both pools, as on a long-running server.
- `per_layer`: pools laid out [layer][block][token x row] (vLLM's per-layer caches), one
  descriptor per (layer, block): 16 x 352 = 5,632 bytes each.
- `block_major`: pools laid out [block][layer][token x row] (BLHNC), one descriptor per block
  of all its layers: 78 x 5,632 = 439,296 bytes each.
Descriptors are submitted in batches of `--batch` (the TCP transport rejects more than ~2,000
queued per peer). Each variant runs `--repeats` times after one warm-up; the receiver checks
every moved byte (sha256 of the destination regions in order against the source's).

    python scripts/bench_kv_layout.py --out bench/kv_layout.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import numpy as np

HOST = "127.0.0.1"
PUBLISHED = "vLLM, TP8, one workload: 19,559 -> ~1,940 descriptors, transfer 146 -> 78 ms"


def _engine():
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    if engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("TransferEngine.initialize failed")
    return engine


def _digest(buf: np.ndarray, offsets: np.ndarray, length: int) -> str:
    h = hashlib.sha256()
    view = memoryview(buf)
    for off in offsets.tolist():
        h.update(view[off:off + length])
    return h.hexdigest()


def receiver(conn, pool_bytes: int) -> None:
    """The destination engine: registers its pool, then answers zero/digest/stop."""
    engine = _engine()
    pool = np.zeros(pool_bytes, dtype=np.uint8)
    if engine.register_memory(pool.ctypes.data, pool_bytes) != 0:
        raise RuntimeError("register_memory failed on the receiver")
    conn.send((f"{HOST}:{engine.get_rpc_port()}", pool.ctypes.data))
    while True:
        cmd, *args = conn.recv()
        if cmd == "zero":
            pool[:] = 0
            conn.send(True)
        elif cmd == "digest":
            offsets, length = args
            conn.send(_digest(pool, offsets, length))
        else:
            conn.send(True)
            return


def descriptors(variant: str, src_ids: np.ndarray, dst_ids: np.ndarray, layers: int,
                pool_blocks: int, region: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(source offsets, destination offsets, bytes per descriptor) of one variant."""
    if variant == "per_layer":  # [L][pool][block bytes]
        lay = np.arange(layers, dtype=np.int64)[:, None]
        src = ((lay * pool_blocks + src_ids[None, :]) * region).ravel()
        dst = ((lay * pool_blocks + dst_ids[None, :]) * region).ravel()
        return src, dst, region
    # block_major: [pool][L][block bytes]
    return (src_ids.astype(np.int64) * layers * region,
            dst_ids.astype(np.int64) * layers * region, layers * region)


def move(engine, target: str, src_base: int, dst_base: int, src: np.ndarray, dst: np.ndarray,
         length: int, batch: int) -> tuple[float, int]:
    """All descriptors, `batch` at a time; -> (seconds, batches)."""
    s, d = (src + src_base).tolist(), (dst + dst_base).tolist()
    batches = 0
    start = time.perf_counter()
    for i in range(0, len(s), batch):
        n = len(s[i:i + batch])
        rc = engine.batch_transfer_sync_write(target, s[i:i + batch], d[i:i + batch],
                                              [length] * n)
        if rc != 0:
            raise RuntimeError(f"batch_transfer_sync_write returned {rc} (batch of {n})")
        batches += 1
    return time.perf_counter() - start, batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=20480)
    ap.add_argument("--layers", type=int, default=78)
    ap.add_argument("--row", type=int, default=352, help="bytes per token per layer")
    ap.add_argument("--block", type=int, default=16, help="tokens per block")
    ap.add_argument("--batch", type=int, default=1000, help="descriptors per submission")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/kv_layout.json"))
    args = ap.parse_args()
    blocks = -(-args.tokens // args.block)
    pool_blocks = blocks + blocks // 4
    region = args.block * args.row
    pool_bytes = pool_blocks * args.layers * region
    rng = np.random.default_rng(args.seed)
    src_ids = rng.choice(pool_blocks, size=blocks, replace=False)
    dst_ids = rng.choice(pool_blocks, size=blocks, replace=False)

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=receiver, args=(child, pool_bytes), daemon=True)
    proc.start()
    results = {}
    try:
        target, dst_base = parent.recv()
        engine = _engine()
        pool = rng.integers(0, 256, size=pool_bytes, dtype=np.uint8)
        if engine.register_memory(pool.ctypes.data, pool_bytes) != 0:
            raise RuntimeError("register_memory failed on the sender")
        for variant in ("per_layer", "block_major"):
            src, dst, length = descriptors(variant, src_ids, dst_ids, args.layers,
                                           pool_blocks, region)
            order = np.argsort(dst, kind="stable")  # digest in destination order on both sides
            times, batches = [], 0
            for rep in range(args.repeats + 1):
                parent.send(("zero",))
                parent.recv()
                seconds, batches = move(engine, target, pool.ctypes.data, dst_base, src, dst,
                                        length, args.batch)
                if rep:  # the first run warms the connection up
                    times.append(seconds)
            parent.send(("digest", dst[order], length))
            verified = parent.recv() == _digest(pool, src[order], length)
            moved = len(src) * length
            results[variant] = {
                "descriptors": len(src), "bytes_per_descriptor": length, "batches": batches,
                "bytes": moved, "ms_median": statistics.median(times) * 1e3,
                "ms_min": min(times) * 1e3, "ms_all": [t * 1e3 for t in times],
                "gbs": moved / statistics.median(times) / 1e9, "verified": verified}
            print(f"[bench] {variant}: {json.dumps(results[variant])}", flush=True)
        parent.send(("stop",))
        parent.recv()
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    a, b = results["per_layer"], results["block_major"]
    print(f"\n{args.tokens} tokens, {args.layers} layers x {args.row} B/token, "
          f"{args.block}-token blocks ({blocks} blocks, {a['bytes'] / 1e6:.0f} MB), Mooncake "
          f"TransferEngine over TCP on {HOST}, {args.batch} descriptors per batch, median of "
          f"{args.repeats}")
    head = (f"{'layout':<13}{'descriptors':>12}{'bytes each':>12}{'ms':>9}{'GB/s':>7}"
            f"{'verified':>10}")
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        print(f"{name:<13}{r['descriptors']:>12,}{r['bytes_per_descriptor']:>12,}"
              f"{r['ms_median']:>9.1f}{r['gbs']:>7.2f}{str(r['verified']):>10}")
    fewer, faster = a["descriptors"] / b["descriptors"], a["ms_median"] / b["ms_median"]
    print(f"block-major: {fewer:.0f}x fewer descriptors (goal >= 10x), {faster:.1f}x less time "
          f"(goal >= 2x)")
    print("published:", PUBLISHED)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.platform(), "python": sys.version.split()[0],
        "versions": {"mooncake-transfer-engine-non-cuda":
                     metadata.version("mooncake-transfer-engine-non-cuda")},
        "parameters": {k: str(v) for k, v in vars(args).items()},
        "blocks": blocks, "pool_blocks": pool_blocks, "results": results,
        "descriptors_ratio": fewer, "time_ratio": faster, "published": PUBLISHED}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Move one request's KV cache from a prefill GPU to a decode GPU, three ways, and time it.

GLM-5 geometry: 78 layers, one 200k-token request, 352-byte NVFP4 or 576-byte FP8 rows,
16- or 64-token blocks. (a) per-layer layout, one copy per (layer, block) as connectors post
descriptors today; (b) block-major (BLHNC) layout, one copy per block of all layers;
(c) the block-major regions through NCCL send/recv, batched into groups.

TP sharding: an MLA layer caches one 576-wide latent per token, with no KV heads to split, and
vLLM keeps a full replica on every TP rank. So each decode rank needs the whole request and a
rank pair moves the same bytes under TP4 and TP8 ("replicated"; the N pairs run at once over
their own links). "split-tpN" is what replication would allow instead: each of the N pairs
moves a disjoint 1/N of the blocks (the decode ranks would then share them locally, not timed).

With 2+ GPUs, (a) and (b) copy GPU0 -> GPU1 and (c) runs in 2 processes; with 1 GPU, (a) and (b)
copy device to device inside GPU 0 and (c) is reported as not run. NVLink multicast stays off.

    python scripts/bench_kv_transfer.py --out $OUT
"""

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
PUBLISHED = "vLLM, TP8, one workload: 19,559 -> ~1,940 descriptors, transfer 146 -> 78 ms"


def copier(dst: torch.Tensor, src: torch.Tensor):
    """copy(d_off, s_off, n): one raw cudaMemcpyAsync between two flat uint8 buffers, on the
    current stream, so that per-call cost stands for per-descriptor cost. Uses cupy's runtime
    binding where installed (~5 us a call from Python on the H200 machine), else torch slices.
    """
    try:
        import cupy
    except ImportError:
        return "torch.copy_", lambda d, s, n: dst[d : d + n].copy_(
            src[s : s + n], non_blocking=True
        )
    rt, stream = cupy.cuda.runtime, torch.cuda.current_stream(src.device).cuda_stream
    dp, sp = dst.data_ptr(), src.data_ptr()
    return "cudaMemcpyAsync (cupy)", lambda d, s, n: rt.memcpyAsync(
        dp + d, sp + s, n, rt.memcpyDefault, stream
    )


def request_blocks(tokens: int, bs: int, pool_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Block ids of one request, scattered over the pool as a long-running server leaves them."""
    return rng.choice(pool_blocks, size=-(-tokens // bs), replace=False)


def run_pair(
    src: torch.Tensor,
    dst: torch.Tensor,
    layers: int,
    bs: int,
    row: int,
    src_ids: np.ndarray,
    dst_ids: np.ndarray,
) -> dict:
    """(a) and (b) between two flat uint8 pools of the same number of blocks."""
    engine, copy = copier(dst, src)
    blk = bs * row
    pool = src.numel() // (layers * blk)
    out = {}
    for name in ("a_per_layer", "b_block_major"):
        dst.zero_()
        if name == "a_per_layer":  # [L, pool, bs, row]: block b of layer l at (l * pool + b)
            lay = np.arange(layers)[:, None]
            s_off = ((lay * pool + src_ids[None, :]) * blk).ravel()
            d_off = ((lay * pool + dst_ids[None, :]) * blk).ravel()
            n = blk
        else:  # [pool, L, bs, row]: all layers of block b in one region
            s_off, d_off, n = src_ids * layers * blk, dst_ids * layers * blk, layers * blk
        pairs = list(zip(d_off.tolist(), s_off.tolist(), strict=True))
        torch.cuda.synchronize(src.device)
        torch.cuda.synchronize(dst.device)
        t = time.perf_counter()
        for d, s in pairs:
            copy(d, s, n)
        torch.cuda.synchronize(src.device)
        torch.cuda.synchronize(dst.device)
        dt = time.perf_counter() - t
        k = min(32, len(pairs))
        ok = all(
            torch.equal(src[s : s + n], dst[d : d + n].to(src.device))
            for d, s in pairs[:: max(1, len(pairs) // k)]
        )
        out[name] = {
            "engine": engine,
            "copies": len(pairs),
            "bytes": len(pairs) * n,
            "ms": dt * 1e3,
            "gbs": len(pairs) * n / dt / 1e9,
            "verified": ok,
        }
    return out


def nccl_worker(
    rank: int, cases: list[dict], layers: int, group: int, port: int, result_path: str
) -> None:
    """(c): rank 0 sends each request block's block-major region, rank 1 receives; batched."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    results = []
    for c in cases:
        region = layers * c["block"] * c["row"]
        g = torch.Generator(device="cuda").manual_seed(1)
        pool = torch.randint(
            0, 256, (c["pool_blocks"], region), generator=g, device="cuda", dtype=torch.uint8
        )
        if rank == 1:
            pool.zero_()
        ids = c["src_ids"] if rank == 0 else c["dst_ids"]
        op = dist.isend if rank == 0 else dist.irecv
        ops = [dist.P2POp(op, pool[i], 1 - rank) for i in ids]
        for w in dist.batch_isend_irecv(ops[:8]):  # connect outside the timed region
            w.wait()
        torch.cuda.synchronize()
        dist.barrier()
        t = time.perf_counter()
        for i in range(0, len(ops), group):
            for w in dist.batch_isend_irecv(ops[i : i + group]):
                w.wait()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        sample = torch.stack([pool[i].view(torch.int32).sum(dtype=torch.int64) for i in ids[:16]])
        peer = sample.clone()
        dist.broadcast(peer, src=0)
        results.append(
            {
                "copies": len(ids),
                "groups": -(-len(ids) // group),
                "bytes": len(ids) * region,
                "ms": dt * 1e3,
                "gbs": len(ids) * region / dt / 1e9,
                "verified": bool(torch.equal(peer, sample)),
            }
        )
        del pool
        torch.cuda.empty_cache()
    if rank == 1:
        Path(result_path).write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--layers", type=int, default=78)
    ap.add_argument("--rows", default="352,576")
    ap.add_argument("--blocks", default="16,64")
    ap.add_argument("--shards", default="replicated,split-tp4,split-tp8")
    ap.add_argument("--nccl-group", type=int, default=1024, help="P2P ops per NCCL group")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    ngpu = torch.cuda.device_count()
    assert ngpu >= 1, "needs a CUDA GPU"
    rng = np.random.default_rng(0)
    src_dev, dst_dev = torch.device("cuda", 0), torch.device("cuda", min(1, ngpu - 1))
    if ngpu >= 2:
        torch.empty(1, device=dst_dev).copy_(torch.empty(1, device=src_dev))  # peer access on
    res = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpus": [torch.cuda.get_device_name(i) for i in range(ngpu)],
        "torch": torch.__version__,
        "direction": "GPU0 -> GPU1"
        if ngpu >= 2
        else "GPU0 -> GPU0 (one GPU: device to device, no link)",
        "published": PUBLISHED,
        "cases": [],
    }
    nccl_cases = []
    for row in map(int, args.rows.split(",")):
        for bs in map(int, args.blocks.split(",")):
            blocks = -(-args.tokens // bs)
            pool_blocks = blocks + blocks // 4
            nbytes = pool_blocks * args.layers * bs * row
            src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=src_dev)
            dst = torch.empty(nbytes, dtype=torch.uint8, device=dst_dev)
            src_all = request_blocks(args.tokens, bs, pool_blocks, rng)
            dst_all = request_blocks(args.tokens, bs, pool_blocks, rng)
            for shard in args.shards.split(","):
                tp = 1 if shard == "replicated" else int(shard.rsplit("tp", 1)[1])
                s_ids, d_ids = src_all[::tp], dst_all[::tp]  # rank 0's share under split-tpN
                case = {
                    "row": row,
                    "block": bs,
                    "shard": shard,
                    "blocks_moved": len(s_ids),
                    **run_pair(src, dst, args.layers, bs, row, s_ids, d_ids),
                }
                res["cases"].append(case)
                print(json.dumps(case), flush=True)
                nccl_cases.append(
                    {
                        "row": row,
                        "block": bs,
                        "pool_blocks": pool_blocks,
                        "src_ids": s_ids.tolist(),
                        "dst_ids": d_ids.tolist(),
                    }
                )
            del src, dst
            torch.cuda.empty_cache()
    if ngpu >= 2:
        path = str(Path(args.out, "nccl_results.json"))
        mp.start_processes(
            nccl_worker,
            nprocs=2,
            start_method="spawn",
            args=(nccl_cases, args.layers, args.nccl_group, 29517, path),
        )
        for case, r in zip(res["cases"], json.loads(Path(path).read_text()), strict=True):
            case["c_nccl_batched"] = r
    else:
        res["not_run"] = (
            "(c) NCCL send/recv and every cross-GPU copy: this machine has one GPU; "
            "(a)/(b) ran device to device inside GPU 0, so their times show the cost "
            "per copy call and HBM speed, nothing about a link"
        )
    Path(args.out, "bench_kv_transfer.json").write_text(json.dumps(res, indent=1))
    engine = res["cases"][0]["a_per_layer"]["engine"]
    print(f"{res['direction']} | {engine} | {res['gpus'][0]} x{ngpu} | torch {res['torch']}")
    print(
        f"{'row':>4} {'blk':>4} {'shard':<11} {'method':<14} {'copies':>8} {'GB':>6} "
        f"{'ms':>9} {'GB/s':>7} ok"
    )
    for c in res["cases"]:
        for m in ("a_per_layer", "b_block_major", "c_nccl_batched"):
            if m in c:
                r = c[m]
                print(
                    f"{c['row']:>4} {c['block']:>4} {c['shard']:<11} {m:<14} {r['copies']:>8} "
                    f"{r['bytes'] / 1e9:>6.2f} {r['ms']:>9.1f} {r['gbs']:>7.1f} {r['verified']}"
                )
    print("published:", PUBLISHED)
    if "not_run" in res:
        print("NOT RUN:", res["not_run"])


if __name__ == "__main__":
    main()

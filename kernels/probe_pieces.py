"""Where the CUDA decode's time goes (issue 29, rounds 10, 11; issue 51): one call's pieces, timed.

    python3 -m kernels.probe_pieces --variants 15,16 [--out DIR]     (on the H200)
    python3 -m kernels.probe_pieces --heads 64 --batch 128 --variants 27,29,31  (the 64-head kernel)

Each piece is captured in a CUDA graph and its replays timed as scripts/bench_kernels.py times a
whole call (triton's do_bench, L2 flushed before every replay, median): the whole call, the
decode kernel alone, the combine kernel alone, a 4-byte fill (what one graph replay of one tiny
kernel costs under this timer), and the decode kernel alone with 1..16 tiles per CTA at the same
128 CTAs (a line through those: the fixed cost per launch and the cost per tile). Then the
profiler's kernel durations for the whole call (decode, combine, the gap between them), and for
variant 28 the clock of each phase in every CTA (`stamped`), for variants 31, 32 (H > 16) each
role's summed wait clocks (`stamped64`). Prints one table; writes
probe_pieces.json (other shapes: probe_pieces_h{H}_b{B}.json) under --out.
"""

import argparse
import json
import math
import os
from functools import partial
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from kernels.cache_write import write_kv_cache
from kernels.cuda_decode import _ext, sparse_mla_decode_cuda, split_plan
from kernels.kv_formats import KV_DIM, LATENT_DIM, ROW_BYTES, KVFormat
from kernels.sparse_decode import _combine_kernel
from kernels.testdata import heavy_tailed, logit_scaled_q

SM_SCALE = 1 / math.sqrt(192)


def captured(fn) -> torch.cuda.CUDAGraph:
    """fn run once (its lazy setup and compile outside the graph), then captured as a graph:
    what every timing here replays, so launch overhead never counts."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def timed_us(fn) -> float:
    graph = captured(fn)
    return do_bench(graph.replay, warmup=25, rep=100, return_mode="median") * 1e3


def flushed_us(fn, dirty: bool, reps: int = 50) -> float:
    """Median us of fn's graph replay after flushing L2 by writing 256 MB (dirty=True, as
    do_bench does: the L2 is left full of dirty lines, which each miss of fn must write back) or
    by reading them (clean lines). Events around each replay; the same loop for both."""
    graph = captured(fn)
    buf = torch.empty(64 << 20, dtype=torch.int32, device="cuda")
    times = []
    for i in range(reps + 5):
        if dirty:
            buf.zero_()
        else:
            buf.sum()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def profiled(fn, reps: int = 20) -> dict:
    """Kernel durations (us) and the gap between consecutive kernels of one graph replay, from
    the profiler (median over `reps` replays, L2 flushed before each as in timed_us)."""
    graph = captured(fn)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            graph.replay()
        torch.cuda.synchronize()
    evs = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    runs, cur = [], []
    for e in evs:  # one run = the kernels after each flush
        if "elementwise" in e.name or "fill" in e.name.lower() or "zero" in e.name.lower():
            if cur:
                runs.append(cur)
            cur = []
            continue
        cur.append(e)
    if cur:
        runs.append(cur)
    runs = [r for r in runs if r]
    if not runs:
        return {"error": "no kernels recorded", "names": sorted({e.name for e in evs})[:10]}
    n = len(runs[0])
    out = {"kernels": [r.name[:40] for r in runs[0]], "runs": len(runs)}

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    full = [r for r in runs if len(r) == n]
    out["dur_us"] = [med([r[i].time_range.elapsed_us() for r in full]) for i in range(n)]
    out["gap_us"] = [
        med([r[i + 1].time_range.start - r[i].time_range.end for r in full]) for i in range(n - 1)
    ]
    out["span_us"] = med([r[-1].time_range.end - r[0].time_range.start for r in full])
    return out


STAMP_VARIANTS = (28,)  # csrc's kStamp: the phases' clocks of every CTA
# stamp slots (decode_sm90.cu): 0 / 8 globaltimer ns at the start / end, 1 / 9 clock64 there,
# 2..7 clock64 at: the loader's first copy issued, Q ready, tile 0's rows in, the tile loop done,
# both CTAs of the pair staged, the merged output stored
PHASES = {2: "first_copy", 3: "q_ready", 4: "tile0_in", 5: "loop_done", 6: "staged", 7: "stored"}


def stamped(ext, args: tuple, bsz: int, nsplit: int, v: int, runs: int = 10) -> dict:
    """Each phase's time from its CTA's start (median over CTAs, then over runs, us; clock64 at
    the clock rate this CTA's globaltimer gives), the spread of the CTAs' starts and the first
    start to the last end; L2 flushed before each run, as the timings are."""
    dev = args[0].device
    buf = torch.zeros(bsz * nsplit * 32, dtype=torch.int32, device=dev)
    flush = torch.empty(256 << 20, dtype=torch.int8, device=dev)

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    rows = []
    for _ in range(runs):
        flush.zero_()
        buf.zero_()
        ext.decode(*args, v, buf)
        torch.cuda.synchronize()
        st = buf.view(torch.int64).view(-1, 16).cpu().double()
        ghz = med(((st[:, 9] - st[:, 1]) / (st[:, 8] - st[:, 0])).tolist())
        r = {"ghz": ghz}
        for i, name in PHASES.items():
            r[name] = med(((st[:, i] - st[:, 1]) / ghz / 1e3).tolist())
        r["end"] = med(((st[:, 9] - st[:, 1]) / ghz / 1e3).tolist())
        r["start_spread"] = (st[:, 0].max() - st[:, 0].min()).item() / 1e3
        r["span"] = (st[:, 8].max() - st[:, 0].min()).item() / 1e3
        rows.append(r)
    return {k: med([r[k] for r in rows]) for k in rows[0]}


STAMP64_VARIANTS = (31, 32)  # csrc's Stamp64: per-role wait clocks of the 64-head kernel
# slot -> name: sums over a CTA's tiles (one thread of each role), except the two clocks marked
# `at` (from the CTA's start)
WAITS64 = {
    2: "producer_wait_empty",
    3: "producer_decode_and_loads",
    4: "g1_wait_full",
    5: "g1_qk_issue_and_wait",
    11: "g1_softmax",
    12: "g1_pv_wait",
    13: "g1_wait_pfree",
    6: "g2_wait_p",
    14: "g2_decode_and_loads",
    15: "g2_wait_empty",
    10: "g1_q_ready_at",
    7: "g1_loop_done_at",
}


STAMP_ENDS_VARIANTS = (39, 44)  # csrc's StampEnds: when the 64-head kernel reaches its ends
# slot -> name (from the CTA's start): the producer's tile 0 handed over, Q in shared memory, tile
# 0 seen by group 1, group 1's loop done, group 1's half of the output staged (group 2 at the
# barrier: its loop done too), both halves staged, the producer's loop done (the end clock: group
# 1's stores issued)
ENDS64 = {
    4: "tile0_decoded_at",
    10: "q_ready_at",
    11: "tile0_in_at",
    7: "g1_loop_done_at",
    2: "g2_loop_done_at",
    3: "staged_at",
    12: "producer_done_at",
}


def stamped64(
    ext, args: tuple, bsz: int, nsplit: int, v: int, runs: int = 10, names: dict = WAITS64
) -> dict:
    """Variants 31, 32 (H > 16): each role's summed wait and work clocks per CTA (us; median over
    CTAs, then over runs; L2 flushed before each run), and the CTA's start-to-end time; with
    names=ENDS64 (variant 39), when each end of the kernel is reached."""
    dev = args[0].device
    buf = torch.zeros(bsz * nsplit * 32, dtype=torch.int32, device=dev)
    flush = torch.empty(256 << 20, dtype=torch.int8, device=dev)

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    rows = []
    for _ in range(runs):
        flush.zero_()
        buf.zero_()
        ext.decode(*args, v, buf)
        torch.cuda.synchronize()
        st = buf.view(torch.int64).view(-1, 16).cpu().double()
        ghz = med(((st[:, 9] - st[:, 1]) / (st[:, 8] - st[:, 0])).tolist())
        r = {"ghz": ghz, "cta_us": med(((st[:, 9] - st[:, 1]) / ghz / 1e3).tolist())}
        for i, name in names.items():
            x = st[:, i] - (st[:, 1] if name.endswith("_at") else 0)
            r[name] = med((x / ghz / 1e3).tolist())
        r["span"] = (st[:, 8].max() - st[:, 0].min()).item() / 1e3
        rows.append(r)
    return {k: med([r[k] for r in rows]) for k in rows[0]}


def fit(sweep: dict) -> tuple[float, float]:
    """Least squares through (tiles, us): (us per tile, fixed us)."""
    xs, ys = list(sweep), list(sweep.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return slope, my - slope * mx


def probe_variant(q, cache, idx, v: int, sms: int) -> dict:
    bsz, heads, _ = q.shape
    topk, dev = idx.shape[1], q.device
    nsplit, split_len = split_plan(bsz, heads, topk, 0, sms, v)
    out = torch.empty(bsz, heads, LATENT_DIM, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(bsz, heads, dtype=torch.float32, device=dev)
    opart = torch.empty(bsz, nsplit, heads, LATENT_DIM, dtype=torch.float32, device=dev)
    lpart = torch.empty(bsz, nsplit, heads, dtype=torch.float32, device=dev)
    none = torch.empty(0, dtype=torch.int32, device=dev)
    ext, qk_scale = _ext(), SM_SCALE * math.log2(math.e)

    def kernel(idx_=idx, split_len_=split_len):
        ext.decode(q, cache, idx_, opart, lpart, out, lse, qk_scale, split_len_, nsplit, v, none)

    def combine():
        _combine_kernel[(bsz, heads)](
            opart, lpart, out, lse, 1.0, heads, nsplit, out.stride(0), out.stride(1),
            BLOCK_S=triton.next_power_of_2(nsplit), num_warps=8)  # fmt: skip

    full = partial(sparse_mla_decode_cuda, q, cache, idx, SM_SCALE, variant=v)
    r = {
        "nsplit": nsplit,
        "full_us": timed_us(full),
        "kernel_us": timed_us(kernel),
        "combine_us": timed_us(combine),
        "kernel_plus_combine_us": timed_us(lambda: (kernel(), combine())),
        "full_dirty_flush_us": flushed_us(full, dirty=True),
        "full_clean_flush_us": flushed_us(full, dirty=False),
    }
    sweep = {}
    for tiles in (1, 2, 4, 8, 16):  # per CTA, at the same nsplit CTAs per query
        tk = min(topk, tiles * 64 * nsplit)
        sweep[tiles] = timed_us(partial(kernel, idx[:, :tk].contiguous(), tiles * 64))
    r["kernel_by_tiles_us"] = sweep
    r["per_tile_us"], r["fixed_us"] = fit(sweep)
    r["kernel_all_padding_us"] = timed_us(partial(kernel, torch.full_like(idx, -1)))
    args = (q, cache, idx, opart, lpart, out, lse, qk_scale, split_len, nsplit)
    if v in STAMP_VARIANTS and nsplit == 2:
        r["stamps_us"] = stamped(ext, args, bsz, nsplit, v)
    if v in STAMP64_VARIANTS and heads > 16:
        r["waits_us"] = stamped64(ext, args, bsz, nsplit, v)
    if v in STAMP_ENDS_VARIANTS and heads > 16:
        r["waits_us"] = stamped64(ext, args, bsz, nsplit, v, names=ENDS64)
        one = (q, cache, idx[:, :64].contiguous(), opart, lpart, out, lse, qk_scale, 64, nsplit)
        r["waits_us_1tile"] = stamped64(ext, one, bsz, nsplit, v, names=ENDS64)
    try:
        r["profile"] = profiled(full)
    except Exception as e:  # the timings above stand without it
        r["profile"] = {"error": repr(e)[:300]}
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="15")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1234)
    pool_n, topk, heads, bsz = 1 << 21, 2048, args.heads, args.batch
    kv = heavy_tailed((pool_n, KV_DIM), gen)
    cache = torch.empty(pool_n // 64, 64, ROW_BYTES[KVFormat.NVFP4], dtype=torch.uint8, device=dev)
    write_kv_cache(kv, torch.arange(pool_n, device=dev), cache, KVFormat.NVFP4)
    q = logit_scaled_q(bsz, heads, kv, SM_SCALE, gen)
    idx = torch.randint(0, pool_n, (bsz, topk), generator=gen, device=dev, dtype=torch.int32)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    res: dict = {"H": heads, "B": bsz, "topk": topk, "variants": {}}
    tiny = torch.empty(1, dtype=torch.int32, device=dev)
    res["one_fill_us"] = timed_us(lambda: tiny.fill_(1))
    for v in (int(x) for x in args.variants.split(",") if x):
        r = res["variants"][v] = probe_variant(q, cache, idx, v, sms)
        print(f"v{v}", json.dumps(r), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    name = "probe_pieces" + ("" if (heads, bsz) == (16, 64) else f"_h{heads}_b{bsz}")
    (Path(args.out) / f"{name}.json").write_text(json.dumps(res, indent=1))
    print(f"\nH{heads} B{bsz} topk {topk}: a 4-byte fill replayed: {res['one_fill_us']:.1f} us")
    print("  v splits   full kernel combine   k+c  fixed  per-tile padding | profiler: us, gap")
    for v, r in res["variants"].items():
        pr = r["profile"]
        prs = f"{pr.get('dur_us')} gap {pr.get('gap_us')}" if "dur_us" in pr else str(pr)[:80]
        print(
            f"{v:>3} {r['nsplit']:>6} {r['full_us']:6.1f} {r['kernel_us']:6.1f}"
            f" {r['combine_us']:7.1f} {r['kernel_plus_combine_us']:5.1f} {r['fixed_us']:6.1f}"
            f" {r['per_tile_us']:9.2f} {r['kernel_all_padding_us']:7.1f} | {prs}"
        )
        print(f"    v{v} full call after a dirty / clean L2 flush: {r['full_dirty_flush_us']:.1f}"
              f" / {r['full_clean_flush_us']:.1f} us")  # fmt: skip
        for key in ("waits_us", "waits_us_1tile"):
            if key in r:
                print(f"    v{v} {key} per CTA, us (sums over tiles; _at: from the CTA's start):", {
                    k: round(x, 2) for k, x in r[key].items()})  # fmt: skip
        if "stamps_us" in r:
            print(f"    v{v} phases, us from a CTA's start:", {
                k: round(x, 2) for k, x in r["stamps_us"].items()})  # fmt: skip


if __name__ == "__main__":
    main()

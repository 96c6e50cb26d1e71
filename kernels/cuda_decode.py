"""NVFP4 sparse MLA decode in CUDA C++ for Hopper (sm_90a): FlashMLA's structure, where Triton
stops (kernels/NOTES.md).

`kernels/csrc/decode_sm90.cu` is warp-specialized: a producer warp group gathers each tile's top-k
rows and decodes them to fp16 in registers while consumer warp groups run wgmma on the previous
tile: for H > 16 one group computes the scores, the softmax and half of P V, the other the other
half; for H <= 16 (variants 4-10) one group computes S^T = K Q^T and O^T = V^T P^T with N = 16
heads, two CTAs per SM (4, 5), or one CTA per SM whose rows arrive by bulk copies two tiles ahead
(6; 7: two consumer groups); 8, 9, 10 (fewer instructions per decoded value), 14, 15 (10's
kernel built with a fused merge, whose register allocation spills nothing) and 16-25 (round 10)
decode wgmma's A fragments straight from the bulk-copied rows into registers, with no fp16 tile
(kernels/README.md, "The CUDA kernel"). The default, 38 (issue 51, round 2): at H > 16 variant
29's 64-head kernel (a leaner producer decode, Q and the output in its dim order) with Q K^T's
k-steps in a run-time loop (36), Q copied by cp.async and the output stored through shared memory,
above 2 tiles a split, else variant 5's; at H <= 16 variant 27 (round 11): with more
than 8 tiles a split, two consumer groups on alternate tiles, each waiting after every wgmma
batch for the one before (so that both fit 224 registers with no serialized wgmma; variant 24),
else one group (16);
at 2 splits the two splits of a query run as a cluster of two CTAs that merge their partials
through distributed shared memory, and 3-4 splits are merged by a CUDA combine kernel that the same
call launches with programmatic dependent launch (26: that kernel at 2 splits too). Same interface,
reference and tests as `kernels.sparse_decode.sparse_mla_decode`, NVFP4 only; its splits are
merged by that module's combine kernel, by csrc's (variants 21-28, few heads), by the split pair's
cluster (27, 28), or (variant 14, few heads, 2 splits) by the last split of each query to finish,
inside the decode kernel (1.1 us slower than the Triton combine kernel at H16 B64, round 9). Built
on first use by `torch.utils.cpp_extension.load` (needs nvcc and an sm_90 GPU); the Triton kernel
stays the portable path.
"""

import functools
import math
import os
from pathlib import Path

import torch
import triton

from kernels.kv_formats import KV_DIM, LATENT_DIM, ROW_BYTES, KVFormat
from kernels.sparse_decode import _combine_kernel

HEADS_PER_CTA = 64  # wgmma's M: fewer heads are padded
TILE = 64  # cached rows per pipeline stage; splits are whole tiles
# Kernel variants (csrc/decode_sm90.cu's header; all share the producer and the interface):
VARIANTS = {
    0: "round 4: both consumer groups compute half of S each, maxima exchanged in shared memory",
    1: "group 1: all of S, softmax, P V from registers; group 2: P V from shared memory",
    2: "1 + the producer prefetches the rows of the tile after next into L2",
    3: "2 + group 1 issues the next tile's Q K^T right behind its P V",
    4: "H <= 16: few-heads kernel (S^T = K Q^T with N = 16 heads, O^T = V^T P^T, one producer and "
    "one consumer group, two CTAs per SM); more heads: 2",
    5: "4, with the producer loading the next tile's rows after handing over this one, all at once",
    6: "H <= 16: rows gathered by bulk copies (TMA) into a ring two tiles ahead, two producer "
    "groups decoding from shared memory into two fp16 stages, one consumer group, one CTA per SM; "
    "more heads: 5",
    7: "6 with two consumer groups on alternate tiles (one per stage), merged at the end",
    8: "H <= 16: no fp16 tile: rows gathered by bulk copies into a ring four tiles ahead, the "
    "consumer group decodes wgmma's A fragments from them into registers; more heads: 5",
    9: "8 with two consumer groups on alternate tiles, merged at the end",
    10: "8 with fewer instructions per decoded value: converts read either half of a register (no "
    "shift), fragment slots take the pairs the converts produce (no byte interleave; Q permuted to "
    "match), P V's two rows interleaved as packed bytes before the decode",
    14: "10 with the combine fused at 2 splits: every split writes its partial and counts itself "
    "in a per-query counter; the last to count merges the partials (no combine kernel); more "
    "splits: the combine kernel; more heads: 5",
    15: "14's kernel (the same build) with the combine kernel at every split count: 10's "
    "decode with no spill in the tile loop",
    16: "15 with O^T's first k-step decoded before waiting for S^T's wgmmas (under their tail and "
    "the softmax's barriers)",
    17: "16 without the wait for O^T's wgmmas at the end of each tile (the next tile's S^T decode "
    "runs under them)",
    18: "10's decode with two consumer groups on alternate tiles (9's layout)",
    19: "18 waiting after each wgmma batch for the one before (only two batches' A fragments "
    "live, so that two consumer groups fit 224 registers without serialized wgmmas)",
    20: "15 waiting after each wgmma batch for the one before (as 19, one consumer group)",
    21: "15's kernel with its splits merged by a CUDA combine kernel launched with programmatic "
    "dependent launch (PDL) right behind it, by the same call; more heads: 5",
    22: "21 with a plain launch of the CUDA combine kernel (no PDL)",
    23: "19's kernel (two consumer groups, one wgmma batch in flight) with 21's combine (PDL)",
    24: "23 with O^T's first k-step decoded before waiting for S^T (as 16)",
    25: "24 with the decode kernel letting the combine kernel launch as soon as all its CTAs run",
    26: "24's kernel at more than 8 tiles a split, else 16's (one consumer group); the CUDA "
    "combine at 2-4 splits, the Triton one at more",
    27: "26 with the two splits of a query (at 2 splits) run as a cluster of two CTAs that merge "
    "their partials through distributed shared memory: no partials in global memory, no combine "
    "kernel",
    28: "27 writing its phases' clock stamps into a buffer passed as counters (kernels/"
    "probe_pieces.py; none without one)",
    29: "H > 16: 5 with a leaner producer decode (no byte interleave, converts reading either "
    "half of a register: each 8 dims stored in the order [0 2 4 6 1 3 5 7], Q stored in that "
    "order, the output put back when stored); few heads: 27",
    30: "H > 16: 29 with warp group 2 (which only waits for P most of a tile) decoding the latent "
    "dims 256..511 of the tile after next, the producer the rest; few heads: 27",
    31: "29 writing each role's wait clocks into a buffer passed as counters (kernels/"
    "probe_pieces.py, H > 16; none without one)",
    32: "30 with 31's clocks",
    33: "H > 16: 29 with a shorter softmax in group 1 (qk folded into exp2's FMA, masking skipped "
    "on tiles with no padding, tree maxima and sums) and a row's reference max moved only when "
    "the tile's max exceeds it by more than 8 (log2 units; P <= 2**8), so that both groups skip "
    "the [64, 512] rescale when no row of a warp moved it; few heads: 27",
    34: "H > 16: 29 above 2 tiles a split, else 5 (29 is ~1.3 us slower at 1 tile a split); few "
    "heads: 27",
    35: "H > 16: 33 with Q K^T's 36 k-steps as a run-time loop over 9 blocks of 4 (unrolled, ptxas "
    "kept all 72 descriptors in registers across the tile loop and spilled group 1); few heads: 27",
    36: "H > 16: 29 with 35's k-step loop; few heads: 27",
    37: "H > 16: 36 above 2 tiles a split, else 5; few heads: 27",
    38: "H > 16: 37 with compact ends: Q copied by cp.async in rolled loops (no 18 unrolled "
    "chunks), the output staged in shared memory as bf16 and stored 16 bytes at a time; few "
    "heads: 27",
    39: "H > 16: 38's kernel at every split count, writing its ends' clocks into a buffer passed "
    "as counters (kernels/probe_pieces.py; none without one); few heads: 27",
    40: "H > 16: 38 with group 1 issuing the next tile's Q K^T right behind its P V (as 3); few "
    "heads: 27",
    41: "H > 16: 38 with the producer asking for tile 1's rows and tile 2's L2 prefetch only once "
    "group 1 has Q (the start's memory traffic is Q and tile 0; not yet run on a GPU); few "
    "heads: 27",
    42: "H > 16: 38 with the split's indices prefetched into L2 at the start and each tile's index "
    "load issued behind the row loads (not inside the decode, before the hand-over's release "
    "fence; not yet run on a GPU); few heads: 27",
    43: "H > 16: 38 with 41's and 42's producer (not yet run on a GPU); few heads: 27",
    44: "H > 16: 43's kernel at every split count with 39's clocks (not yet run on a GPU); few "
    "heads: 27",
}
DEFAULT_VARIANT = 38
FEW_HEADS = 16  # variant 4's few-heads kernel: heads per CTA (no padding to 64)
# few-heads kernels: CTAs per SM
FEW_VARIANTS = {4: 2, 5: 2} | dict.fromkeys((6, 7, 8, 9, 10, *range(14, 45)), 1)
FUSED_VARIANTS = {14}  # few heads: the last split merges (csrc's merge_splits_last)
# few heads: the decode call merges its splits itself (csrc's combine kernel; 27, 28 at 2 splits:
# the cluster), up to this many
CUDA_COMBINE_VARIANTS = dict.fromkeys(range(21, 26), 1 << 30) | dict.fromkeys(range(26, 45), 4)
# Splits the last one merges; more go to the combine kernel. The kernel takes up to 512
# (csrc's kMergeMaxSplits), but one CTA reading many partials is slow (round 9: H16 B1 at 16
# splits 36.0 us fused vs 17.4 with the combine kernel; H16 B64 at 4 splits 65.9 vs 60.5).
FUSE_MAX_SPLITS = 2
_counters: dict = {}


def default_variant() -> int:
    """`ROLLFLEET_CUDA_VARIANT` if set (the bench and tests compare variants), else the default."""
    return int(os.environ.get("ROLLFLEET_CUDA_VARIANT", DEFAULT_VARIANT))


@functools.cache
def _ext():
    """Compiles (or loads the cached build of) the extension, for sm_90a only: wgmma and
    setmaxnreg do not exist in plain sm_90, so no other target is built."""
    from torch.utils.cpp_extension import load

    src = Path(__file__).parent / "csrc"
    saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
    try:
        return load(
            name="rollfleet_sparse_mla_sm90",
            sources=[str(src / "binding.cpp"), str(src / "decode_sm90.cu")],
            extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo", "-Xptxas=-v"],
            verbose=bool(os.environ.get("ROLLFLEET_CUDA_VERBOSE")),
        )
    finally:
        if saved is None:
            del os.environ["TORCH_CUDA_ARCH_LIST"]
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = saved


def split_counters(device: torch.device, n: int) -> torch.Tensor:
    """The fused merge's per-query arrival counters, int32 zeros. Every launch leaves them at zero
    (the last split of a query sets its own back), so one buffer per device is reused, also by
    the CUDA graphs captured after a first call (no fill node in them). Launches of variant 14
    must not overlap on two streams of one device. Inside a capture, a missing buffer is made by
    a captured fill instead, so that every replay starts from zeros."""
    buf = _counters.get(device)
    if buf is None or buf.numel() < n:
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(n, dtype=torch.int32, device=device)
        buf = _counters[device] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return buf


def split_plan(
    bsz: int, num_heads: int, topk: int, num_splits: int, sms: int, variant: int | None = None
) -> tuple[int, int]:
    """(splits, rows per split): about one CTA per SM (two for the few-heads kernel) unless
    `num_splits` says otherwise; every split is whole tiles and none is empty."""
    variant = default_variant() if variant is None else variant
    few = variant in FEW_VARIANTS and num_heads <= FEW_HEADS
    heads_per_cta, per_sm = (FEW_HEADS, FEW_VARIANTS[variant]) if few else (HEADS_PER_CTA, 1)
    tiles = triton.cdiv(topk, TILE)
    ctas = bsz * triton.cdiv(num_heads, heads_per_cta)
    nsplit = min(tiles, num_splits or max(1, round(per_sm * sms / ctas)))
    split_len = triton.cdiv(tiles, nsplit) * TILE
    return triton.cdiv(topk, split_len), split_len


def sparse_mla_decode_cuda(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    num_splits: int = 0,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    variant: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, 576] bf16, cache [blocks, block_size, 352] NVFP4 rows, indices [B, topk] int32
    flat slots (-1 = padding) -> (out [B, H, 512] bf16, lse [B, H] fp32, natural log).
    `variant`: one of VARIANTS (default: `default_variant()`)."""
    assert cache.shape[-1] == ROW_BYTES[KVFormat.NVFP4] and q.shape[-1] == KV_DIM
    variant = default_variant() if variant is None else variant
    assert variant in VARIANTS, variant
    bsz, num_heads, _ = q.shape
    topk = indices.shape[1]
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    nsplit, split_len = split_plan(bsz, num_heads, topk, num_splits, sms, variant)
    if out is None:
        out = torch.empty(bsz, num_heads, LATENT_DIM, dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty(bsz, num_heads, dtype=torch.float32, device=q.device)
    shape = (0,) if nsplit == 1 else (bsz, nsplit, num_heads)
    opart = torch.empty(*shape, LATENT_DIM, dtype=torch.float32, device=q.device)
    lpart = torch.empty(shape, dtype=torch.float32, device=q.device)
    qk_scale = sm_scale * math.log2(math.e)
    fused = variant in FUSED_VARIANTS and num_heads <= FEW_HEADS and 1 < nsplit <= FUSE_MAX_SPLITS
    counters = split_counters(q.device, bsz) if fused else opart.new_empty(0, dtype=torch.int32)
    _ext().decode(
        q, cache, indices, opart, lpart, out, lse, qk_scale, split_len, nsplit, variant, counters
    )
    cuda_combine = num_heads <= FEW_HEADS and nsplit <= CUDA_COMBINE_VARIANTS.get(variant, 0)
    if nsplit > 1 and not fused and not cuda_combine:
        _combine_kernel[(bsz, num_heads)](
            opart, lpart, out, lse, 1.0, num_heads, nsplit, out.stride(0), out.stride(1),
            BLOCK_S=triton.next_power_of_2(nsplit), num_warps=8)  # fmt: skip
    return out, lse

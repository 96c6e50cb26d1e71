// Sparse MLA decode over NVFP4 rows for Hopper (sm_90a), warp-specialized like FlashMLA's sparse
// decode. One CTA = one query x one top-k split x 64 heads (wgmma's M; fewer heads are padded).
// Warp group 0 (producer) gathers each tile's 64 rows from global memory (16-byte loads; the next
// tile's are issued while this one is decoded, and with kVariant >= 2 the tile after that is
// prefetched into L2), decodes E2M1 x E4M3 scale and the E4M3 rope to fp16 in registers and stores
// them in a 128-byte-swizzled shared tile (2 stages). The consumers, by variant:
//   0 (round 4): warp groups 1, 2 each compute S = Q K^T for 32 of the tile's rows, exchange row
//     maxima through shared memory, run the online softmax, write P to shared memory, then
//     O[:, 256 w : 256 w + 256] += P V with the same tile read MN-major as V.
//   1, 2, 3 (issue 29): warp group 1 computes the whole S = Q K^T (m64n64, no maxima exchange),
//     the softmax, and O[:, :256] += P V with P in registers as wgmma's A operand; it hands P and
//     the rescale factors to warp group 2 through shared memory, which computes O[:, 256:] += P V
//     while group 1 goes on to the next tile's Q K^T (group 2's P V runs under group 1's softmax and
//     Q K^T). 3: group 1 issues the next tile's Q K^T right behind its own P V instead of after it.
//   4, 5 with H <= 16: the few-heads kernel (decode_few_kernel, below): one producer and one
//     consumer group per CTA, two CTAs per SM, S^T = K Q^T with N = 16 heads and O^T += V^T P^T;
//     with more heads 4 runs variant 2's kernel, 5 its own (2 + the producer loading the next
//     tile's rows right after each hand-over; the few-heads kernel does the same under 5).
//   6, 7 with H <= 16: decode_few2_kernel: the rows arrive by bulk copies (TMA) two tiles ahead
//     in a raw ring, two producer warp groups decode them from shared memory into two fp16 stages,
//     one consumer group (6) or two on alternate tiles (7); one CTA per SM. More heads: 5.
//   8, 9 with H <= 16: decode_few3_kernel: no fp16 tile; the consumers decode wgmma's A fragments
//     from the raw (bulk-copied) rows into registers; one consumer group (8) or two (9).
//   10 with H <= 16: 8 with fewer instructions per decoded value (issue 29, round 8): the E4M3
//     converts read either half of a register (v8 shifted the high half down first), S's fragment
//     slots take whatever dim pairs the converts produce (no byte interleave; Q is permuted to
//     match), and P V's two rows per register are interleaved as packed bytes before the decode
//     (v8 interleaved the fp16 results). 1,599 instead of 2,007 SASS instructions per tile.
//   14 with H <= 16: 10 with the combine fused (issue 29, round 9): every split writes its partial,
//     fences it and counts itself in a per-query counter; the last one to count merges the
//     partials and writes out / lse (merge_splits_last), so no combine kernel runs after it.
//     kernels/cuda_decode.py passes the counters at 2 splits only. 15 (round 9's H <= 16 default):
//     the same kernel without counters (partials merged by the combine kernel). With the merge
//     compiled in, ptxas allocates the tile loop without 10's 24-byte spill (8 local loads and
//     stores a tile): 49.8 us at H16 B64 vs 10's 53.0; the merge itself is 1.1 us slower than
//     the combine kernel (round 9).
//   16-25 with H <= 16 (issue 29, round 10; consumer_reg's kPipe): 16 decodes O^T's first k-step
//     before waiting for S^T's wgmmas, 17 also skips the wait at a tile's end (slower: 69 us);
//     18 = 10's decode with two consumer groups (wgmmas serialized, C7512), 19 = 18 waiting after
//     each wgmma batch for the one before (no serialization), 20 = 15 with 19's waits; 21, 22 =
//     15's kernel + combine_splits_kernel launched by the same call (21 with PDL); 23 = 19 + 21's
//     combine, 24 = 23 + 16's early decode, 25 = 24 + an early PDL trigger; 26 (the default for
//     H <= 16) = 24 at more than 8 tiles a split (two groups pay off only there), else 16, and
//     the CUDA combine at 2-4 splits only (its loop over more splits is slower than Triton's).
//   27 with H <= 16 (issue 29, round 11): 26, but at 2 splits the query's two splits run as a
//     cluster of two CTAs; each consumer group writes its O^T / l into the shared memory of the
//     CTA that merges those dims (distributed shared memory), and after one cluster barrier each
//     CTA merges and writes half of the output (merge_cluster_pair): no partials in global memory,
//     no combine kernel. 28: 27 with each CTA's phase clocks written to p.counters (the probe).
// Splits write fp32 partials and log2-sum-exps that kernels/sparse_decode.py's combine merges
// (variant 14: the last split of each query merges them itself; 21-26 and 27, 28 at 3-4 splits:
// combine_splits_kernel).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "decode_sm90.h"

namespace {

constexpr int kHeads = 64;                        // heads per CTA: wgmma's M
constexpr int kTile = 64;                         // cached rows per tile
constexpr int kRowBytes = 352;                    // NVFP4 row: 256 B E2M1, 64 B rope, 32 B scales
constexpr int kDimBlocks = 9;                     // 576 dims in blocks of 64 (one 128-byte row)
constexpr int kBlockBytes = 64 * 128;             // one 64-dim block of 64 rows, fp16
constexpr int kTileBytes = kDimBlocks * kBlockBytes;
constexpr int kOffQ = 0;
constexpr int kOffKV = kOffQ + kTileBytes;        // two stages
constexpr int kOffP = kOffKV + 2 * kTileBytes;    // P [64 heads, 64 rows] fp16
constexpr int kOffRed = kOffP + kBlockBytes;      // float [2][64]: row maxima, then row sums
constexpr int kOffValid = kOffRed + 2 * 64 * 4;   // uint8 [2][64]: row valid, per stage
constexpr int kOffBar = kOffValid + 2 * 64;       // mbarriers: full[2], empty[2], Q in (41, 43, 44)
constexpr int kSmem = kOffBar + 5 * 8 + 1024;     // + slack to align the base to 1024
constexpr int kBarQIn = 4;                        // kOffBar's fifth: group 1 has Q (41, 43, 44)
constexpr int kProducerRegs = 88;
constexpr int kConsumerRegs = 208;  // setmaxnreg moves registers within the launch's
// 168 x 384: 128 x 88 + 256 x 208 = 64512 (asking for more than that pool waits forever)
// Variants >= 1: producer 104, group 1 240, group 2 160 (104 + 240 + 160 = 504 = 3 x 168); the
// producer spilled at 88 (ncu: its spill reloads were ~20% of its stall samples with the prefetch).
constexpr int kProducerRegs1 = 104, kQkRegs = 240, kPvRegs = 160;
static_assert(kPvRegs <= 168 && kProducerRegs1 <= 168 && kQkRegs >= 168, "inc / dec as written");
// Named barriers: 0 = __syncthreads, 1 = the 256 consumer threads (Q, epilogue); variants >= 1:
// 2 = P and its rescale factors written (group 1 arrives, group 2 waits), 3 = P read (the other
// way round).
constexpr int kBarPReady = 2, kBarPFree = 3;
// Few heads (H <= 16, variant 4): one producer and one consumer warp group per CTA, two CTAs per
// SM, one stage each; Q is [16 heads, 576] (9 blocks of 16 rows x 128 B).
constexpr int kFewHeads = 16;
constexpr int kFewQBlock = kFewHeads * 128;
constexpr int kFOffQ = 0;
constexpr int kFOffKV = kFOffQ + kDimBlocks * kFewQBlock;  // 18432, 1024-aligned: one stage
constexpr int kFOffPT = kFOffKV + kTileBytes;              // P^T [16 heads, 64 rows] fp16
constexpr int kFOffRed = kFOffPT + kFewQBlock;  // float [4 warps][16]: maxima; [4][16]: sums; [4]
constexpr int kFOffValid = kFOffRed + 1024;     // uint8 [64]: row valid
constexpr int kFOffBar = kFOffValid + 64;       // mbarriers: full, empty
constexpr int kFSmem = kFOffBar + 2 * 8 + 1024;  // ~94 KB: two CTAs per SM
constexpr int kFProducerRegs = 104, kFConsumerRegs = 152;  // 104 + 152 = 256 = 2 x 128
constexpr int kOStride = 516;  // epilogue: O^T / l staged as fp32 [16][516] (no bank conflicts)
// Few heads, variant 6 (one CTA per SM): the tile's raw NVFP4 rows are gathered by bulk copies
// (cp.async.bulk, the TMA engine: no registers, no L1) into a ring of kRaw raw tiles two tiles
// ahead, two producer warp groups decode them from shared memory into two fp16 stages, one consumer
// group as in variant 5 (variant 7: two consumer groups, one per stage, on alternate tiles).
// Q 18 KB + 2 x 72 KB + 2 x 22 KB + 2 x (P^T + scratch) = 213 KB.
constexpr int kRaw = 2;
constexpr int kRawBytes = kTile * kRowBytes;                // 22528
constexpr int kGOffQ = 0;
constexpr int kGOffKV = kGOffQ + kDimBlocks * kFewQBlock;   // 18432: two stages
constexpr int kGOffRaw = kGOffKV + 2 * kTileBytes;          // 165888: kRaw raw tiles
constexpr int kGOffPT = kGOffRaw + kRaw * kRawBytes;        // 210944: P^T [2] (one per group)
constexpr int kGOffRed = kGOffPT + 2 * kFewQBlock;          // scratch [2] (one per group)
constexpr int kGOffValid = kGOffRed + 2 * 1024;             // uint8 [2][64]: row valid, per stage
constexpr int kGOffRawValid = kGOffValid + 2 * 64;          // uint8 [kRaw][64]: per raw tile
constexpr int kGOffBar = kGOffRawValid + kRaw * 64;         // full[2], empty[2], raw full[kRaw]
constexpr int kGSmem = kGOffBar + (4 + kRaw) * 8 + 1024;
static_assert(kGOffKV % 1024 == 0 && kGOffPT % 1024 == 0 && kGOffRaw % 16 == 0 &&
              kGOffBar % 8 == 0 && kGSmem <= 227 * 1024, "few-heads v6 layout");
static_assert(kFOffQ == kGOffQ, "load_q_few writes Q at offset 0 in both layouts");
constexpr float kInf = __builtin_huge_valf();

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 128-byte swizzle: the 16-byte chunk `c` of row `r` of a 64-dim block (rows of 128 bytes,
// 1024-byte aligned atoms of 8 rows), as wgmma's SWIZZLE_128B layouts expect it.
__device__ __forceinline__ uint32_t swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// wgmma shared-memory descriptor: 128-byte swizzle, leading / stride byte offsets.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred ok;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 ok, [%0], %1;\n"
      "@!ok bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// Generic-proxy shared stores become visible to wgmma (the async proxy) after this + a barrier.
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void consumer_sync() {  // the 256 consumer threads only
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
}
__device__ __forceinline__ void group_sync() {  // the consumer warp group of the few-heads kernel
  asm volatile("bar.sync 1, 128;\n" ::: "memory");
}
__device__ __forceinline__ void named_sync(int id) {  // waits; 256 threads (both consumer groups)
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void named_arrive(int id) {  // counts, does not wait
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}
// Named barriers of variants 6, 7: 1 = consumer group 0 (as group_sync), 2 = consumer group 1,
// 3 = the 256 producer threads, 4 = both consumer groups.
__device__ __forceinline__ void producer_sync() {
  asm volatile("bar.sync 3, 256;\n" ::: "memory");
}
__device__ __forceinline__ void bar_sync_n(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// Counts one arrival and `bytes` more expected from async copies (the bulk copies' complete_tx).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory by the
// TMA engine; their arrival counts down the mbarrier's expected bytes.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
// Clusters (variants 27, 28): this CTA's rank, the address of the same shared variable in CTA
// `rank` of the cluster, and stores to it (distributed shared memory).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t mapa_shared(uint32_t addr, uint32_t rank) {
  uint32_t d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(addr), "r"(rank));
  return d;
}
__device__ __forceinline__ void st_dsmem4(uint32_t addr, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x),
               "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
__device__ __forceinline__ void st_dsmem1(uint32_t addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
// Variant 28 (kernels/probe_pieces.py): phase `i` of this CTA's timeline into p.counters, read as
// int64 [B * nsplit][16]; nothing without a buffer (the ordinary calls and the tests).
template <bool kStamp>
__device__ __forceinline__ void stamp(const DecodeParams& p, int i, long long v) {
  if constexpr (kStamp) {
    if (p.counters != nullptr)
      reinterpret_cast<long long*>(p.counters)[(blockIdx.z * p.nsplit + blockIdx.y) * 16 + i] = v;
  }
}
__device__ __forceinline__ long long global_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// No register fences around the waits: ptxas tracks wgmma's accumulators itself (it adds a wait
// before any early read, C7517), while empty asm on them made it serialize every wgmma (C7514).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// S[64, 32] (+)= Q[64, 16] K[32, 16]^T: both K-major.
__device__ __forceinline__ void wgmma_qk(float (&d)[16], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      :
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
      "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
      "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(acc));
}

// O[64, 256] += P[64, 16] V[16, 256]: A (P) K-major, B (V) MN-major (the tile's own layout).
__device__ __forceinline__ void wgmma_pv(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      :
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
      "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
      "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
      "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
      "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
      "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
      "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
      "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]),
      "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
      "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
      "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),
      "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]),
      "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),
      "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
      "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
      "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(1));
}

#define WG_D8(i)                                                                          \
  "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]),     \
      "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define WG_D32(i) WG_D8(i), WG_D8((i) + 8), WG_D8((i) + 16), WG_D8((i) + 24)
// S[64, 64] (+)= Q[64, 16] K[64, 16]^T: both K-major (variants >= 1: one group, all 64 rows).
__device__ __forceinline__ void wgmma_qk64(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : WG_D32(0)
      : "l"(da), "l"(db), "r"(acc));
}

// O[64, 256] += P[64, 16] V[16, 256] with P in registers (wgmma's A fragment: a0 = row g, columns
// 2t, 2t + 1; a1 = row g + 8, same columns; a2, a3 = the same rows, columns + 8, where g = lane / 4,
// t = lane % 4 within each warp's 16 rows), V from shared memory MN-major.
__device__ __forceinline__ void wgmma_pv_rs(float (&d)[128], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : WG_D32(0), WG_D32(32), WG_D32(64), WG_D32(96)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}

// D[64, 16] (+)= A[64, 16] B[16, 16]^T from shared memory; B K-major; A K-major (kTransA = 0) or
// MN-major (1). The few-heads kernel: S^T = K Q^T (A = the tile's rows) and O^T += V^T P^T (A = the
// tile read MN-major, as V is read in P V above).
template <int kTransA>
__device__ __forceinline__ void wgmma_n16(float (&d)[8], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
      : WG_D8(0)
      : "l"(da), "l"(db), "r"(acc), "n"(kTransA));
}

__device__ __forceinline__ uint4 ld_nc(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// 16 bytes from global memory if `pred`, else zeros: one asm, so that no select follows the load.
__device__ __forceinline__ uint4 ld_nc_or_zero(const uint4* p, bool pred) {
  uint4 v;
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n"
      "mov.b32 %0, 0;\nmov.b32 %1, 0;\nmov.b32 %2, 0;\nmov.b32 %3, 0;\n"
      "@q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=&r"(v.x), "=&r"(v.y), "=&r"(v.z), "=&r"(v.w)
      : "l"(p), "r"(static_cast<int>(pred)));
  return v;
}
__device__ __forceinline__ void st_smem(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ uint4 ld_smem(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 ld_smem2(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_smem_u16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(v));
}
__device__ __forceinline__ void st_smem(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v));
}
// Two E4M3 bytes (low byte -> low half) to two fp16.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t b16) {
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(d) : "h"(static_cast<uint16_t>(b16)));
  return d;
}
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Variant 10: two E4M3 bytes of a register's low / high half -> two fp16 (F2FP reads the high half
// directly; `x >> 16` first cost a shift per call in v8's SASS).
__device__ __forceinline__ uint32_t cvt_e4m3_lo(uint32_t x) {
  uint32_t d;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, l;\n}\n" : "=r"(d) : "r"(x));
  return d;
}
__device__ __forceinline__ uint32_t cvt_e4m3_hi(uint32_t x) {
  uint32_t d;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, h;\n}\n" : "=r"(d) : "r"(x));
  return d;
}
// 4 packed bytes (dims 2i / 2i+1 in the low / high nibble of byte i) -> the E4M3 bytes of their
// values times 2**-6 (decode8's mapping), left in place: `lo` byte i = dim 2i, `hi` byte i = dim 2i+1.
// No byte interleave: variant 10 gives the fragment slots whatever pairs the converts produce.
__device__ __forceinline__ void e2m1_e4m3(uint32_t x, uint32_t& lo, uint32_t& hi) {
  lo = ((x << 2) & 0x1C1C1C1Cu) | ((x << 4) & 0x80808080u);
  hi = ((x >> 2) & 0x1C1C1C1Cu) | (x & 0x80808080u);
}

// 4 packed bytes (8 E2M1 values, dims 2i / 2i+1 in the low / high nibble of byte i) -> 8 fp16
// in dim order, times `scale2` (the block scale times 2**6, in both halves). A nibble
// `s e1 e0 m` becomes the E4M3 byte `s 0 0 e1 e0 m 0 0`, which is its value times 2**-6 exactly.
__device__ __forceinline__ uint4 decode8(uint32_t x, uint32_t scale2) {
  const uint32_t lo = ((x << 2) & 0x1C1C1C1Cu) | ((x << 4) & 0x80808080u);
  const uint32_t hi = ((x >> 2) & 0x1C1C1C1Cu) | (x & 0x80808080u);
  const uint32_t p0 = __byte_perm(lo, hi, 0x5140);  // lo0 hi0 lo1 hi1: dims 0..3
  const uint32_t p1 = __byte_perm(lo, hi, 0x7362);  // dims 4..7
  return make_uint4(hmul2(e4m3x2_to_f16x2(p0), scale2), hmul2(e4m3x2_to_f16x2(p0 >> 16), scale2),
                    hmul2(e4m3x2_to_f16x2(p1), scale2), hmul2(e4m3x2_to_f16x2(p1 >> 16), scale2));
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Producer thread (r, h) holds 16-byte chunks 2i + h (i < 11) of row r: latent chunks (32 values
// each) for i < 8, rope chunks (16 E4M3) for i = 8, 9, and half h of the 32 scale bytes at i = 10.
// Pairs of lanes read whole 32-byte sectors. Writes the row's 576 fp16 into the swizzled tile and
// calls refill(i) as soon as buf[i] is used, so the next tile's loads overlap this decode.
template <class Refill>
__device__ __forceinline__ void decode_row(uint4 (&buf)[11], uint32_t tile, int r, int h,
                                           Refill refill) {
  uint4 other;
  other.x = __shfl_xor_sync(0xffffffffu, buf[10].x, 1);
  other.y = __shfl_xor_sync(0xffffffffu, buf[10].y, 1);
  other.z = __shfl_xor_sync(0xffffffffu, buf[10].z, 1);
  other.w = __shfl_xor_sync(0xffffffffu, buf[10].w, 1);
  const uint4 sc_lo = h ? other : buf[10];  // scale bytes 0..15
  const uint4 sc_hi = h ? buf[10] : other;  // 16..31
  refill(10);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    // latent chunk c = 2i + h: dims 32c..32c+31, scale bytes 2c (first 16) and 2c + 1
    const uint32_t sw = word(i < 4 ? sc_lo : sc_hi, i & 3);
    const uint32_t s2 = hmul2(e4m3x2_to_f16x2(h ? sw >> 16 : sw), 0x54005400u);  // x 2**6
    const uint32_t sa = __byte_perm(s2, 0, 0x1010), sb = __byte_perm(s2, 0, 0x3232);
    const uint32_t block = tile + i * kBlockBytes;  // dims 64i..64i+63
#pragma unroll
    for (int q = 0; q < 4; ++q)
      st_smem(block + swz(r, 4 * h + q), decode8(word(buf[i], q), q < 2 ? sa : sb));
    refill(i);
  }
#pragma unroll
  for (int i = 8; i < 10; ++i) {  // rope chunk pc = 2 (i - 8) + h: dims 512 + 16 pc ..
    const int pc = 2 * (i - 8) + h;
    const uint32_t block = tile + 8 * kBlockBytes;
    const uint4 v = buf[i];
    st_smem(block + swz(r, 2 * pc), make_uint4(e4m3x2_to_f16x2(v.x), e4m3x2_to_f16x2(v.x >> 16),
                                              e4m3x2_to_f16x2(v.y), e4m3x2_to_f16x2(v.y >> 16)));
    st_smem(block + swz(r, 2 * pc + 1),
            make_uint4(e4m3x2_to_f16x2(v.z), e4m3x2_to_f16x2(v.z >> 16), e4m3x2_to_f16x2(v.w),
                       e4m3x2_to_f16x2(v.w >> 16)));
    refill(i);
  }
}

// Per tile the producer waits for one memory latency at most: the slot of tile k + 1 is loaded
// while tile k - 1 is decoded, and tile k + 1's row chunks while tile k is. kPrefetch: the rows of
// tile k + 2 are also prefetched into L2 before waiting for a free stage (slots 3 tiles ahead), so
// that the loads of tile k + 1 issued during this decode find them there.
// kStages stages of kTileBytes at kKV, valid flags [kStages][64] at kValid, mbarriers full[kStages]
// then empty[kStages] at kBar.
// kLate (variant 5): the next tile's 11 chunks are loaded after this tile's arrive, all at once and
// predicated (zero when padding) instead of one by one inside the decode: the ncu of variant 4
// showed ptxas sinking the in-decode loads to the end of the decode, where the release fence
// before the arrive (MEMBAR) and the copies into the loop's registers waited for them, so that a
// whole memory latency was on the producer's path every tile.
template <bool kPrefetch, int kStages = 2, int kKV = kOffKV, int kValid = kOffValid,
          int kBar = kOffBar, bool kLate = false>
__device__ void producer(const DecodeParams& p, uint8_t* smem, int b, int t0, int t1, int ntiles) {
  const int tid = threadIdx.x, r = tid >> 1, h = tid & 1;
  const uint32_t base = smem_u32(smem);
  const int32_t* idx = p.idx + b * p.stride_ib;
  auto slot_of = [&](int k) {
    const int t = t0 + k * kTile + r;
    return k < ntiles && t < t1 ? __ldg(idx + t) : -1;
  };
  auto row_of = [&](int slot) {
    return reinterpret_cast<const uint4*>(p.cache + static_cast<int64_t>(slot) * kRowBytes) + h;
  };
  uint4 buf[11];
  int slot = slot_of(0);
  bool valid = slot >= 0;
  const uint4* src = row_of(slot);
#pragma unroll
  for (int i = 0; i < 11; ++i)
    buf[i] = kLate ? ld_nc_or_zero(src + 2 * i, valid)
                   : valid ? ld_nc(src + 2 * i) : make_uint4(0, 0, 0, 0);
  slot = slot_of(1);
  int slot2 = kPrefetch ? slot_of(2) : -1;
  for (int k = 0; k < ntiles; ++k) {
    const int st = k % kStages, phase = (k / kStages) & 1;
    const bool next_valid = slot >= 0;
    const uint4* next = row_of(slot);
    if (kPrefetch) {
      if (slot2 >= 0) {  // every 128-byte line of the 352-byte row holds one of these 4 bytes
        const uint8_t* row = p.cache + static_cast<int64_t>(slot2) * kRowBytes;
        prefetch_l2(row + (h ? 256 : 0));
        prefetch_l2(row + (h ? kRowBytes - 1 : 128));
      }
      slot = slot2;
      slot2 = slot_of(k + 3);
    } else {
      slot = slot_of(k + 2);
    }
    mbar_wait(base + kBar + (kStages + st) * 8, phase ^ 1);  // stage free
    // padding reads nothing and decodes to zeros (P is 0 there, but 0 x NaN would not be)
    decode_row(buf, base + kKV + st * kTileBytes, r, h, [&](int i) {
      if (!kLate) buf[i] = next_valid ? ld_nc(next + 2 * i) : make_uint4(0, 0, 0, 0);
    });
    if (h == 0) smem[kValid + st * 64 + r] = valid;
    fence_async_smem();
    mbar_arrive(base + kBar + st * 8);
    if (kLate) {
      // The arrive's release (a MEMBAR) lets later loads move above it, where it would wait for
      // them (ptxas hoisted them there): an acquire fence keeps them below.
      asm volatile("fence.acq_rel.cta;\n" ::: "memory");
#pragma unroll
      for (int i = 0; i < 11; ++i) buf[i] = ld_nc_or_zero(next + 2 * i, next_valid);
    }
    valid = next_valid;
  }
}

// ---- Variants 29-31 (issue 51): the 64-head kernel with a leaner decode, and group 2 decoding ----
// One 16-byte latent chunk (32 E2M1 values, dims 32 c .. 32 c + 31 of a row) -> fp16 into the
// swizzled tile row r, 16-byte chunks 4 h .. 4 h + 3 of the 64-dim block at `block`. No byte
// interleave (decode8's two PRMT) and no shift before the high half's convert: each group of 8
// dims is stored in the order the converts produce, [0 2 4 6 1 3 5 7]; Q is stored in that order
// too (load_q<true>, so S is unchanged) and the output dims are put back when stored
// (store_out<true>). 13 instructions per 8 values instead of decode8's 17.
__device__ __forceinline__ void decode_chunk_lean(const uint4& v, uint32_t sa, uint32_t sb,
                                                  uint32_t block, int r, int h) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t lo, hi;
    e2m1_e4m3(word(v, q), lo, hi);
    const uint32_t s = q < 2 ? sa : sb;
    st_smem(block + swz(r, 4 * h + q),
            make_uint4(hmul2(cvt_e4m3_lo(lo), s), hmul2(cvt_e4m3_hi(lo), s),
                       hmul2(cvt_e4m3_lo(hi), s), hmul2(cvt_e4m3_hi(hi), s)));
  }
}
// The two block scales of latent chunk c = 2 i + h (scale bytes 2 c, 2 c + 1 = bytes 2 h, 2 h + 1
// of word i & 3 of the 16 scale bytes that hold them) -> times 2**6, each in both halves.
__device__ __forceinline__ void chunk_scales(const uint4& sc, int i, int h, uint32_t& sa,
                                             uint32_t& sb) {
  const uint32_t s2 = hmul2(e4m3x2_to_f16x2(word(sc, i & 3) >> (16 * h)), 0x54005400u);
  sa = __byte_perm(s2, 0, 0x1010);
  sb = __byte_perm(s2, 0, 0x3232);
}
// A row's 64 rope values (E4M3), chunk pc (16 values, dims 512 + 16 pc ..) -> fp16.
__device__ __forceinline__ void decode_rope(const uint4& v, uint32_t block, int r, int pc) {
  st_smem(block + swz(r, 2 * pc), make_uint4(cvt_e4m3_lo(v.x), cvt_e4m3_hi(v.x),
                                             cvt_e4m3_lo(v.y), cvt_e4m3_hi(v.y)));
  st_smem(block + swz(r, 2 * pc + 1), make_uint4(cvt_e4m3_lo(v.z), cvt_e4m3_hi(v.z),
                                                 cvt_e4m3_lo(v.w), cvt_e4m3_hi(v.w)));
}

// Stamps of variant 31 (kernels/probe_pieces.py, H > 16): clock64 sums per CTA into p.counters
// (int64 [B * nsplit][16]), written by one thread of each role at its end.
enum Stamp64 {
  kS64StartNs = 0, kS64StartClk = 1, kS64ProdWaitEmpty = 2, kS64ProdDecode = 3,
  kS64G1WaitFull = 4, kS64G1WaitQk = 5, kS64G2WaitP = 6, kS64G1LoopDone = 7, kS64EndNs = 8,
  kS64EndClk = 9, kS64G1QReady = 10, kS64G1Softmax = 11, kS64G1WaitPv = 12, kS64G1WaitPFree = 13,
  kS64G2Decode = 14, kS64G2WaitEmpty = 15,
};

// Variants 39, 44: stamps (kernels/probe_pieces.py ENDS64): when each end of the kernel is reached.
enum StampEnds {
  kSEG1Staged = 2, kSEBothStaged = 3, kSETile0Decoded = 4, kSEG1LoopDone = 7, kSEQReady = 10,
  kSETile0In = 11, kSEProducerDone = 12,
};

// Variants 29-31, warp group 0: variant 5's producer (rows a tile ahead in registers, loaded right
// after each hand-over; the tile after next prefetched into L2) with decode_chunk_lean. kG2
// (variant 30): this group decodes the latent dims 0..255 and the rope only; warp group 2
// (consumer_pv<.., true>) decodes dims 256..511 of the same tile (each thread the same row and
// half as here), so that the producer's work per tile drops by ~45%. Then each thread loads both
// of its row's first 16 scale bytes (no shuffle) and holds 7 chunks instead of 11.
// kQFirst (variants 41, 43, 44; issue 51 round 2): at the start only Q (72 KB a CTA) and tile 0's
// rows are asked of memory; tile 1's rows and the L2 prefetch of tile 2 wait until group 1 has Q
// (mbarrier kBarQIn), so that the start's traffic, which an L2 full of dirty lines makes slow,
// is what the first Q K^T needs. kIdxEarly (42-44): the whole split's indices are prefetched into
// L2 at the start, and each tile's index load is issued right behind the row loads (ptxas sank
// it into the decode, where the release fence before the hand-over then waited for it: a DRAM
// latency a tile). kStampEnds: when tile 0 was handed over and when the loop ended (StampEnds).
template <bool kG2, bool kStamp, bool kQFirst = false, bool kIdxEarly = false,
          bool kStampEnds = false>
__device__ void producer_lean(const DecodeParams& p, uint8_t* smem, int b, int t0, int t1,
                              int ntiles) {
  constexpr int kN = kG2 ? 7 : 11;  // latent chunks i < 4 (kG2) or 8, rope i = 8, 9, scales
  const int tid = threadIdx.x, r = tid >> 1, h = tid & 1;
  const uint32_t base = smem_u32(smem);
  const int32_t* idx = p.idx + b * p.stride_ib;
  auto slot_of = [&](int k) {
    const int t = t0 + k * kTile + r;
    if (!kIdxEarly) return k < ntiles && t < t1 ? __ldg(idx + t) : -1;
    int v = -1;  // an asm load stays where it is written (after the row loads)
    if (k < ntiles && t < t1) asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(v) : "l"(idx + t));
    return v;
  };
  auto row_of = [&](int slot) {
    return reinterpret_cast<const uint4*>(p.cache + static_cast<int64_t>(slot) * kRowBytes);
  };
  if (kIdxEarly) {  // the split's indices into L2: one 128-byte line a thread
    const int t = t0 + 32 * tid;
    if (t < t1) prefetch_l2(idx + t);
  }
  // 16-byte chunk (of the row's 22) held in buf[n]
  auto chunk = [&](int n) {
    if (!kG2) return 2 * n + h;
    return n < 4 ? 2 * n + h : n < 6 ? 2 * (n + 4) + h : 20;
  };
  long long wait_empty = 0, decode = 0;
  uint4 buf[kN];
  int slot = slot_of(0);
  bool valid = slot >= 0;
  const uint4* src = row_of(slot);
#pragma unroll
  for (int n = 0; n < kN; ++n) buf[n] = ld_nc_or_zero(src + chunk(n), valid);
  slot = slot_of(1);
  int slot2 = slot_of(2);
  for (int k = 0; k < ntiles; ++k) {
    const int st = k & 1, phase = (k >> 1) & 1;
    const bool next_valid = slot >= 0;
    const uint4* next = row_of(slot);
    auto prefetch_rows = [&](int s2) {  // every 128-byte line of the 352-byte row holds one of
      if (s2 < 0) return;               // these 4 bytes
      const uint8_t* row = p.cache + static_cast<int64_t>(s2) * kRowBytes;
      prefetch_l2(row + (h ? 256 : 0));
      prefetch_l2(row + (h ? kRowBytes - 1 : 128));
    };
    if (!kQFirst || k > 0) prefetch_rows(slot2);
    slot = slot2;
    if (!kIdxEarly) slot2 = slot_of(k + 3);
    long long c0 = 0, c1 = 0;
    if (kStamp) c0 = clock64();
    mbar_wait(base + kOffBar + (2 + st) * 8, phase ^ 1);  // stage free
    if (kStamp) c1 = clock64();
    const uint32_t tile = base + kOffKV + st * kTileBytes;
    uint4 sc_lo, sc_hi;
    if (kG2) {
      sc_lo = buf[6];
      sc_hi = buf[6];  // unused
    } else {
      uint4 other;
      other.x = __shfl_xor_sync(0xffffffffu, buf[10].x, 1);
      other.y = __shfl_xor_sync(0xffffffffu, buf[10].y, 1);
      other.z = __shfl_xor_sync(0xffffffffu, buf[10].z, 1);
      other.w = __shfl_xor_sync(0xffffffffu, buf[10].w, 1);
      sc_lo = h ? other : buf[10];  // scale bytes 0..15
      sc_hi = h ? buf[10] : other;  // 16..31
    }
#pragma unroll
    for (int i = 0; i < (kG2 ? 4 : 8); ++i) {  // latent chunk c = 2 i + h: dims 32 c ..
      uint32_t sa, sb;
      chunk_scales(i < 4 ? sc_lo : sc_hi, i, h, sa, sb);
      decode_chunk_lean(buf[i], sa, sb, tile + i * kBlockBytes, r, h);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) decode_rope(buf[(kG2 ? 4 : 8) + i], tile + 8 * kBlockBytes, r, 2 * i + h);
    if (h == 0) smem[kOffValid + st * 64 + r] = valid;
    fence_async_smem();
    mbar_arrive(base + kOffBar + st * 8);
    if (kStamp) {
      wait_empty += c1 - c0;
      decode += clock64() - c1;
    }
    if (kStampEnds && tid == 0 && k == 0) stamp<kStampEnds>(p, kSETile0Decoded, clock64());
    if (kQFirst && k == 0) {  // the rest of the traffic once group 1 has Q
      mbar_wait(base + kOffBar + kBarQIn * 8, 0);
      prefetch_rows(slot);  // tile 2
    }
    // The arrive's release (a MEMBAR) lets later loads move above it, where it would wait for
    // them: an acquire fence keeps them below (variant 5).
    asm volatile("fence.acq_rel.cta;\n" ::: "memory");
#pragma unroll
    for (int n = 0; n < kN; ++n) buf[n] = ld_nc_or_zero(next + chunk(n), next_valid);
    valid = next_valid;
    if (kIdxEarly) slot2 = slot_of(k + 3);
  }
  if (kStampEnds && tid == 0) stamp<kStampEnds>(p, kSEProducerDone, clock64());
  if (kStamp && tid == 0) {
    stamp<kStamp>(p, kS64ProdWaitEmpty, wait_empty);
    stamp<kStamp>(p, kS64ProdDecode, decode);
  }
}

__device__ __forceinline__ void issue_qk(float (&s)[16], uint32_t q, uint32_t k) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 36; ++kk) {  // 576 dims, 16 a step: 4 steps per 128-byte row
    const uint32_t off = (kk >> 2) * kBlockBytes + (kk & 3) * 32;
    wgmma_qk(s, desc(q + off, 16, 1024), desc(k + off, 16, 1024), kk > 0);
  }
  wgmma_commit();
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Q [64, 576] bf16 -> fp16 in shared memory, times a power of two that brings max|q| under 2**14
// (exact for bf16 values within 2**24 of the largest); returns the score scale that undoes it.
// The raw bf16 goes to its place in shared memory first and is converted there once the maximum
// is known, so that no thread holds its 18 chunks in registers across the reduction.
// kPerm (variants 29-31, issue 51): each latent group of 8 dims is stored in the order the lean
// producer decode leaves the tile's dims in, [0 2 4 6 1 3 5 7] (decode_chunk_lean); rope as is.
template <bool kPerm = false>
__device__ float load_q(const DecodeParams& p, uint8_t* smem, int b, int h0, int ct) {
  float* red = reinterpret_cast<float*>(smem + kOffRed);
  const uint16_t* qb = p.q + b * p.stride_qb;
  const uint32_t q_addr = smem_u32(smem + kOffQ);
  float qmax = 0.f;
#pragma unroll
  for (int i = 0; i < 18; ++i) {  // 64 rows x 72 chunks of 8 values, 256 threads
    const int id = ct + 256 * i, row = id / 72, cc = id % 72;
    const uint4 v = h0 + row < p.heads
                        ? __ldg(reinterpret_cast<const uint4*>(qb + (h0 + row) * p.stride_qh) + cc)
                        : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t x = word(v, j);
      qmax = fmaxf(qmax, fmaxf(fabsf(__uint_as_float(x << 16)),
                               fabsf(__uint_as_float(x & 0xFFFF0000u))));
    }
    st_smem(q_addr + (cc >> 3) * kBlockBytes + swz(row, cc & 7), v);
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, d));
  if ((ct & 31) == 0) red[ct >> 5] = qmax;
  consumer_sync();
#pragma unroll
  for (int i = 0; i < 8; ++i) qmax = fmaxf(qmax, red[i]);
  int e;
  frexpf(qmax, &e);  // qmax < 2**e
  const float up = ldexpf(1.f, 14 - e);
#pragma unroll
  for (int i = 0; i < 18; ++i) {  // this thread's own chunks, converted in place
    const int id = ct + 256 * i, row = id / 72, cc = id % 72;
    const uint32_t addr = q_addr + (cc >> 3) * kBlockBytes + swz(row, cc & 7);
    const uint4 qv = ld_smem(addr);
    uint32_t v[4];
    if (kPerm && cc < 64) {  // word j: dims (2j, 2j+1) -> words (0, 2), (4, 6), (1, 3), (5, 7)
      auto lo = [&](int j) { return __uint_as_float(word(qv, j) << 16) * up; };
      auto hi = [&](int j) { return __uint_as_float(word(qv, j) & 0xFFFF0000u) * up; };
      v[0] = pack_half2(lo(0), lo(1));
      v[1] = pack_half2(lo(2), lo(3));
      v[2] = pack_half2(hi(0), hi(1));
      v[3] = pack_half2(hi(2), hi(3));
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t x = word(qv, j);
        v[j] = pack_half2(__uint_as_float(x << 16) * up, __uint_as_float(x & 0xFFFF0000u) * up);
      }
    }
    st_smem(addr, make_uint4(v[0], v[1], v[2], v[3]));
  }
  fence_async_smem();
  consumer_sync();  // Q complete; red free again
  return p.qk_scale / up;
}

// Both consumer layouts end here: this thread's O fragment (heads h0 + r0, h0 + r1; dims
// 256 w + 8 j + 2 c4 + e) divided by the row sums lt goes to out (one split) or to the split's
// fp32 partial; the threads of dims 0..255 (w = 0) write the log-sum-exps.
// kPerm (load_q<true>'s order): the thread's columns 8 j + 2 c4 + e hold dims 8 j + {0 2, 4 6,
// 1 3, 5 7}[c4]; lanes c4 and c4 ^ 2 swap one value each so that c4 holds the adjacent pair
// 8 j + {0, 4, 2, 6}[c4] + e (every lane shuffles, before any lane skips a head).
template <bool kPerm = false>
__device__ __forceinline__ void store_out(const DecodeParams& p, const float (&o)[128],
                                          const float (&lt)[2], const float (&mt)[2], int b,
                                          int split, int h0, int r0, int r1, int w, int c4) {
  const int64_t part = static_cast<int64_t>(b * p.nsplit + split) * p.heads;
  if constexpr (!kPerm) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int head = h0 + (half ? r1 : r0);
      if (head >= p.heads) continue;
      const float inv = lt[half] > 0.f ? 1.f / lt[half] : 0.f;
      const float lse2 = lt[half] > 0.f ? mt[half] + log2f(lt[half]) : -kInf;
      if (p.nsplit == 1) {  // final output
        uint16_t* dst = p.out + b * p.stride_ob + head * p.stride_oh + 256 * w + 2 * c4;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const __nv_bfloat162 v =
              __floats2bfloat162_rn(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
          *reinterpret_cast<__nv_bfloat162*>(dst + 8 * j) = v;
        }
        if (w == 0 && c4 == 0) p.lse[b * p.heads + head] = lse2 * 0.6931471805599453f;
      } else {  // this split's normalized partial and its log2-sum-exp
        float* dst = p.opart + (part + head) * 512 + 256 * w + 2 * c4;
#pragma unroll
        for (int j = 0; j < 32; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j) =
              make_float2(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
        if (w == 0 && c4 == 0) p.lpart[part + head] = lse2;
      }
    }
    return;
  }
  const bool low = c4 < 2;
  const int col = low ? 4 * c4 : 4 * (c4 - 2) + 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int head = h0 + (half ? r1 : r0);
    const bool ok = head < p.heads;  // every lane shuffles; only these store
    const float inv = lt[half] > 0.f ? 1.f / lt[half] : 0.f;
    const float lse2 = lt[half] > 0.f ? mt[half] + log2f(lt[half]) : -kInf;
    uint16_t* dst16 = p.out + b * p.stride_ob + static_cast<int64_t>(head) * p.stride_oh +
                      256 * w + col;
    float* dst32 = p.opart + (part + head) * 512 + 256 * w + col;
#pragma unroll
    for (int j = 0; j < 32; ++j) {  // one pair at a time: no [32] array live next to o
      const float a = o[4 * j + 2 * half] * inv, c = o[4 * j + 2 * half + 1] * inv;
      const float got = __shfl_xor_sync(0xffffffffu, low ? c : a, 2);
      const float x = low ? a : got, y = low ? got : c;
      if (ok) {
        if (p.nsplit == 1)
          *reinterpret_cast<__nv_bfloat162*>(dst16 + 8 * j) = __floats2bfloat162_rn(x, y);
        else
          *reinterpret_cast<float2*>(dst32 + 8 * j) = make_float2(x, y);
      }
    }
    if (ok && w == 0 && c4 == 0) {
      if (p.nsplit == 1)
        p.lse[b * p.heads + head] = lse2 * 0.6931471805599453f;
      else
        p.lpart[part + head] = lse2;
    }
  }
}

// ---- Compact ends (variants 38-44; issue 51, round 2) ----
// The 64-head kernel's fixed cost (~22 us of a 105 us call at H64 B128; round 1's clocks put Q in
// shared memory at 15 us and group 1's epilogue at 7 us) sat in the two pieces of straight-line
// code that run once: load_q's 18 unrolled chunks (~27 KB of SASS per group) and store_out's 64
// branchy 4-byte stores (~17 KB). These versions are short loops: Q is copied by cp.async straight
// into its swizzled place (no registers held across the maximum), and the output goes through
// shared memory as bf16 and out in 16-byte coalesced stores. Measured (NOTES, round 2): the
// epilogue 3.0 us instead of ~7, but Q still in at 16.3 us: the code was not what held Q.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

// load_q's result (fp16 Q x 2**k in the swizzled layout, kPerm's dim order; returns the score
// scale) from three rolled passes over each thread's 18 chunks: copy, maximum, convert in place.
template <bool kPerm>
__device__ float load_q_async(const DecodeParams& p, uint8_t* smem, int b, int h0, int ct) {
  float* red = reinterpret_cast<float*>(smem + kOffRed);
  const uint16_t* qb = p.q + b * p.stride_qb;
  const uint32_t q_addr = smem_u32(smem + kOffQ);
  auto addr_of = [&](int i) {  // chunk i of this thread: 64 rows x 72 chunks, 256 threads
    const int id = ct + 256 * i, row = id / 72, cc = id % 72;
    return q_addr + (cc >> 3) * kBlockBytes + swz(row, cc & 7);
  };
#pragma unroll 1
  for (int i = 0; i < 18; ++i) {
    const int id = ct + 256 * i, row = id / 72, cc = id % 72;
    const bool ok = h0 + row < p.heads;  // padding heads: zeros (no bytes read)
    cp_async16(addr_of(i), qb + (ok ? h0 + row : h0) * p.stride_qh + 8 * cc, ok);
  }
  cp_async_wait_all();
  float qmax = 0.f;
#pragma unroll 1
  for (int i = 0; i < 18; ++i) {
    const uint4 v = ld_smem(addr_of(i));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t x = word(v, j);
      qmax = fmaxf(qmax, fmaxf(fabsf(__uint_as_float(x << 16)),
                               fabsf(__uint_as_float(x & 0xFFFF0000u))));
    }
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, d));
  if ((ct & 31) == 0) red[ct >> 5] = qmax;
  consumer_sync();
#pragma unroll
  for (int i = 0; i < 8; ++i) qmax = fmaxf(qmax, red[i]);
  int e;
  frexpf(qmax, &e);  // qmax < 2**e
  const float up = ldexpf(1.f, 14 - e);
#pragma unroll 1
  for (int i = 0; i < 18; ++i) {
    const int cc = (ct + 256 * i) % 72;
    const uint32_t addr = addr_of(i);
    const uint4 qv = ld_smem(addr);
    auto lo = [&](int j) { return __uint_as_float(word(qv, j) << 16) * up; };
    auto hi = [&](int j) { return __uint_as_float(word(qv, j) & 0xFFFF0000u) * up; };
    uint4 v;
    if (kPerm && cc < 64) {  // as load_q: word j's dims (2j, 2j+1) -> words (0, 2), (4, 6), ..
      v = make_uint4(pack_half2(lo(0), lo(1)), pack_half2(lo(2), lo(3)),
                     pack_half2(hi(0), hi(1)), pack_half2(hi(2), hi(3)));
    } else {
      v = make_uint4(pack_half2(lo(0), hi(0)), pack_half2(lo(1), hi(1)),
                     pack_half2(lo(2), hi(2)), pack_half2(lo(3), hi(3)));
    }
    st_smem(addr, v);
  }
  fence_async_smem();
  consumer_sync();  // Q complete; red free again
  return p.qk_scale / up;
}

// The staged output: bf16 [64 heads][kOutStride bytes] in Q's region (free once the last Q K^T
// has completed); 16 bytes of padding a head, so that the 8 heads of a warp's stores fall in
// different banks.
constexpr int kOutStride = 1040;
static_assert(kHeads * kOutStride <= kTileBytes, "the staged output fits Q's region");
// out rows 16-byte aligned: the staged path's stores; else store_out's 4-byte ones
__device__ __forceinline__ bool out_rows_aligned(const DecodeParams& p) {
  return ((reinterpret_cast<uintptr_t>(p.out) | static_cast<uintptr_t>(p.stride_ob * 2) |
           static_cast<uintptr_t>(p.stride_oh * 2)) & 15) == 0;
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// This thread's O fragment / l (heads r0, r1; columns 8 j + 2 c4 + e of dims 256 w ..) into the
// staging, each value at its dim (kPerm: column 8 j + q holds dim 8 j + [0 2 4 6 1 3 5 7][q]).
template <bool kPerm>
__device__ __forceinline__ void stage_out(uint8_t* smem, const float (&o)[128],
                                          const float (&lt)[2], int r0, int r1, int w, int c4) {
  const uint32_t st = smem_u32(smem + kOffQ) + 512 * w;
  const int d0 = kPerm ? (c4 < 2 ? 4 * c4 : 4 * c4 - 7) : 2 * c4;  // the pair's first dim
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float inv = lt[half] > 0.f ? 1.f / lt[half] : 0.f;
    const uint32_t row = st + (half ? r1 : r0) * kOutStride + 2 * d0;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const uint32_t v = pack_bf16x2(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
      if (kPerm) {  // dims d0, d0 + 2
        st_smem_u16(row + 16 * j, static_cast<uint16_t>(v));
        st_smem_u16(row + 16 * j + 4, static_cast<uint16_t>(v >> 16));
      } else {
        st_smem(row + 16 * j, v);
      }
    }
  }
}
// The staged [64, 512] bf16 to out (heads h0 ..), 16 bytes a store, by the 256 consumer threads.
__device__ __forceinline__ void store_staged(const DecodeParams& p, const uint8_t* smem, int b,
                                             int h0, int ct) {
  const uint32_t st = smem_u32(smem + kOffQ);
#pragma unroll 4
  for (int i = 0; i < 16; ++i) {  // 64 heads x 64 chunks
    const int id = ct + 256 * i, row = id >> 6, c = id & 63;
    if (h0 + row < p.heads) {
      const uint4 v = ld_smem(st + row * kOutStride + 16 * c);
      const uint16_t* dst = p.out + b * p.stride_ob + static_cast<int64_t>(h0 + row) * p.stride_oh;
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + 8 * c), "r"(v.x),
                   "r"(v.y), "r"(v.z), "r"(v.w)
                   : "memory");
    }
  }
}

__device__ void consumer(const DecodeParams& p, uint8_t* smem, int b, int split, int hb,
                         int ntiles) {
  const int ct = threadIdx.x - 128;  // 0..255
  const int w = ct >> 7;             // consumer warp group: rows 32w.. of each tile, dims 256w..
  const int lane = ct & 31, c4 = lane & 3;
  const int r0 = 16 * ((ct >> 5) & 3) + (lane >> 2), r1 = r0 + 8;  // this thread's two heads
  const int h0 = hb * kHeads;
  const uint32_t base = smem_u32(smem);
  const uint32_t q_addr = base + kOffQ, p_addr = base + kOffP, kv_addr = base + kOffKV;
  const uint32_t full = base + kOffBar, empty = base + kOffBar + 16;
  float* red = reinterpret_cast<float*>(smem + kOffRed);
  const float qk = load_q(p, smem, b, h0, ct);

  // Accumulator fragments (wgmma m64nN): register 4j + e holds row r0, column 8j + 2 c4 + e;
  // 4j + 2 + e the same column of row r1.
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float s[16];
  float m0 = -kInf, m1 = -kInf, l0 = 0.f, l1 = 0.f;  // running max (log2 units), partial sums

  mbar_wait(full, 0);
  issue_qk(s, q_addr, kv_addr + w * 32 * 128);
  wgmma_wait<0>();
  for (int k = 0; k < ntiles; ++k) {
    const int st = k & 1;
    const uint8_t* vf = smem + kOffValid + st * 64 + 32 * w + 2 * c4;
    float mx0 = -kInf, mx1 = -kInf;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = vf[8 * j + e];
        s[4 * j + e] = ok ? s[4 * j + e] * qk : -kInf;
        s[4 * j + 2 + e] = ok ? s[4 * j + 2 + e] * qk : -kInf;
        mx0 = fmaxf(mx0, s[4 * j + e]);
        mx1 = fmaxf(mx1, s[4 * j + 2 + e]);
      }
    }
#pragma unroll
    for (int d = 1; d < 4; d <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, d));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, d));
    }
    if (c4 == 0) {
      red[64 * w + r0] = mx0;
      red[64 * w + r1] = mx1;
    }
    consumer_sync();  // both halves' maxima; both groups' P V of the last tile done: P is free
    const float n0 = fmaxf(m0, fmaxf(mx0, red[64 * (1 - w) + r0]));
    const float n1 = fmaxf(m1, fmaxf(mx1, red[64 * (1 - w) + r1]));
    const float u0 = n0 == -kInf ? 0.f : n0, u1 = n1 == -kInf ? 0.f : n1;  // no -inf - -inf
    const float a0 = fast_exp2(m0 - u0), a1 = fast_exp2(m1 - u1);
    m0 = n0;
    m1 = n1;
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      s[i] = fast_exp2(s[i] - ((i & 2) ? u1 : u0));
      if (i & 2) ps1 += s[i]; else ps0 += s[i];
    }
    l0 = l0 * a0 + ps0;
    l1 = l1 * a1 + ps1;
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= (i & 2) ? a1 : a0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // P [64 heads, 64 rows], this group's 32 columns
      st_smem(p_addr + swz(r0, 4 * w + j) + 4 * c4, pack_half2(s[4 * j], s[4 * j + 1]));
      st_smem(p_addr + swz(r1, 4 * w + j) + 4 * c4, pack_half2(s[4 * j + 2], s[4 * j + 3]));
    }
    fence_async_smem();
    consumer_sync();  // P complete (and every read of red above done)

    const uint32_t v_addr = kv_addr + st * kTileBytes + 4 * w * kBlockBytes;
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)  // 16 rows a step; V's 256 dims are 4 blocks LBO apart
      wgmma_pv(o, desc(p_addr + 32 * kt, 16, 1024),
               desc(v_addr + kt * 16 * 128, kBlockBytes, 1024));
    wgmma_commit();
    // Hand the stage back as soon as its P V is done, before waiting for the next tile: released
    // after that wait (queueing Q K^T behind P V), the producer sat idle until the consumers had
    // the next tile, and the two sides took turns (ncu: 33% waiting on full, 21% on empty).
    wgmma_wait<0>();
    if (lane == 0) mbar_arrive(empty + 8 * st);
    if (k + 1 < ntiles) {
      mbar_wait(full + 8 * (st ^ 1), ((k + 1) >> 1) & 1);
      issue_qk(s, q_addr, kv_addr + (st ^ 1) * kTileBytes + w * 32 * 128);
      wgmma_wait<0>();
    }
  }

  // Row sums: over the quad, then over the two groups (red is free: its last reads preceded
  // the last barrier above).
#pragma unroll
  for (int d = 1; d < 4; d <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, d);
    l1 += __shfl_xor_sync(0xffffffffu, l1, d);
  }
  if (c4 == 0) {
    red[64 * w + r0] = l0;
    red[64 * w + r1] = l1;
  }
  consumer_sync();
  const float lt[2] = {l0 + red[64 * (1 - w) + r0], l1 + red[64 * (1 - w) + r1]};
  const float mt[2] = {m0, m1};
  store_out(p, o, lt, mt, b, split, h0, r0, r1, w, c4);
}

// Variants >= 1, warp group 1: S = Q K^T over the whole tile (m64n64: Q's 2 KB per k-step are read
// once per tile, not once per group, and the row maxima need no exchange), the online softmax, P to
// shared memory for group 2 (with each head's rescale factor), then O[:, :256] += P V with P taken
// from registers (the S accumulator fragment, converted to fp16, is wgmma's A fragment as it is).
// kEarly: the next tile's Q K^T is issued right behind this tile's P V (waiting for that tile
// first), so that P V's latency is not on this group's path; the stage goes back once P V is done.
// Variant 33 (issue 51), group 1's online softmax of one S tile with fewer instructions and shorter
// chains than variant 5's: the scores stay raw and qk is folded into exp2's argument (one FFMA
// instead of an FMUL and an FADD a score); the tile's 64 valid bytes are read as 4 broadcast
// 16-byte loads and the masking skipped when all rows are valid (every tile but a ragged last
// one); maxima and sums as trees instead of 16-long chains. And the reference max of a row (m,
// log2 units) moves only when the tile's max exceeds it by more than 8, as FlashAttention-3 and
// FlashMLA do: then P = 2**(s - m) <= 2**8 (exact range for fp16 and the fp32 sums), the factor
// `a` is exactly 1 for a row that kept its max, and the callers skip the [64, 512] rescale when
// every row of a warp kept it (after the first tile, almost always). m only has to be an upper
// bound within 2**8 of the scores for the sums; the log-sum-exp m + log2(l) is the same.
__device__ __forceinline__ void softmax_lazy(float (&s)[32], const uint8_t* valid, int c4, float qk,
                                             float& m0, float& m1, float& l0, float& l1,
                                             float& a0, float& a1) {
  const uint4* vw = reinterpret_cast<const uint4*>(valid);
  const uint4 v0 = vw[0], v1 = vw[1], v2 = vw[2], v3 = vw[3];
  const uint32_t all = v0.x & v0.y & v0.z & v0.w & v1.x & v1.y & v1.z & v1.w & v2.x & v2.y &
                       v2.z & v2.w & v3.x & v3.y & v3.z & v3.w;
  if (all != 0x01010101u) {  // a ragged tile: padding rows score -inf (the same for all threads)
    const uint8_t* vf = valid + 2 * c4;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = vf[8 * j + e];
        s[4 * j + e] = ok ? s[4 * j + e] : -kInf;
        s[4 * j + 2 + e] = ok ? s[4 * j + 2 + e] : -kInf;
      }
    }
  }
  // s[4 j + e]: head r0; s[4 j + 2 + e]: head r1
  float t0[8], t1[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    t0[j] = fmaxf(s[4 * j], s[4 * j + 1]);
    t1[j] = fmaxf(s[4 * j + 2], s[4 * j + 3]);
  }
#pragma unroll
  for (int w = 4; w > 0; w >>= 1) {
#pragma unroll
    for (int j = 0; j < w; ++j) {
      t0[j] = fmaxf(t0[j], t0[j + w]);
      t1[j] = fmaxf(t1[j], t1[j + w]);
    }
  }
  float mx0 = t0[0], mx1 = t1[0];
#pragma unroll
  for (int d = 1; d < 4; d <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, d));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, d));
  }
  mx0 *= qk;  // qk > 0; -inf stays -inf
  mx1 *= qk;
  const float n0 = mx0 > m0 + 8.f ? mx0 : m0, n1 = mx1 > m1 + 8.f ? mx1 : m1;
  const float u0 = n0 == -kInf ? 0.f : n0, u1 = n1 == -kInf ? 0.f : n1;  // no -inf - -inf
  a0 = n0 == m0 ? 1.f : fast_exp2(m0 - u0);
  a1 = n1 == m1 ? 1.f : fast_exp2(m1 - u1);
  m0 = n0;
  m1 = n1;
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = fast_exp2(fmaf(s[i], qk, -((i & 2) ? u1 : u0)));
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    t0[j] = s[4 * j] + s[4 * j + 1];
    t1[j] = s[4 * j + 2] + s[4 * j + 3];
  }
#pragma unroll
  for (int w = 4; w > 0; w >>= 1) {
#pragma unroll
    for (int j = 0; j < w; ++j) {
      t0[j] += t0[j + w];
      t1[j] += t1[j + w];
    }
  }
  l0 = l0 * a0 + t0[0];
  l1 = l1 * a1 + t1[0];
}

// kPerm, kStamp: variants 29-31 (load_q / store_out in decode_chunk_lean's dim order; variant
// 31's stamps). kSoft: variant 33's softmax (softmax_lazy). kLoopK: variants 35, 36 (issue_qk64).
// kEnds: variants 38-44 (load_q_async, the staged output); kStampEnds: 39's, 44's stamps
// (StampEnds); kQIn: 41, 43, 44 (Q's arrival told to producer_lean's kQFirst).
template <bool kEarly, bool kPerm = false, bool kStamp = false, bool kSoft = false,
          bool kLoopK = false, bool kEnds = false, bool kStampEnds = false, bool kQIn = false>
__device__ void consumer_qk(const DecodeParams& p, uint8_t* smem, int b, int split, int hb,
                            int ntiles) {
  const int ct = threadIdx.x - 128;  // 0..127
  const int lane = ct & 31, c4 = lane & 3;
  const int r0 = 16 * (ct >> 5) + (lane >> 2), r1 = r0 + 8;  // this thread's two heads
  const int h0 = hb * kHeads;
  const uint32_t base = smem_u32(smem);
  const uint32_t p_addr = base + kOffP, kv_addr = base + kOffKV;
  const uint32_t full = base + kOffBar, empty = base + kOffBar + 16;
  float* red = reinterpret_cast<float*>(smem + kOffRed);  // [0, 64): rescale, [64, 128): sums
  const float qk =
      kEnds ? load_q_async<kPerm>(p, smem, b, h0, ct) : load_q<kPerm>(p, smem, b, h0, ct);
  if (kQIn && ct == 0) mbar_arrive(base + kOffBar + kBarQIn * 8);  // for kQFirst's producer
  if (kStampEnds && ct == 0) stamp<kStampEnds>(p, kSEQReady, clock64());
  long long t_full = 0, t_qk = 0, t_soft = 0, t_pv = 0, t_pfree = 0, c0 = 0;
  auto clk = [&]() { return kStamp ? clock64() : 0ll; };
  if (kStamp && ct == 0) stamp<kStamp>(p, kS64G1QReady, clock64());
  // Descriptors: one per operand base; a k-step adds its byte offset / 16 to the address field
  // (shared addresses stay below 2**18, so the 14-bit field never carries).
  const uint64_t dq = desc(base + kOffQ, 16, 1024);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float s[32];
  float m0 = -kInf, m1 = -kInf, l0 = 0.f, l1 = 0.f;  // running max (log2 units), partial sums

  auto issue_qk64 = [&](int st) {
    const uint64_t dk = desc(kv_addr + st * kTileBytes, 16, 1024);
    wgmma_fence();
    if constexpr (kLoopK) {
      // variants 35, 36: a run-time loop over the 9 blocks of 64 dims, 4 k-steps each unrolled:
      // with all 36 unrolled, ptxas computed the 72 descriptors once and kept them in registers
      // across the tile loop (R2UR into uniform registers every tile), which pushed group 1 into
      // spilling them (v33: 3 local loads a tile, right before the wgmmas)
#pragma unroll 1
      for (int kb = 0; kb < 9; ++kb) {
        const uint32_t boff = (kb * kBlockBytes) >> 4;
#pragma unroll
        for (int q4 = 0; q4 < 4; ++q4)
          wgmma_qk64(s, dq + boff + 2 * q4, dk + boff + 2 * q4, (kb | q4) > 0);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 36; ++kk) {  // 576 dims, 16 a step: 4 steps per 128-byte row
        const uint32_t off = ((kk >> 2) * kBlockBytes + (kk & 3) * 32) >> 4;
        wgmma_qk64(s, dq + off, dk + off, kk > 0);
      }
    }
    wgmma_commit();
  };

  mbar_wait(full, 0);
  if (kStamp && ct == 0) stamp<kStamp>(p, kS64StartClk + 10, clock64());  // slot 11: tile 0 in
  if (kStampEnds && ct == 0) stamp<kStampEnds>(p, kSETile0In, clock64());
  issue_qk64(0);
  wgmma_wait<0>();
  for (int k = 0; k < ntiles; ++k) {
    const int st = k & 1;
    c0 = clk();
    // S fragment: s[4j + e] = head r0, tile row 8j + 2 c4 + e; s[4j + 2 + e] = head r1, same row.
    float a0, a1;
    if constexpr (kSoft) {
      softmax_lazy(s, smem + kOffValid + st * 64, c4, qk, m0, m1, l0, l1, a0, a1);
      // the rescale only where a row's reference max moved (rare after the first tile)
      if (!__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) {
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= (i & 2) ? a1 : a0;
      }
    } else {
    const uint8_t* vf = smem + kOffValid + st * 64 + 2 * c4;
    float mx0 = -kInf, mx1 = -kInf;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = vf[8 * j + e];
        s[4 * j + e] = ok ? s[4 * j + e] * qk : -kInf;
        s[4 * j + 2 + e] = ok ? s[4 * j + 2 + e] * qk : -kInf;
        mx0 = fmaxf(mx0, s[4 * j + e]);
        mx1 = fmaxf(mx1, s[4 * j + 2 + e]);
      }
    }
#pragma unroll
    for (int d = 1; d < 4; d <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, d));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, d));
    }
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float u0 = n0 == -kInf ? 0.f : n0, u1 = n1 == -kInf ? 0.f : n1;  // no -inf - -inf
    a0 = fast_exp2(m0 - u0);
    a1 = fast_exp2(m1 - u1);
    m0 = n0;
    m1 = n1;
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] = fast_exp2(s[i] - ((i & 2) ? u1 : u0));
      if (i & 2) ps1 += s[i]; else ps0 += s[i];
    }
    l0 = l0 * a0 + ps0;
    l1 = l1 * a1 + ps1;
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= (i & 2) ? a1 : a0;
    }
    // pa[2j] = head r0, tile rows 8j + 2 c4 (+1); pa[2j + 1] = head r1: for the k-step kt (tile
    // rows 16 kt ..), pa[4 kt .. 4 kt + 3] is wgmma's A fragment.
    uint32_t pa[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      pa[2 * j] = pack_half2(s[4 * j], s[4 * j + 1]);
      pa[2 * j + 1] = pack_half2(s[4 * j + 2], s[4 * j + 3]);
    }
    if (kStamp) {
      const long long c1 = clk();
      t_soft += c1 - c0;
      c0 = c1;
    }
    if (k > 0) named_sync(kBarPFree);  // group 2 has read the last tile's P and factors
    if (kStamp) {
      const long long c1 = clk();
      t_pfree += c1 - c0;
      c0 = c1;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // P [64 heads, 64 rows] fp16, K-major, 128-byte swizzle
      st_smem(p_addr + swz(r0, j) + 4 * c4, pa[2 * j]);
      st_smem(p_addr + swz(r1, j) + 4 * c4, pa[2 * j + 1]);
    }
    if (c4 == 0) {
      red[r0] = a0;
      red[r1] = a1;
    }
    fence_async_smem();
    named_arrive(kBarPReady);

    const uint64_t dv = desc(kv_addr + st * kTileBytes, kBlockBytes, 1024);  // dims 0..255
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)  // 16 rows a step
      wgmma_pv_rs(o, pa[4 * kt], pa[4 * kt + 1], pa[4 * kt + 2], pa[4 * kt + 3],
                  dv + ((kt * 16 * 128) >> 4));
    wgmma_commit();
    if (kEarly && k + 1 < ntiles) {
      mbar_wait(full + 8 * (st ^ 1), ((k + 1) >> 1) & 1);
      issue_qk64(st ^ 1);
      wgmma_wait<1>();  // this tile's P V (groups complete in order)
      if (lane == 0) mbar_arrive(empty + 8 * st);
      wgmma_wait<0>();
    } else {
      if (kStamp) c0 = clk();
      wgmma_wait<0>();
      if (lane == 0) mbar_arrive(empty + 8 * st);
      if (kStamp) {
        const long long c1 = clk();
        t_pv += c1 - c0;
        c0 = c1;
      }
      if (k + 1 < ntiles) {
        mbar_wait(full + 8 * (st ^ 1), ((k + 1) >> 1) & 1);
        if (kStamp) {
          const long long c1 = clk();
          t_full += c1 - c0;
          c0 = c1;
        }
        issue_qk64(st ^ 1);
        wgmma_wait<0>();
        if (kStamp) t_qk += clk() - c0;
      }
    }
  }
  if (kStampEnds && ct == 0) stamp<kStampEnds>(p, kSEG1LoopDone, clock64());
  if (kStamp && ct == 0) {
    stamp<kStamp>(p, kS64G1LoopDone, clock64());
    stamp<kStamp>(p, kS64G1WaitFull, t_full);
    stamp<kStamp>(p, kS64G1WaitQk, t_qk);
    stamp<kStamp>(p, kS64G1Softmax, t_soft);
    stamp<kStamp>(p, kS64G1WaitPv, t_pv);
    stamp<kStamp>(p, kS64G1WaitPFree, t_pfree);
  }

#pragma unroll
  for (int d = 1; d < 4; d <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, d);
    l1 += __shfl_xor_sync(0xffffffffu, l1, d);
  }
  if (c4 == 0) {
    red[64 + r0] = l0;
    red[64 + r1] = l1;
  }
  const float lt[2] = {l0, l1};
  const float mt[2] = {m0, m1};
  if (kEnds && p.nsplit == 1 && out_rows_aligned(p)) {
    stage_out<kPerm>(smem, o, lt, r0, r1, 0, c4);
    if (c4 == 0) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int head = h0 + (half ? r1 : r0);
        if (head < p.heads)
          p.lse[b * p.heads + head] =
              lt[half] > 0.f ? (mt[half] + log2f(lt[half])) * 0.6931471805599453f : -kInf;
      }
    }
    consumer_sync();  // the row sums, for group 2
    if (kStampEnds && ct == 0) stamp<kStampEnds>(p, kSEG1Staged, clock64());
    consumer_sync();  // group 2's half staged
    if (kStampEnds && ct == 0) stamp<kStampEnds>(p, kSEBothStaged, clock64());
    store_staged(p, smem, b, h0, ct);
    if (kStampEnds && ct == 0) {
      stamp<kStampEnds>(p, kS64EndNs, global_ns());
      stamp<kStampEnds>(p, kS64EndClk, clock64());
    }
    return;
  }
  consumer_sync();  // the row sums, for group 2
  store_out<kPerm>(p, o, lt, mt, b, split, h0, r0, r1, 0, c4);
  if (kStamp && ct == 0) {
    stamp<kStamp>(p, kS64EndNs, global_ns());
    stamp<kStamp>(p, kS64EndClk, clock64());
  }
}

// Variants >= 1, warp group 2: per tile, waits for group 1's P, rescales its O by group 1's
// factors, then O[:, 256:] += P V with both operands in shared memory.
// kG2 (variant 30): this group also decodes the latent dims 256..511 of every tile (the producer
// the rest): tiles 0 and 1 before its loop, tile k + 2 into tile k's stage once both groups have
// released it (right after its own P V of tile k, while group 1 runs tile k + 1's Q K^T and
// softmax), each thread the same row and half of its 16-byte chunks as producer thread ct - 128,
// its rows loaded a tile ahead. kPerm, kStamp, kSoft, kEnds: as consumer_qk.
template <bool kPerm = false, bool kG2 = false, bool kStamp = false, bool kSoft = false,
          bool kEnds = false>
__device__ void consumer_pv(const DecodeParams& p, uint8_t* smem, int b, int split, int hb,
                            int ntiles) {
  const int ct = threadIdx.x - 128;  // 128..255
  const int lane = ct & 31, c4 = lane & 3;
  const int r0 = 16 * ((ct >> 5) & 3) + (lane >> 2), r1 = r0 + 8;
  const int h0 = hb * kHeads;
  const uint32_t base = smem_u32(smem);
  const uint32_t kv_addr = base + kOffKV;
  const uint32_t full = base + kOffBar, empty = base + kOffBar + 16;
  const float* red = reinterpret_cast<const float*>(smem + kOffRed);
  // kG2: thread (row dr, half dh) decodes latent chunks 2 i + dh, i = 4..7, of its tile row
  const int dr = (ct - 128) >> 1, dh = ct & 1;
  const int t0 = split * p.split_len, t1 = min(t0 + p.split_len, p.topk);
  const int32_t* idx = p.idx + b * p.stride_ib;
  auto slot_of = [&](int k) {
    const int t = t0 + k * kTile + dr;
    return k < ntiles && t < t1 ? __ldg(idx + t) : -1;
  };
  // chunks 2 (n + 4) + dh (dims 256 + 32 (2 n + dh) ..), n < 4, and 21 (scale bytes 16..31)
  auto load_rows = [&](uint4 (&g)[5], int slot) {
    const uint4* src =
        reinterpret_cast<const uint4*>(p.cache + static_cast<int64_t>(slot) * kRowBytes);
#pragma unroll
    for (int n = 0; n < 5; ++n) g[n] = ld_nc_or_zero(src + (n < 4 ? 2 * (n + 4) + dh : 21), slot >= 0);
  };
  auto decode_rows = [&](const uint4 (&g)[5], int st) {
    const uint32_t tile = kv_addr + st * kTileBytes;
#pragma unroll
    for (int i = 4; i < 8; ++i) {
      uint32_t sa, sb;
      chunk_scales(g[4], i, dh, sa, sb);
      decode_chunk_lean(g[i - 4], sa, sb, tile + i * kBlockBytes, dr, dh);
    }
    fence_async_smem();
    mbar_arrive(full + 8 * st);
  };
  long long t_waitp = 0, t_dec = 0, t_empty = 0;
  uint4 ga[5];
  int slot_next = 0;
  if (kG2) {
    uint4 gb[5];
    load_rows(ga, slot_of(0));
    load_rows(gb, slot_of(1));
    slot_next = slot_of(2);
    load_q<kPerm>(p, smem, b, h0, ct);
    decode_rows(ga, 0);
    if (ntiles > 1) decode_rows(gb, 1);
    load_rows(ga, slot_next);
    slot_next = slot_of(3);
  } else if (kEnds) {
    load_q_async<kPerm>(p, smem, b, h0, ct);
  } else {
    load_q<kPerm>(p, smem, b, h0, ct);
  }
  const uint64_t dp = desc(base + kOffP, 16, 1024);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  for (int k = 0; k < ntiles; ++k) {
    const int st = k & 1;
    long long c0 = kStamp ? clock64() : 0;
    named_sync(kBarPReady);
    if (kStamp) t_waitp += clock64() - c0;
    mbar_wait(full + 8 * st, (k >> 1) & 1);  // done already (group 1 waited for it)
    const float a0 = red[r0], a1 = red[r1];
    // kSoft: group 1's factors are exactly 1 unless a row's reference max moved: no rescale then
    if (!kSoft || !__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= (i & 2) ? a1 : a0;
    }
    const uint64_t dv = desc(kv_addr + st * kTileBytes + 4 * kBlockBytes, kBlockBytes, 1024);
    wgmma_fence();
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
      wgmma_pv(o, dp + ((32 * kt) >> 4), dv + ((kt * 16 * 128) >> 4));
    wgmma_commit();
    wgmma_wait<0>();
    if (lane == 0) mbar_arrive(empty + 8 * st);
    if (k + 1 < ntiles) named_arrive(kBarPFree);
    if (kG2 && k + 2 < ntiles) {  // tile k + 2's dims 256..511 into this stage
      if (kStamp) c0 = clock64();
      mbar_wait(empty + 8 * st, (((k + 2) >> 1) & 1) ^ 1);  // group 1 is done with tile k too
      long long c1 = 0;
      if (kStamp) c1 = clock64();
      decode_rows(ga, st);
      // as the producer: no load above the arrive's release
      asm volatile("fence.acq_rel.cta;\n" ::: "memory");
      load_rows(ga, slot_next);
      slot_next = slot_of(k + 4);
      if (kStamp) {
        t_empty += c1 - c0;
        t_dec += clock64() - c1;
      }
    }
  }
  if (kStamp && ct == 128) {
    stamp<kStamp>(p, kS64G2WaitP, t_waitp);
    stamp<kStamp>(p, kS64G2Decode, t_dec);
    stamp<kStamp>(p, kS64G2WaitEmpty, t_empty);
  }
  consumer_sync();  // group 1's row sums
  const float lt[2] = {red[64 + r0], red[64 + r1]};
  const float mt[2] = {0.f, 0.f};  // only group 1 (w = 0) writes the log-sum-exps
  if (kEnds && p.nsplit == 1 && out_rows_aligned(p)) {  // consumer_qk's staged path
    stage_out<kPerm>(smem, o, lt, r0, r1, 1, c4);
    consumer_sync();
    store_staged(p, smem, b, h0, ct);
    return;
  }
  store_out<kPerm>(p, o, lt, mt, b, split, h0, r0, r1, 1, c4);
}

// ---- Few heads (H <= 16, variant 4) ----
// Q [H <= 16, 576] -> fp16 x 2**k in shared memory (as load_q, by the one consumer group; rows
// H..15 zero); returns the score scale. kRed: the layout's reduction scratch.
template <int kRed>
__device__ float load_q_few(const DecodeParams& p, uint8_t* smem, int b, int ct) {
  float* red = reinterpret_cast<float*>(smem + kRed) + 128;
  const uint16_t* qb = p.q + b * p.stride_qb;
  const uint32_t q_addr = smem_u32(smem + kFOffQ);
  float qmax = 0.f;
#pragma unroll
  for (int i = 0; i < 9; ++i) {  // 16 rows x 72 chunks of 8 values, 128 threads
    const int id = ct + 128 * i, row = id / 72, cc = id % 72;
    const uint4 v = row < p.heads
                        ? __ldg(reinterpret_cast<const uint4*>(qb + row * p.stride_qh) + cc)
                        : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t x = word(v, j);
      qmax = fmaxf(qmax, fmaxf(fabsf(__uint_as_float(x << 16)),
                               fabsf(__uint_as_float(x & 0xFFFF0000u))));
    }
    st_smem(q_addr + (cc >> 3) * kFewQBlock + swz(row, cc & 7), v);
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, d));
  if ((ct & 31) == 0) red[ct >> 5] = qmax;
  group_sync();
#pragma unroll
  for (int i = 0; i < 4; ++i) qmax = fmaxf(qmax, red[i]);
  int e;
  frexpf(qmax, &e);
  const float up = ldexpf(1.f, 14 - e);
#pragma unroll
  for (int i = 0; i < 9; ++i) {
    const int id = ct + 128 * i, row = id / 72, cc = id % 72;
    const uint32_t addr = q_addr + (cc >> 3) * kFewQBlock + swz(row, cc & 7);
    const uint4 qv = ld_smem(addr);
    uint32_t v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t x = word(qv, j);
      v[j] = pack_half2(__uint_as_float(x << 16) * up, __uint_as_float(x & 0xFFFF0000u) * up);
    }
    st_smem(addr, make_uint4(v[0], v[1], v[2], v[3]));
  }
  fence_async_smem();
  group_sync();
  return p.qk_scale / up;
}

// The few-heads consumer: per tile S^T = K Q^T (M = the tile's 64 rows, N = 16 heads: no padding
// to 64 heads), the softmax down the rows (maxima over the 4 warps through shared memory), P^T to
// shared memory, then O^T[512, 16] += V^T P^T (8 blocks of 64 dims); O^T is 64 registers.
// Fragments: s[4j + e] = tile row r0 = 16 warp + g, head 8j + 2 c4 + e; s[4j + 2 + e] = row r0 + 8;
// o[mb][...] the same with dims 64 mb + r0 (+ 8) for rows.
// kMode 0 (variants 4, 5): threads 128..255, one stage. 1 (variant 6): threads 256..383, two stages
// (tile k in stage k & 1). 2 (variant 7): two groups, threads 256..383 (cg = 0) and 384..511
// (cg = 1); group cg computes tiles cg, cg + 2, .. (all in stage cg) with its own P^T and scratch,
// and at the end group 1 hands its O^T, maxima and sums to group 0, which merges and stores them.
template <int kMode>
__device__ void consumer_few(const DecodeParams& p, uint8_t* smem, int b, int split, int ntiles) {
  constexpr bool kG = kMode > 0;
  constexpr int kStages = kG ? 2 : 1, kStep = kMode == 2 ? 2 : 1;
  constexpr int kQ = kG ? kGOffQ : kFOffQ, kKV = kG ? kGOffKV : kFOffKV;
  constexpr int kValid = kG ? kGOffValid : kFOffValid, kBar = kG ? kGOffBar : kFOffBar;
  constexpr int kRed0 = kG ? kGOffRed : kFOffRed;
  const int cx = threadIdx.x - (kG ? 256 : 128);
  const int cg = kMode == 2 ? cx >> 7 : 0;  // consumer group
  const int ct = cx & 127;                  // 0..127 within the group
  const int bar_id = 1 + cg;                // the group's named barrier (1: as group_sync)
  const int wq = ct >> 5, lane = ct & 31, g = lane >> 2, c4 = lane & 3;
  const int rr0 = 16 * wq + g, rr1 = rr0 + 8;
  const uint32_t base = smem_u32(smem);
  const uint32_t full = base + kBar, empty = base + kBar + 8 * kStages;
  float* redm = reinterpret_cast<float*>(smem + kRed0 + cg * 1024);  // [4][16] maxima
  float* reds = redm + 64;                                            // [4][16] sums
  float qk;
  if (kMode == 2) {  // group 0 loads Q, group 1 takes its scale from shared memory
    float* qks = reinterpret_cast<float*>(smem + kGOffRed) + 192;
    if (cg == 0) {
      qk = load_q_few<kGOffRed>(p, smem, b, ct);
      if (ct == 0) *qks = qk;
    }
    bar_sync_n(4, 256);  // Q (fenced for the async proxy by its writers) and its scale
    if (cg == 1) qk = *qks;
  } else {
    qk = load_q_few<kRed0>(p, smem, b, ct);
  }
  const uint64_t dq = desc(base + kQ, 16, 1024);                  // B: Q, K-major
  const uint64_t dk0 = desc(base + kKV, 16, 1024);                // A: K, K-major
  const uint64_t dv0 = desc(base + kKV, kBlockBytes, 1024);       // A: V^T, MN-major
  const uint64_t dpt = desc(base + (kG ? kGOffPT : kFOffPT) + cg * kFewQBlock, 16, 1024);  // B: P^T

  float o[8][8];
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[mb][i] = 0.f;
  float s[8];
  float m[4], l[4];  // per head 8 j + 2 c4 + e (index 2 j + e): running max, this thread's sum
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -kInf;
    l[i] = 0.f;
  }
  for (int k = cg; k < ntiles; k += kStep) {
    const int st = kStages == 1 ? 0 : (k & 1);
    mbar_wait(full + 8 * st, (k / kStages) & 1);
    const uint64_t dk = dk0 + ((st * kTileBytes) >> 4), dv = dv0 + ((st * kTileBytes) >> 4);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 36; ++kk) {
      const uint32_t ok = ((kk >> 2) * kBlockBytes + (kk & 3) * 32) >> 4;
      const uint32_t oq = ((kk >> 2) * kFewQBlock + (kk & 3) * 32) >> 4;
      wgmma_n16<0>(s, dk + ok, dq + oq, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    const bool ok0 = smem[kValid + st * 64 + rr0], ok1 = smem[kValid + st * 64 + rr1];
    float mx[4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[4 * j + e] = ok0 ? s[4 * j + e] * qk : -kInf;
        s[4 * j + 2 + e] = ok1 ? s[4 * j + 2 + e] * qk : -kInf;
        mx[2 * j + e] = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
      }
    }
#pragma unroll
    for (int d = 4; d < 32; d <<= 1)
#pragma unroll
      for (int i = 0; i < 4; ++i) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], d));
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) redm[16 * wq + 8 * j + 2 * c4 + e] = mx[2 * j + e];
    }
    bar_sync_n(bar_id, 128);  // every warp's maxima (and the last tile's P^T reads are done)
    float u[4], a[4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 2 * j + e, hh = 8 * j + 2 * c4 + e;
        const float t = fmaxf(fmaxf(redm[hh], redm[16 + hh]), fmaxf(redm[32 + hh], redm[48 + hh]));
        const float n = fmaxf(m[i], t);
        u[i] = n == -kInf ? 0.f : n;  // no -inf - -inf
        a[i] = fast_exp2(m[i] - u[i]);
        m[i] = n;
        const float p0 = fast_exp2(s[4 * j + e] - u[i]), p1 = fast_exp2(s[4 * j + 2 + e] - u[i]);
        s[4 * j + e] = p0;
        s[4 * j + 2 + e] = p1;
        l[i] = l[i] * a[i] + (p0 + p1);
      }
    }
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          o[mb][4 * j + e] *= a[2 * j + e];
          o[mb][4 * j + 2 + e] *= a[2 * j + e];
        }
    // P^T [16 heads, 64 rows] fp16, K-major, swizzled
    const uint32_t pt = base + (kG ? kGOffPT : kFOffPT) + cg * kFewQBlock;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int hh = 8 * j + 2 * c4 + e;
        st_smem_u16(pt + swz(hh, rr0 >> 3) + (rr0 & 7) * 2, __half_as_ushort(__float2half_rn(s[4 * j + e])));
        st_smem_u16(pt + swz(hh, rr1 >> 3) + (rr1 & 7) * 2,
                    __half_as_ushort(__float2half_rn(s[4 * j + 2 + e])));
      }
    }
    fence_async_smem();
    bar_sync_n(bar_id, 128);  // P^T complete
    wgmma_fence();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int kt = 0; kt < 4; ++kt)  // 16 rows a step: 2 KB into each 64-dim block
        wgmma_n16<1>(o[mb], dv + ((mb * kBlockBytes + kt * 16 * 128) >> 4), dpt + ((32 * kt) >> 4),
                     1);
    wgmma_commit();
    wgmma_wait<0>();
    if (lane == 0) mbar_arrive(empty + 8 * st);
  }

  // Sums over the rows: the 8 lanes of a column, then the 4 warps.
#pragma unroll
  for (int d = 4; d < 32; d <<= 1)
#pragma unroll
    for (int i = 0; i < 4; ++i) l[i] += __shfl_xor_sync(0xffffffffu, l[i], d);
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) reds[16 * wq + 8 * j + 2 * c4 + e] = l[2 * j + e];
  }
  bar_sync_n(bar_id, 128);
  float lt[4];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int hh = 8 * j + 2 * c4 + e;
      lt[2 * j + e] = reds[hh] + reds[16 + hh] + reds[32 + hh] + reds[48 + hh];
    }
  float* ost = reinterpret_cast<float*>(smem + kKV);
  if (kMode == 2) {
    // Group 1's unnormalized O^T goes to stage 0 (free once both groups are past their last
    // P V; the producer wrote its last tile before that), its maxima and sums next to its
    // scratch; group 0 rescales both to the larger maximum and adds them.
    float* xch = reinterpret_cast<float*>(smem + kGOffRed + 1024) + 192;  // m [16], l [16]
    bar_sync_n(4, 256);
    if (cg == 1) {
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int hh = 8 * j + 2 * c4 + e;
            ost[hh * kOStride + 64 * mb + rr0] = o[mb][4 * j + e];
            ost[hh * kOStride + 64 * mb + rr1] = o[mb][4 * j + 2 + e];
          }
      if (wq == 0 && g == 0) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int hh = 8 * j + 2 * c4 + e;
            xch[hh] = m[2 * j + e];
            xch[16 + hh] = lt[2 * j + e];
          }
      }
      bar_sync_n(4, 256);
      return;
    }
    bar_sync_n(4, 256);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 2 * j + e, hh = 8 * j + 2 * c4 + e;
        const float m1 = xch[hh], n = fmaxf(m[i], m1);
        const float u = n == -kInf ? 0.f : n;  // no -inf - -inf
        const float a0 = fast_exp2(m[i] - u), a1 = fast_exp2(m1 - u);
        lt[i] = lt[i] * a0 + xch[16 + hh] * a1;
        m[i] = n;
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
          o[mb][4 * j + e] = o[mb][4 * j + e] * a0 + ost[hh * kOStride + 64 * mb + rr0] * a1;
          o[mb][4 * j + 2 + e] =
              o[mb][4 * j + 2 + e] * a0 + ost[hh * kOStride + 64 * mb + rr1] * a1;
        }
      }
  }
  float inv[4];
  const int64_t part = static_cast<int64_t>(b * p.nsplit + split) * p.heads;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int i = 2 * j + e, hh = 8 * j + 2 * c4 + e;
      inv[i] = lt[i] > 0.f ? 1.f / lt[i] : 0.f;
      if (wq == 0 && g == 0 && hh < p.heads) {
        const float lse2 = lt[i] > 0.f ? m[i] + log2f(lt[i]) : -kInf;
        if (p.nsplit == 1) p.lse[b * p.heads + hh] = lse2 * 0.6931471805599453f;
        else p.lpart[part + hh] = lse2;
      }
    }
  }
  // O^T / l as fp32 [16 heads][kOStride] in the stage (free: the last P V is done, and the
  // producer wrote its last tile before that; group 0 of variant 7 overwrites only what it read
  // itself), then stored row by row, coalesced.
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int hh = 8 * j + 2 * c4 + e;
        ost[hh * kOStride + 64 * mb + rr0] = o[mb][4 * j + e] * inv[2 * j + e];
        ost[hh * kOStride + 64 * mb + rr1] = o[mb][4 * j + 2 + e] * inv[2 * j + e];
      }
  bar_sync_n(bar_id, 128);
#pragma unroll 4
  for (int i = 0; i < 16; ++i) {  // 16 heads x 128 chunks of 4 dims
    const int id = ct + 128 * i, hh = id >> 7, c = id & 127;
    if (hh >= p.heads) continue;
    const float4 v = *reinterpret_cast<const float4*>(ost + hh * kOStride + 4 * c);
    if (p.nsplit == 1) {
      uint16_t* dst = p.out + b * p.stride_ob + hh * p.stride_oh + 4 * c;
      *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v.x, v.y);
      *reinterpret_cast<__nv_bfloat162*>(dst + 2) = __floats2bfloat162_rn(v.z, v.w);
    } else {
      *reinterpret_cast<float4*>(p.opart + (part + hh) * 512 + 4 * c) = v;
    }
  }
}

// The producer of variant 6: threads 0..255, four per row (thread q of row r decodes latent bytes
// 64q..64q+63 = dims 128q..128q+127 with their 8 scales, and rope bytes 16q..16q+15). Tile k's raw
// rows go to raw tile k % kRaw by bulk copies, one per valid row, issued by thread q = 0 of the row
// as soon as every thread has read tile k - kRaw out of that raw tile (so tiles k + 1 and k + 2
// are in flight while tile k waits for its fp16 stage and is decoded); the decode reads shared
// memory only, and writes fp16 stage k & 1.
__device__ void producer_few2(const DecodeParams& p, uint8_t* smem, int b, int t0, int t1,
                              int ntiles) {
  const int pt = threadIdx.x, r = pt >> 2, q = pt & 3, lane = pt & 31;
  const uint32_t base = smem_u32(smem);
  const uint32_t full = base + kGOffBar, empty = full + 16, rawfull = full + 32;
  const uint32_t raw_row = base + kGOffRaw + r * kRowBytes;  // this row in raw tile 0
  const int32_t* idx = p.idx + b * p.stride_ib;
  auto slot_of = [&](int k) {
    const int t = t0 + k * kTile + r;
    return k < ntiles && t < t1 ? __ldg(idx + t) : -1;
  };
  // Row r of tile k (< ntiles) into raw tile k % kRaw: its bytes counted on that tile's barrier,
  // or an arrival alone for padding (decoded as zeros below, from the valid flag).
  auto issue = [&](int k, int slot) {
    const int rs = k % kRaw;
    const uint32_t bar = rawfull + 8 * rs;
    smem[kGOffRawValid + rs * 64 + r] = slot >= 0;
    if (slot >= 0) {
      mbar_arrive_expect_tx(bar, kRowBytes);
      bulk_g2s(raw_row + rs * kRawBytes, p.cache + static_cast<int64_t>(slot) * kRowBytes,
               kRowBytes, bar);
    } else {
      mbar_arrive(bar);
    }
  };
  int nslot = -1;  // thread q = 0: the slot of tile k + kRaw, loaded a tile early
  if (q == 0) {
    static_assert(kRaw == 2, "the prologue below issues two tiles");
    const int s0 = slot_of(0), s1 = slot_of(1);  // the three index loads in flight together
    nslot = slot_of(2);
    issue(0, s0);
    if (ntiles > 1) issue(1, s1);
  }
  for (int k = 0; k < ntiles; ++k) {
    const int rs = k % kRaw, st = k & 1;
    mbar_wait(rawfull + 8 * rs, (k / kRaw) & 1);
    const uint32_t raw = raw_row + rs * kRawBytes;
    const bool valid = smem[kGOffRawValid + rs * 64 + r];
    // padding rows: whatever the raw tile holds there (an older row, or nothing) becomes zeros
    // (P is 0 there, but 0 x NaN would not be)
    const uint32_t keep = valid ? 0xFFFFFFFFu : 0u;
    uint4 lat[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = ld_smem(raw + 64 * q + 16 * i);
      lat[i] = make_uint4(v.x & keep, v.y & keep, v.z & keep, v.w & keep);
    }
    uint4 rope = ld_smem(raw + 256 + 16 * q);
    rope = make_uint4(rope.x & keep, rope.y & keep, rope.z & keep, rope.w & keep);
    uint2 sc = ld_smem2(raw + 320 + 8 * q);
    sc = make_uint2(sc.x & keep, sc.y & keep);
    // Every thread has its part of raw tile rs in registers: refill it with tile k + kRaw.
    producer_sync();
    if (q == 0 && k + kRaw < ntiles) {
      fence_async_smem();  // the reads above before the async proxy's writes
      issue(k + kRaw, nslot);
      nslot = slot_of(k + kRaw + 1);
    }
    mbar_wait(empty + 8 * st, ((k >> 1) & 1) ^ 1);  // stage free
    const uint32_t tile = base + kGOffKV + st * kTileBytes;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // latent chunk c = 4q + i: dims 32c..32c+31 (fp16 block c / 2, its 16-byte chunks
      // 4 (c & 1) ..), scales 2c (words 0, 1) and 2c + 1 (words 2, 3): bytes 2i, 2i + 1 of sc
      const uint32_t sw = (i < 2 ? sc.x : sc.y) >> (16 * (i & 1));
      const uint32_t s2 = hmul2(e4m3x2_to_f16x2(sw), 0x54005400u);  // x 2**6
      const uint32_t sa = __byte_perm(s2, 0, 0x1010), sb = __byte_perm(s2, 0, 0x3232);
      const uint32_t block = tile + (2 * q + (i >> 1)) * kBlockBytes;
#pragma unroll
      for (int w = 0; w < 4; ++w)
        st_smem(block + swz(r, 4 * (i & 1) + w), decode8(word(lat[i], w), w < 2 ? sa : sb));
    }
    {  // rope dims 512 + 16q ..: block 8, 16-byte chunks 2q, 2q + 1
      const uint32_t block = tile + 8 * kBlockBytes;
      st_smem(block + swz(r, 2 * q),
              make_uint4(e4m3x2_to_f16x2(rope.x), e4m3x2_to_f16x2(rope.x >> 16),
                         e4m3x2_to_f16x2(rope.y), e4m3x2_to_f16x2(rope.y >> 16)));
      st_smem(block + swz(r, 2 * q + 1),
              make_uint4(e4m3x2_to_f16x2(rope.z), e4m3x2_to_f16x2(rope.z >> 16),
                         e4m3x2_to_f16x2(rope.w), e4m3x2_to_f16x2(rope.w >> 16)));
    }
    if (q == 0) smem[kGOffValid + st * 64 + r] = valid;
    fence_async_smem();
    __syncwarp();
    if (lane == 0) mbar_arrive(full + 8 * st);  // one arrival per producer warp
  }
}

// Variants 6, 7 with H <= 16: two producer warp groups gathering by bulk copies two tiles ahead and
// decoding from shared memory, two fp16 stages, one CTA per SM; one consumer group (kMode 1) or two
// on alternate tiles (kMode 2).
template <int kMode>
__global__ void __launch_bounds__(kMode == 2 ? 512 : 384, 1)
    decode_few2_kernel(const __grid_constant__ DecodeParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // swizzle atoms
  const int split = blockIdx.y, b = blockIdx.z;
  const int t0 = split * p.split_len, t1 = min(t0 + p.split_len, p.topk);
  const int ntiles = (t1 - t0 + kTile - 1) / kTile;
  const uint32_t bar = smem_u32(smem + kGOffBar);
  if (threadIdx.x == 0) {
    mbar_init(bar, 8);       // full[2]: every producer warp
    mbar_init(bar + 8, 8);
    mbar_init(bar + 16, 4);  // empty[2]: every consumer warp
    mbar_init(bar + 24, 4);
#pragma unroll
    for (int i = 0; i < kRaw; ++i) mbar_init(bar + 32 + 8 * i, 64);  // raw full: every row
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // for the async proxy
  }
  __syncthreads();
  if (threadIdx.x < 256) producer_few2(p, smem, b, t0, t1, ntiles);
  else consumer_few<kMode>(p, smem, b, split, ntiles);
#else
  __trap();
#endif
}

template <bool kLate>
__global__ void __launch_bounds__(256, 2) decode_few_kernel(const __grid_constant__ DecodeParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // swizzle atoms
  const int split = blockIdx.y, b = blockIdx.z;
  const int t0 = split * p.split_len, t1 = min(t0 + p.split_len, p.topk);
  const int ntiles = (t1 - t0 + kTile - 1) / kTile;
  const uint32_t bar = smem_u32(smem + kFOffBar);
  if (threadIdx.x == 0) {
    mbar_init(bar, 128);    // full: every producer thread arrives
    mbar_init(bar + 8, 4);  // empty: every consumer warp
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kFProducerRegs));
    producer<true, 1, kFOffKV, kFOffValid, kFOffBar, kLate>(p, smem, b, t0, t1, ntiles);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kFConsumerRegs));
    consumer_few<0>(p, smem, b, split, ntiles);
  }
#else
  __trap();
#endif
}

// ---- Few heads, variants 8, 9 (issue 29): the consumers decode straight from the raw rows ----
// No fp16 tile: the rows arrive by bulk copies in a ring of kHRaw raw tiles (a loader warp group,
// one thread a row, up to kHRaw tiles ahead), and the consumer group decodes each wgmma's A
// fragment from them into registers: S^T = K Q^T with K as the A operand, O^T += V^T P^T with
// V^T as the A operand. Per tile that is 2 x 22.5 KB of shared-memory reads instead of v5's
// 72 KB written + ~140 KB read by wgmma. The sums over dims and rows do not care which dim a
// fragment slot holds, so the slots are assigned to match the NVFP4 layout (one load, one scale
// per register) and Q and O^T are permuted to match:
//   S, k-step kk, slot 2t + e (+ 8 hi) of thread t = lane % 4: dim base(kk, t) + 2 hi + e, where
//     base = 128 t + 4 kk (latent, kk < 32) or 512 + 16 t + 4 (kk - 32) (rope): thread t reads
//     latent bytes 64t..64t+63, scales 8t..8t+7 and rope bytes 16t..16t+15 of its two rows.
//   O^T, m-block mb, slot g (g + 8) of warp w: dim 16 (8 w + g) + 2 mb (+ 1): thread (w, g)
//     reads latent bytes 8 (8w + g) .. + 7 and scale 8w + g of the rows of its k-steps.
// 8: one consumer group; 9: two on alternate tiles, merged at the end as in variant 7.
constexpr int kHRaw = 4;
constexpr int kHOffQN = 0;                                  // Q in natural order (load_q_few)
constexpr int kHOffQ = kHOffQN + kDimBlocks * kFewQBlock;   // 18432: Q permuted (wgmma's B)
constexpr int kHOffPT = kHOffQ + kDimBlocks * kFewQBlock;   // 36864: P^T [2] (one per group)
constexpr int kHOffRed = kHOffPT + 2 * kFewQBlock;          // scratch [2] (one per group)
constexpr int kHOffRaw = kHOffRed + 2 * 1024;               // 43008: kHRaw raw tiles
constexpr int kHOffRawValid = kHOffRaw + kHRaw * kRawBytes;  // uint8 [kHRaw][64]
constexpr int kHOffBar = kHOffRawValid + kHRaw * 64;         // raw full[kHRaw], raw empty[kHRaw]
constexpr int kHSmem = kHOffBar + 2 * kHRaw * 8 + 1024;
static_assert(kHOffQ % 1024 == 0 && kHOffPT % 1024 == 0 && kHOffRaw % 16 == 0 &&
              kHOffBar % 8 == 0 && kHSmem <= 227 * 1024, "few-heads v8 layout");
static_assert(kHRaw * kRawBytes >= 16 * kOStride * 4, "the epilogue stages O^T in the raw ring");
constexpr int kHLoaderRegs = 56, kHConsumerRegs = 224;  // v9: 128 x 56 + 256 x 224 = 64512
// S^T (+)= A B^T with A [64, 16] in registers (the fragment of wgmma_pv_rs), B K-major in shared
// memory.
__device__ __forceinline__ void wgmma_rs_n16(float (&d)[8], const uint32_t (&a)[4], uint64_t db,
                                             int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : WG_D8(0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

// A block-scale byte (E4M3) -> its value times 2**6 in both halves (decode8's scale2).
__device__ __forceinline__ uint32_t scale2_of(uint32_t byte) {
  return __byte_perm(hmul2(e4m3x2_to_f16x2(byte & 0xFFu), 0x54005400u), 0, 0x1010);
}

// Natural Q (load_q_few's layout at kHOffQN) -> the permuted layout at kHOffQ: chunk (head h,
// k-step kk, half hi) holds, for t = 0..3 and e = 0, 1, the dim of slot 2t + e + 8 hi:
// base(kk, t) + 2 hi + e (v8), or for variant 10's latent k-steps (kk < 32) base(kk, t) + 2 e + hi.
template <int kDec = 0>
__device__ void permute_q(uint8_t* smem, int ct) {
  const uint32_t qn = smem_u32(smem + kHOffQN), qp = smem_u32(smem + kHOffQ);
  auto qaddr = [&](int h, int d) {
    return qn + (d >> 6) * kFewQBlock + swz(h, (d & 63) >> 3) + (d & 7) * 2;
  };
#pragma unroll
  for (int i = 0; i < 9; ++i) {  // 16 heads x 36 k-steps x 2 halves, 128 threads
    const int id = ct + 128 * i, h = id & 15, kk = (id >> 4) % 36, hi = id / (16 * 36);
    uint32_t v[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      uint32_t x;
      if (kDec) {  // slot e = 0, 1 at dims d, d + step (two 16-bit loads, no branch)
        const bool lat = kk < 32;
        const int d = lat ? 128 * t + 4 * kk + hi : 512 + 16 * t + 4 * (kk - 32) + 2 * hi;
        uint16_t a, c;
        asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(a) : "r"(qaddr(h, d)));
        asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(c) : "r"(qaddr(h, d + (lat ? 2 : 1))));
        x = static_cast<uint32_t>(a) | (static_cast<uint32_t>(c) << 16);
      } else {
        const int d = (kk < 32 ? 128 * t + 4 * kk : 512 + 16 * t + 4 * (kk - 32)) + 2 * hi;
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(x) : "r"(qaddr(h, d)));
      }
      v[t] = x;
    }
    st_smem(qp + (kk >> 2) * kFewQBlock + swz(h, 2 * (kk & 3) + hi),
            make_uint4(v[0], v[1], v[2], v[3]));
  }
}

// The loader of variants 8, 9: threads 0..63, one a row; tile k's rows into raw tile k % kHRaw once
// the consumers have released tile k - kHRaw there. kStamp: when row 0's first copy was issued.
template <bool kStamp = false>
__device__ void loader_reg(const DecodeParams& p, uint8_t* smem, int b, int t0, int t1,
                           int ntiles) {
  const int r = threadIdx.x;
  const uint32_t base = smem_u32(smem);
  const uint32_t full = base + kHOffBar, empty = full + 8 * kHRaw;
  const int32_t* idx = p.idx + b * p.stride_ib;
  auto slot_of = [&](int k) {
    const int t = t0 + k * kTile + r;
    return k < ntiles && t < t1 ? __ldg(idx + t) : -1;
  };
  int slot = slot_of(0);
  for (int k = 0; k < ntiles; ++k) {
    const int rs = k % kHRaw, next = slot_of(k + 1);
    if (k >= kHRaw) mbar_wait(empty + 8 * rs, (k / kHRaw - 1) & 1);
    smem[kHOffRawValid + rs * 64 + r] = slot >= 0;
    const uint32_t bar = full + 8 * rs;
    if (slot >= 0) {
      fence_async_smem();  // the consumers' reads of this raw tile before the copy's writes
      mbar_arrive_expect_tx(bar, kRowBytes);
      bulk_g2s(base + kHOffRaw + rs * kRawBytes + r * kRowBytes,
               p.cache + static_cast<int64_t>(slot) * kRowBytes, kRowBytes, bar);
    } else {
      mbar_arrive(bar);
    }
    if (kStamp && k == 0 && r == 0) stamp<kStamp>(p, 2, clock64());
    slot = next;
  }
}

// The last split of query b to finish (variant 14, splits > 1): every split has written its
// partial (O / l as fp32, log2-sum-exp) and fenced it before counting itself in p.counters[b], so
// the one that counts last reads the others' partials (its own from `ost`, the staged O^T) and
// writes out / lse as the combine kernel would; it sets the counter back to 0 for the next launch.
// 128 threads (the consumer group), named barrier bar_id; scratch in the raw ring after `ost`.
__device__ void merge_splits_last(const DecodeParams& p, const float* ost, int b, int split,
                                  int ct, int bar_id) {
  __threadfence();  // this thread's partial stores, before the count below
  bar_sync_n(bar_id, 128);
  int* flag = const_cast<int*>(reinterpret_cast<const int*>(ost + 16 * kOStride));
  float* wt = reinterpret_cast<float*>(flag + 4);  // [16 heads][nsplit] weights
  if (ct == 0) {
    const int last = atomicAdd(p.counters + b, 1) == p.nsplit - 1;
    if (last) atomicExch(p.counters + b, 0);  // every split has counted itself
    *flag = last;
  }
  bar_sync_n(bar_id, 128);
  if (!*flag) return;
  __threadfence();  // the others' partials, after their counts
  const int ns = p.nsplit;
  const int64_t part0 = static_cast<int64_t>(b) * ns * p.heads;
  if (ct < p.heads && ct < 16) {
    float mx = -kInf;
    for (int s = 0; s < ns; ++s) mx = fmaxf(mx, __ldcg(p.lpart + part0 + s * p.heads + ct));
    const float mu = mx == -kInf ? 0.f : mx;  // no -inf - -inf
    float tot = 0.f;
    for (int s = 0; s < ns; ++s) {
      const float w = exp2f(__ldcg(p.lpart + part0 + s * p.heads + ct) - mu);
      wt[ct * ns + s] = w;
      tot += w;
    }
    const float inv = tot > 0.f ? 1.f / tot : 0.f;
    for (int s = 0; s < ns; ++s) wt[ct * ns + s] *= inv;
    p.lse[b * p.heads + ct] = tot > 0.f ? (mu + log2f(tot)) * 0.6931471805599453f : -kInf;
  }
  bar_sync_n(bar_id, 128);
#pragma unroll 2
  for (int i = 0; i < 16; ++i) {  // 16 heads x 128 chunks of 4 dims
    const int id = ct + 128 * i, hh = id >> 7, c = id & 127;
    if (hh >= p.heads) continue;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < ns; ++s) {
      const float w = wt[hh * ns + s];
      const float4 v =
          s == split ? *reinterpret_cast<const float4*>(ost + hh * kOStride + 4 * c)
                     : __ldcg(reinterpret_cast<const float4*>(
                           p.opart + (part0 + s * p.heads + hh) * 512 + 4 * c));
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    uint16_t* dst = p.out + b * p.stride_ob + hh * p.stride_oh + 4 * c;
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(acc.x, acc.y);
    *reinterpret_cast<__nv_bfloat162*>(dst + 2) = __floats2bfloat162_rn(acc.z, acc.w);
  }
}
constexpr int kMergeMaxSplits = 512;  // merge_splits_last's weights fit the raw ring after ost
static_assert(kHRaw * kRawBytes >= (16 * kOStride + 4 + 16 * kMergeMaxSplits) * 4,
              "the merge's scratch in the raw ring");

// Variants 27, 28 at 2 splits: the two splits of query b run as a cluster of two CTAs (rank =
// split), and CTA `rank` merges dims 256 rank .. 256 rank + 255 of the 2 kNC partials (one per
// consumer group of each CTA). Each group writes its O^T / l straight from registers into the
// staging of the CTA that merges those dims, its own or the other's (distributed shared memory),
// in a region of its own (not the raw ring, which the other CTA may still be reading), and its
// log2-sum-exps into both; after one cluster barrier every CTA reads only its own shared memory,
// so none waits for the other to finish reading before it exits. No partials in global memory,
// no combine kernel; combine_splits_kernel's arithmetic.
constexpr int kSStride = 260;  // floats per staged (part, head) row: 256 dims, 16-byte rows
constexpr int kHOffStage = kHOffBar + 2 * kHRaw * 8;             // [2 kNC parts][16][kSStride]
constexpr int kHOffStageL = kHOffStage + 4 * 16 * kSStride * 4;  // [2 kNC parts][16] log2-sum-exp
constexpr int kHSmemPair = kHOffStageL + 4 * 16 * 4 + 1024;
static_assert(kHOffStage % 16 == 0 && kHSmemPair <= 227 * 1024, "few-heads v27 layout");
// The merge, once every part is staged: t = 0 .. 128 kNC - 1, every consumer thread.
template <int kNC, bool kStamp>
__device__ void merge_cluster_pair(const DecodeParams& p, const uint8_t* smem, int b,
                                   uint32_t rank, int t) {
  constexpr int kParts = 2 * kNC, kPer = 8 / kNC;  // partials; chunks of 4 dims a thread
  const float* stage = reinterpret_cast<const float*>(smem + kHOffStage);
  const float* lsum = reinterpret_cast<const float*>(smem + kHOffStageL);
  float4 v[kPer][kParts];
  float lw[kPer][kParts];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {  // every load issued before the first use
    const int id = t + 128 * kNC * i, hh = id >> 6, c = id & 63;
#pragma unroll
    for (int s = 0; s < kParts; ++s) {
      v[i][s] = *reinterpret_cast<const float4*>(stage + (16 * s + hh) * kSStride + 4 * c);
      lw[i][s] = lsum[16 * s + hh];
    }
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int id = t + 128 * kNC * i, hh = id >> 6, c = id & 63;
    float mx = lw[i][0];
#pragma unroll
    for (int s = 1; s < kParts; ++s) mx = fmaxf(mx, lw[i][s]);
    const float mu = mx == -kInf ? 0.f : mx;  // no -inf - -inf
    float tot = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kParts; ++s) {
      const float w = exp2f(lw[i][s] - mu);
      tot += w;
      acc.x += w * v[i][s].x;
      acc.y += w * v[i][s].y;
      acc.z += w * v[i][s].z;
      acc.w += w * v[i][s].w;
    }
    if (hh < p.heads) {
      const float inv = tot > 0.f ? 1.f / tot : 0.f;
      uint16_t* dst = p.out + b * p.stride_ob + hh * p.stride_oh + 256 * rank + 4 * c;
      *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
      *reinterpret_cast<__nv_bfloat162*>(dst + 2) =
          __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
      if (rank == 0 && c == 0)
        p.lse[b * p.heads + hh] = tot > 0.f ? (mu + log2f(tot)) * 0.6931471805599453f : -kInf;
    }
  }
  if (kStamp && t == 0) {
    stamp<kStamp>(p, 7, clock64());
    stamp<kStamp>(p, 8, global_ns());
    stamp<kStamp>(p, 9, clock64());
  }
}

// The consumers of variants 8 (kNC = 1: threads 128..255) and 9 (kNC = 2: 128..255 take even
// tiles, 256..383 odd ones). Softmax, P^T and the epilogue as consumer_few; fragments as above.
// kFuse (variant 14): with p.counters set and several splits, the last split merges them.
// kPipe (round 10, kDec = 1 only): 1 (variant 16) decodes O^T's first k-step (rows 0..15) before
// waiting for S^T's wgmmas, so that its ~250 instructions run under their tail and the softmax's
// barriers instead of after them; 2 (variant 17) also drops the wait for O^T's last wgmmas at the
// end of each tile (the next tile's S^T decode runs under them; its wait covers them). 3 (variants
// 19, 20): a wait for all but the last batch after each commit, so that only two batches' A
// fragments are live (up to 36 x 4 registers otherwise), room for two consumer groups at 224.
// 4 (variant 24): 3 + 1's early decode; 5 (25): 4 + the kernel lets its dependent launch (the
// combine kernel, PDL) start as soon as every CTA runs (griddepcontrol.launch_dependents).
// kCluster (variants 27, 28, 2 splits): each group stages its partial where it is merged, in this
// CTA or the other split's of the cluster (merge_cluster_pair). kStamp (28): the phases' clocks.
template <int kNC, int kDec = 0, bool kFuse = false, int kPipe = 0, bool kCluster = false,
          bool kStamp = false>
__device__ void consumer_reg(const DecodeParams& p, uint8_t* smem, int b, int split, int ntiles) {
  const int cx = threadIdx.x - 128;
  // the group from lane 0: a value ptxas knows is warp-uniform, so the tile loop below is not a
  // divergent path (where it serialized every wgmma, C7520)
  const int cg = kNC == 2 ? __shfl_sync(0xffffffffu, cx >> 7, 0) : 0;
  const int ct = cx & 127;
  const int bar_id = 1 + cg;
  constexpr bool kHoist = kDec == 1 && (kPipe == 1 || kPipe == 2 || kPipe >= 4);
  constexpr bool kBound = kPipe == 3 || kPipe >= 4;
  const int wq = ct >> 5, lane = ct & 31, g = lane >> 2, c4 = lane & 3;
  const int rr0 = 16 * wq + g, rr1 = rr0 + 8, q8 = 8 * wq + g;
  const uint32_t base = smem_u32(smem);
  const uint32_t full = base + kHOffBar, empty = full + 8 * kHRaw;
  float* redm = reinterpret_cast<float*>(smem + kHOffRed + cg * 1024);  // [4][16] maxima
  float* reds = redm + 64;                                              // [4][16] sums
  float* qks = reinterpret_cast<float*>(smem + kHOffRed) + 192;
  float qk = 0.f;
  if (cg == 0) {
    qk = load_q_few<kHOffRed>(p, smem, b, ct);
    permute_q<kDec>(smem, ct);
    fence_async_smem();
    if (ct == 0) *qks = qk;
  }
  bar_sync_n(4, 128 * kNC);  // Q permuted (fenced for the async proxy) and its scale
  if (cg == 1) qk = *qks;
  if constexpr (kStamp) {
    if (cx == 0) stamp<kStamp>(p, 3, clock64());
    if (cg == 0) mbar_wait(full, 0);  // tile 0's rows (the loop's first wait, made here)
    if (cx == 0) stamp<kStamp>(p, 4, clock64());
  }
  const uint64_t dq = desc(base + kHOffQ, 16, 1024);                    // B: Q, K-major
  const uint32_t pt = base + kHOffPT + cg * kFewQBlock;
  const uint64_t dpt = desc(pt, 16, 1024);                              // B: P^T, K-major

  float o[8][8];
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[mb][i] = 0.f;
  float s[8];
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -kInf;
    l[i] = 0.f;
  }
  for (int k = cg; k < ntiles; k += kNC) {
    const int rs = k % kHRaw;
    mbar_wait(full + 8 * rs, (k / kHRaw) & 1);
    const uint32_t raw = base + kHOffRaw + rs * kRawBytes;
    const uint8_t* valid = smem + kHOffRawValid + rs * 64;
    // O^T's A fragments of k-step kt (variant 10's decode): rows 2 c4, 2 c4 + 1 (pr = 0) and + 8
    // (pr = 1) of rows 16 kt..; their E4M3 bytes interleaved before the convert (no fp16
    // interleave after it), scaled by (row a's scale, row b's scale)
    auto decode_ot = [&](int kt, uint32_t (&fb)[8][4]) {
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {
        const int row = 16 * kt + 2 * c4 + 8 * pr;
        const uint32_t ra = raw + row * kRowBytes;
        const uint2 xa = ld_smem2(ra + 8 * q8), xb = ld_smem2(ra + kRowBytes + 8 * q8);
        // padding rows hold older rows or nothing: a zero scale makes them zeros
        const uint8_t* sc = smem + kHOffRaw + rs * kRawBytes + row * kRowBytes + 320 + q8;
        const uint32_t sab = (valid[row] ? uint32_t{sc[0]} : 0u) |
                             (valid[row + 1] ? uint32_t{sc[kRowBytes]} << 8 : 0u);
        const uint32_t s2 = hmul2(cvt_e4m3_lo(sab), 0x54005400u);
#pragma unroll
        for (int wd = 0; wd < 2; ++wd) {  // dims 16 q8 + 8 wd + {0..7}: m-blocks 4 wd + {0..3}
          // the packed bytes of rows a and b interleaved (a0 b0 a1 b1: dims 0..3; then 4..7), so
          // that each convert's two values are one dim of rows a, b
          const uint32_t wa = wd ? xa.y : xa.x, wb = wd ? xb.y : xb.x;
          uint32_t l0, h0, l1, h1;
          e2m1_e4m3(__byte_perm(wa, wb, 0x5140), l0, h0);
          e2m1_e4m3(__byte_perm(wa, wb, 0x7362), l1, h1);
          // dim 8 wd + 2 i + s -> m-block 4 wd + i, slot 2 pr + s (v8's mapping)
          fb[4 * wd + 0][2 * pr] = hmul2(cvt_e4m3_lo(l0), s2);
          fb[4 * wd + 1][2 * pr] = hmul2(cvt_e4m3_hi(l0), s2);
          fb[4 * wd + 2][2 * pr] = hmul2(cvt_e4m3_lo(l1), s2);
          fb[4 * wd + 3][2 * pr] = hmul2(cvt_e4m3_hi(l1), s2);
          fb[4 * wd + 0][2 * pr + 1] = hmul2(cvt_e4m3_lo(h0), s2);
          fb[4 * wd + 1][2 * pr + 1] = hmul2(cvt_e4m3_hi(h0), s2);
          fb[4 * wd + 2][2 * pr + 1] = hmul2(cvt_e4m3_lo(h1), s2);
          fb[4 * wd + 3][2 * pr + 1] = hmul2(cvt_e4m3_hi(h1), s2);
        }
      }
    };
    // S^T = K Q^T: per 16-byte latent chunk i of the two rows, 8 k-steps (4 words, 2 each)
    const uint32_t row0 = raw + rr0 * kRowBytes, row1 = raw + rr1 * kRowBytes;
    const uint2 sc0 = ld_smem2(row0 + 320 + 8 * c4), sc1 = ld_smem2(row1 + 320 + 8 * c4);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 x0 = ld_smem(row0 + 64 * c4 + 16 * i), x1 = ld_smem(row1 + 64 * c4 + 16 * i);
      uint32_t fa[8][4];
      if constexpr (kDec == 1) {
        // the scales of blocks 2i, 2i + 1 of each row in one convert (x 2**6), then one per half
        const uint32_t sw0 = i < 2 ? sc0.x : sc0.y, sw1 = i < 2 ? sc1.x : sc1.y;
        const uint32_t q0 = hmul2(i & 1 ? cvt_e4m3_hi(sw0) : cvt_e4m3_lo(sw0), 0x54005400u);
        const uint32_t q1 = hmul2(i & 1 ? cvt_e4m3_hi(sw1) : cvt_e4m3_lo(sw1), 0x54005400u);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          // word w: dims 128 c4 + 32 i + 8 w + {0..7}, block 2 i + (w >> 1); k-steps 8 i + 2 w + h
          // take the converts of half h: slot 2 t + e -> dim + 4 h + 2 e, slot 2 t + 8 + e -> + 1
          const uint32_t s0 = __byte_perm(q0, 0, w < 2 ? 0x1010 : 0x3232);
          const uint32_t s1 = __byte_perm(q1, 0, w < 2 ? 0x1010 : 0x3232);
          uint32_t l0, h0, l1, h1;
          e2m1_e4m3(word(x0, w), l0, h0);
          e2m1_e4m3(word(x1, w), l1, h1);
          fa[2 * w][0] = hmul2(cvt_e4m3_lo(l0), s0), fa[2 * w][1] = hmul2(cvt_e4m3_lo(l1), s1);
          fa[2 * w][2] = hmul2(cvt_e4m3_lo(h0), s0), fa[2 * w][3] = hmul2(cvt_e4m3_lo(h1), s1);
          fa[2 * w + 1][0] = hmul2(cvt_e4m3_hi(l0), s0);
          fa[2 * w + 1][1] = hmul2(cvt_e4m3_hi(l1), s1);
          fa[2 * w + 1][2] = hmul2(cvt_e4m3_hi(h0), s0);
          fa[2 * w + 1][3] = hmul2(cvt_e4m3_hi(h1), s1);
        }
      } else {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const int blk = 2 * i + (w >> 1);  // scale byte of dims 128 c4 + 16 blk ..
          const uint32_t s0 = scale2_of((blk < 4 ? sc0.x : sc0.y) >> (8 * (blk & 3)));
          const uint32_t s1 = scale2_of((blk < 4 ? sc1.x : sc1.y) >> (8 * (blk & 3)));
          const uint4 d0 = decode8(word(x0, w), s0), d1 = decode8(word(x1, w), s1);
          fa[2 * w][0] = d0.x, fa[2 * w][1] = d1.x, fa[2 * w][2] = d0.y, fa[2 * w][3] = d1.y;
          fa[2 * w + 1][0] = d0.z, fa[2 * w + 1][1] = d1.z, fa[2 * w + 1][2] = d0.w,
                        fa[2 * w + 1][3] = d1.w;
        }
      }
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int kk = 8 * i + j;
        wgmma_rs_n16(s, fa[j], dq + (((kk >> 2) * kFewQBlock + (kk & 3) * 32) >> 4), kk > 0);
      }
      wgmma_commit();
      if constexpr (kBound) wgmma_wait<1>();  // one batch in flight: its fragments only
    }
    {  // rope: k-steps 32..35, word i of each row's 16 rope bytes
      const uint4 x0 = ld_smem(row0 + 256 + 16 * c4), x1 = ld_smem(row1 + 256 + 16 * c4);
      uint32_t fa[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t w0 = word(x0, i), w1 = word(x1, i);
        if constexpr (kDec == 1) {
          fa[i][0] = cvt_e4m3_lo(w0), fa[i][1] = cvt_e4m3_lo(w1);
          fa[i][2] = cvt_e4m3_hi(w0), fa[i][3] = cvt_e4m3_hi(w1);
        } else {
          fa[i][0] = e4m3x2_to_f16x2(w0), fa[i][1] = e4m3x2_to_f16x2(w1);
          fa[i][2] = e4m3x2_to_f16x2(w0 >> 16), fa[i][3] = e4m3x2_to_f16x2(w1 >> 16);
        }
      }
      wgmma_fence();
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int kk = 32 + i;
        wgmma_rs_n16(s, fa[i], dq + (((kk >> 2) * kFewQBlock + (kk & 3) * 32) >> 4), 1);
      }
      wgmma_commit();
      if constexpr (kBound) wgmma_wait<1>();  // one batch in flight: its fragments only
    }
    uint32_t fb0[8][4];  // kPipe: O^T's first k-step, decoded under S^T's last wgmmas
    if constexpr (kHoist) decode_ot(0, fb0);
    wgmma_wait<0>();
    const bool ok0 = valid[rr0], ok1 = valid[rr1];
    float mx[4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[4 * j + e] = ok0 ? s[4 * j + e] * qk : -kInf;
        s[4 * j + 2 + e] = ok1 ? s[4 * j + 2 + e] * qk : -kInf;
        mx[2 * j + e] = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
      }
    }
#pragma unroll
    for (int d = 4; d < 32; d <<= 1)
#pragma unroll
      for (int i = 0; i < 4; ++i) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], d));
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) redm[16 * wq + 8 * j + 2 * c4 + e] = mx[2 * j + e];
    }
    bar_sync_n(bar_id, 128);  // every warp's maxima (and the last tile's P^T reads are done)
    float a[4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 2 * j + e, hh = 8 * j + 2 * c4 + e;
        const float t = fmaxf(fmaxf(redm[hh], redm[16 + hh]), fmaxf(redm[32 + hh], redm[48 + hh]));
        const float n = fmaxf(m[i], t);
        const float u = n == -kInf ? 0.f : n;  // no -inf - -inf
        a[i] = fast_exp2(m[i] - u);
        m[i] = n;
        const float p0 = fast_exp2(s[4 * j + e] - u), p1 = fast_exp2(s[4 * j + 2 + e] - u);
        s[4 * j + e] = p0;
        s[4 * j + 2 + e] = p1;
        l[i] = l[i] * a[i] + (p0 + p1);
      }
    }
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          o[mb][4 * j + e] *= a[2 * j + e];
          o[mb][4 * j + 2 + e] *= a[2 * j + e];
        }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int hh = 8 * j + 2 * c4 + e;
        st_smem_u16(pt + swz(hh, rr0 >> 3) + (rr0 & 7) * 2,
                    __half_as_ushort(__float2half_rn(s[4 * j + e])));
        st_smem_u16(pt + swz(hh, rr1 >> 3) + (rr1 & 7) * 2,
                    __half_as_ushort(__float2half_rn(s[4 * j + 2 + e])));
      }
    }
    fence_async_smem();
    bar_sync_n(bar_id, 128);  // P^T complete
    // O^T += V^T P^T: k-step kt = rows 16 kt + 2 c4 + {0, 1, 8, 9}; one 8-byte load and one scale
    // per row give this thread's dim pair of all 8 m-blocks.
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) {
      uint32_t fb[8][4];
      if constexpr (kDec == 1) {
        if (kHoist && kt == 0) {  // the hoisting variants decoded k-step 0 early (fb0)
#pragma unroll
          for (int mb = 0; mb < 8; ++mb)
#pragma unroll
            for (int i = 0; i < 4; ++i) fb[mb][i] = fb0[mb][i];
        } else {
          decode_ot(kt, fb);
        }
      } else {
        uint32_t v[4][8];
#pragma unroll
        for (int rj = 0; rj < 4; ++rj) {
          const int row = 16 * kt + 2 * c4 + (rj & 1) + 8 * (rj >> 1);
          const uint32_t ra = raw + row * kRowBytes;
          const uint2 x = ld_smem2(ra + 8 * q8);
          // padding rows hold older rows or nothing: a zero scale makes them zeros (P is 0 there,
          // but 0 x NaN would not be)
          const uint32_t sb =
              valid[row] ? smem[kHOffRaw + rs * kRawBytes + row * kRowBytes + 320 + q8] : 0u;
          const uint32_t s2 = scale2_of(sb);
          const uint4 lo = decode8(x.x, s2), hi = decode8(x.y, s2);
          v[rj][0] = lo.x, v[rj][1] = lo.y, v[rj][2] = lo.z, v[rj][3] = lo.w;
          v[rj][4] = hi.x, v[rj][5] = hi.y, v[rj][6] = hi.z, v[rj][7] = hi.w;
        }
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
          fb[mb][0] = __byte_perm(v[0][mb], v[1][mb], 0x5410);  // dim 2 mb, rows 2 c4, 2 c4 + 1
          fb[mb][1] = __byte_perm(v[0][mb], v[1][mb], 0x7632);  // dim 2 mb + 1
          fb[mb][2] = __byte_perm(v[2][mb], v[3][mb], 0x5410);  // rows + 8
          fb[mb][3] = __byte_perm(v[2][mb], v[3][mb], 0x7632);
        }
      }
      wgmma_fence();
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) wgmma_rs_n16(o[mb], fb[mb], dpt + ((32 * kt) >> 4), 1);
      wgmma_commit();
      if constexpr (kBound) wgmma_wait<1>();  // one batch in flight: its fragments only
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * rs);  // this warp has read the raw tile
    if (kPipe < 2) wgmma_wait<0>();  // kPipe 2: the next tile's S^T wait covers these
  }
  if (kPipe == 2) wgmma_wait<0>();
  if (kStamp && cx == 0) stamp<kStamp>(p, 5, clock64());

  // Sums over the rows: the 8 lanes of a column, then the 4 warps.
#pragma unroll
  for (int d = 4; d < 32; d <<= 1)
#pragma unroll
    for (int i = 0; i < 4; ++i) l[i] += __shfl_xor_sync(0xffffffffu, l[i], d);
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) reds[16 * wq + 8 * j + 2 * c4 + e] = l[2 * j + e];
  }
  bar_sync_n(bar_id, 128);
  float lt[4];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int hh = 8 * j + 2 * c4 + e;
      lt[2 * j + e] = reds[hh] + reds[16 + hh] + reds[32 + hh] + reds[48 + hh];
    }
  if constexpr (kCluster) {  // O^T / l to the CTA that merges its dims (16 q8 .. + 15: half q8 / 16)
    const uint32_t rank = cluster_rank(), half = q8 >> 4;
    const int part = kNC * rank + cg;
    const uint32_t stage = mapa_shared(base + kHOffStage, half);
    asm volatile("barrier.cluster.wait;\n" ::: "memory");  // the start's phase: the other CTA runs
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 2 * j + e, hh = 8 * j + 2 * c4 + e;
        const float iv = lt[i] > 0.f ? 1.f / lt[i] : 0.f;
        const uint32_t row = stage + 4 * ((16 * part + hh) * kSStride + 16 * (q8 & 15));
#pragma unroll
        for (int k = 0; k < 4; ++k)  // dims 4k .. 4k + 3 of the 16: m-blocks 2k, 2k + 1
          st_dsmem4(row + 16 * k,
                    make_float4(o[2 * k][4 * j + e] * iv, o[2 * k][4 * j + 2 + e] * iv,
                                o[2 * k + 1][4 * j + e] * iv, o[2 * k + 1][4 * j + 2 + e] * iv));
        if (wq == 0 && g == 0) {
          const float l2 = lt[i] > 0.f ? m[i] + log2f(lt[i]) : -kInf;
          const uint32_t at = base + kHOffStageL + 4 * (16 * part + hh);
          st_dsmem1(mapa_shared(at, 0), l2);
          st_dsmem1(mapa_shared(at, 1), l2);
        }
      }
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");  // every part staged here
    if (kStamp && cx == 0) stamp<kStamp>(p, 6, clock64());
    merge_cluster_pair<kNC, kStamp>(p, smem, b, rank, cx);
    return;
  }
  // O^T staged as fp32 [16 heads][kOStride] in the raw ring: every tile has been read (each
  // group waits for both below), and the loader issued its last copy before that.
  float* ost = reinterpret_cast<float*>(smem + kHOffRaw);
  auto dim_of = [&](int mb, int second) { return 16 * q8 + 2 * mb + second; };
  bar_sync_n(4, 128 * kNC);
  if (kNC == 2) {
    float* xch = reinterpret_cast<float*>(smem + kHOffRed + 1024) + 192;  // m [16], l [16]
    if (cg == 1) {
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int hh = 8 * j + 2 * c4 + e;
            ost[hh * kOStride + dim_of(mb, 0)] = o[mb][4 * j + e];
            ost[hh * kOStride + dim_of(mb, 1)] = o[mb][4 * j + 2 + e];
          }
      if (wq == 0 && g == 0) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int hh = 8 * j + 2 * c4 + e;
            xch[hh] = m[2 * j + e];
            xch[16 + hh] = lt[2 * j + e];
          }
      }
      bar_sync_n(4, 256);
      return;
    }
    bar_sync_n(4, 256);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 2 * j + e, hh = 8 * j + 2 * c4 + e;
        const float m1 = xch[hh], n = fmaxf(m[i], m1);
        const float u = n == -kInf ? 0.f : n;  // no -inf - -inf
        const float a0 = fast_exp2(m[i] - u), a1 = fast_exp2(m1 - u);
        lt[i] = lt[i] * a0 + xch[16 + hh] * a1;
        m[i] = n;
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
          o[mb][4 * j + e] = o[mb][4 * j + e] * a0 + ost[hh * kOStride + dim_of(mb, 0)] * a1;
          o[mb][4 * j + 2 + e] =
              o[mb][4 * j + 2 + e] * a0 + ost[hh * kOStride + dim_of(mb, 1)] * a1;
        }
      }
  }
  float inv[4];
  const int64_t part = static_cast<int64_t>(b * p.nsplit + split) * p.heads;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int i = 2 * j + e, hh = 8 * j + 2 * c4 + e;
      inv[i] = lt[i] > 0.f ? 1.f / lt[i] : 0.f;
      if (wq == 0 && g == 0 && hh < p.heads) {
        const float lse2 = lt[i] > 0.f ? m[i] + log2f(lt[i]) : -kInf;
        if (p.nsplit == 1) p.lse[b * p.heads + hh] = lse2 * 0.6931471805599453f;
        else p.lpart[part + hh] = lse2;
      }
    }
  }
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int hh = 8 * j + 2 * c4 + e;
        ost[hh * kOStride + dim_of(mb, 0)] = o[mb][4 * j + e] * inv[2 * j + e];
        ost[hh * kOStride + dim_of(mb, 1)] = o[mb][4 * j + 2 + e] * inv[2 * j + e];
      }
  bar_sync_n(bar_id, 128);
#pragma unroll 4
  for (int i = 0; i < 16; ++i) {  // 16 heads x 128 chunks of 4 dims
    const int id = ct + 128 * i, hh = id >> 7, c = id & 127;
    if (hh >= p.heads) continue;
    const float4 v = *reinterpret_cast<const float4*>(ost + hh * kOStride + 4 * c);
    if (p.nsplit == 1) {
      uint16_t* dst = p.out + b * p.stride_ob + hh * p.stride_oh + 4 * c;
      *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v.x, v.y);
      *reinterpret_cast<__nv_bfloat162*>(dst + 2) = __floats2bfloat162_rn(v.z, v.w);
    } else {
      *reinterpret_cast<float4*>(p.opart + (part + hh) * 512 + 4 * c) = v;
    }
  }
  if (kFuse && p.nsplit > 1 && p.counters != nullptr) merge_splits_last(p, ost, b, split, ct, bar_id);
}

template <int kNC, int kDec = 0, bool kFuse = false, int kPipe = 0, bool kCluster = false,
          bool kStamp = false>
__global__ void __launch_bounds__(128 + 128 * kNC, 1)
    decode_few3_kernel(const __grid_constant__ DecodeParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // swizzle atoms
  const int split = blockIdx.y, b = blockIdx.z;
  const int t0 = split * p.split_len, t1 = min(t0 + p.split_len, p.topk);
  const int ntiles = (t1 - t0 + kTile - 1) / kTile;
  const uint32_t bar = smem_u32(smem + kHOffBar);
  if (kStamp && threadIdx.x == 0) {
    stamp<kStamp>(p, 0, global_ns());
    stamp<kStamp>(p, 1, clock64());
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    stamp<kStamp>(p, 10, sm);
  }
  // the other CTA of the cluster writes into this one's shared memory at the end: every thread's
  // arrival here says that this CTA runs (the consumers wait for it before their remote stores)
  if constexpr (kCluster) asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < kHRaw; ++i) {
      mbar_init(bar + 8 * i, 64);                 // raw full: every row
      mbar_init(bar + 8 * (kHRaw + i), 4);        // raw empty: the consuming group's warps
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // for the async proxy
  }
  __syncthreads();
  if constexpr (kPipe == 5) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  if (threadIdx.x < 128) {
    if (kNC == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kHLoaderRegs));
    if (threadIdx.x < 64) loader_reg<kStamp>(p, smem, b, t0, t1, ntiles);
  } else {
    if (kNC == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kHConsumerRegs));
    consumer_reg<kNC, kDec, kFuse, kPipe, kCluster, kStamp>(p, smem, b, split, ntiles);
  }
#else
  __trap();
#endif
}

template <int kNC, int kDec = 0, bool kFuse = false, int kPipe = 0>
cudaError_t launch_few3(const DecodeParams& p, cudaStream_t stream) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(decode_few3_kernel<kNC, kDec, kFuse, kPipe>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kHSmem);
  if (attr != cudaSuccess) return attr;
  if (kFuse && p.counters != nullptr && p.nsplit > kMergeMaxSplits) return cudaErrorInvalidValue;
  const dim3 grid(1, p.nsplit, p.batch);
  decode_few3_kernel<kNC, kDec, kFuse, kPipe><<<grid, 128 + 128 * kNC, kHSmem, stream>>>(p);
  return cudaGetLastError();
}

// Variants 27, 28 at 2 splits: decode_few3_kernel with each query's two splits as a cluster of two
// CTAs (1 x 2 x 1), which merge them (merge_cluster_pair), and room for the staging.
template <int kNC, int kDec, bool kFuse, int kPipe, bool kStamp>
cudaError_t launch_few3_pair(const DecodeParams& p, cudaStream_t stream) {
  auto* kernel = decode_few3_kernel<kNC, kDec, kFuse, kPipe, true, kStamp>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kHSmemPair);
  if (attr != cudaSuccess) return attr;
  if (p.nsplit != 2) return cudaErrorInvalidValue;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = 1;
  at[0].val.clusterDim.y = 2;
  at[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1, 2, p.batch);
  cfg.blockDim = dim3(128 + 128 * kNC);
  cfg.dynamicSmemBytes = kHSmemPair;
  cfg.stream = stream;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p);
  return e != cudaSuccess ? e : cudaGetLastError();
}

// Variants 21, 22 (round 10): the splits' partials merged by a CUDA kernel launched right behind
// the decode kernel, with programmatic dependent launch (21: its launch is processed while the
// decode grid drains; griddepcontrol.wait holds every CTA until that grid has finished and its
// writes are visible) or as a plain launch (22). One CTA per (query, head), 4 dims a thread; the
// same arithmetic as kernels/sparse_decode.py's combine kernel.
__global__ void __launch_bounds__(128) combine_splits_kernel(const __grid_constant__ DecodeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int b = blockIdx.x / p.heads, h = blockIdx.x % p.heads, t = threadIdx.x;
  const int ns = p.nsplit;
  const int64_t part0 = static_cast<int64_t>(b) * ns * p.heads + h;  // split s: + s * heads
  float mu = 0.f, tot = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (ns <= 4) {  // every load in flight before the first use (one memory latency, not two)
    float lw[4];
    float4 v[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int64_t part = part0 + min(s, ns - 1) * p.heads;
      lw[s] = s < ns ? p.lpart[part] : -kInf;
      v[s] = *reinterpret_cast<const float4*>(p.opart + part * 512 + 4 * t);
    }
    const float mx = fmaxf(fmaxf(lw[0], lw[1]), fmaxf(lw[2], lw[3]));
    mu = mx == -kInf ? 0.f : mx;  // no -inf - -inf
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const float w = exp2f(lw[s] - mu);  // 0 for s >= ns
      tot += w;
      acc.x += w * v[s].x;
      acc.y += w * v[s].y;
      acc.z += w * v[s].z;
      acc.w += w * v[s].w;
    }
  } else {
    float mx = -kInf;
    for (int s = 0; s < ns; ++s) mx = fmaxf(mx, p.lpart[part0 + s * p.heads]);
    mu = mx == -kInf ? 0.f : mx;
    for (int s = 0; s < ns; ++s) {
      const int64_t part = part0 + s * p.heads;
      const float w = exp2f(p.lpart[part] - mu);
      const float4 v = *reinterpret_cast<const float4*>(p.opart + part * 512 + 4 * t);
      tot += w;
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
  }
  const float inv = tot > 0.f ? 1.f / tot : 0.f;
  uint16_t* dst = p.out + b * p.stride_ob + h * p.stride_oh + 4 * t;
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  *reinterpret_cast<__nv_bfloat162*>(dst + 2) = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  if (t == 0) p.lse[b * p.heads + h] = tot > 0.f ? (mu + log2f(tot)) * 0.6931471805599453f : -kInf;
}

cudaError_t launch_combine(const DecodeParams& p, cudaStream_t stream, bool pdl) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.batch * p.heads);
  cfg.blockDim = dim3(128);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, combine_splits_kernel, p);
  return e != cudaSuccess ? e : cudaGetLastError();
}

template <int kVariant>
__global__ void __launch_bounds__(384, 1) decode_kernel(const __grid_constant__ DecodeParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // swizzle atoms
  const int hb = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int t0 = split * p.split_len, t1 = min(t0 + p.split_len, p.topk);
  const int ntiles = (t1 - t0 + kTile - 1) / kTile;  // >= 1: the host makes no empty split
  const uint32_t bar = smem_u32(smem + kOffBar);
  // 29-33 (issue 51): the lean decode; 30, 32: group 2 decodes dims 256..511; 31, 32: stamps;
  // 33: softmax_lazy
  // 35 = 33, 36 = 29, each with Q K^T's k-steps in a run-time loop over 9 blocks (kLoopK)
  // 38 = 36 with the compact ends (load_q_async, the staged output), 39 = 38 with their stamps,
  // 40 = 38 with group 1 issuing the next tile's Q K^T right behind its P V (kEarly, as 3);
  // 41 = 38 + kQFirst, 42 = 38 + kIdxEarly, 43 = both (producer_lean), 44 = 43 with 39's stamps
  constexpr bool kLean = kVariant >= 29 && kVariant <= 44 && kVariant != 34 && kVariant != 37;
  constexpr bool kSoft = kVariant == 33 || kVariant == 35;
  constexpr bool kEnds = kVariant >= 38 && kVariant <= 44;
  constexpr bool kQFirst = kVariant == 41 || kVariant == 43 || kVariant == 44;
  constexpr bool kIdxEarly = kVariant >= 42 && kVariant <= 44;
  constexpr bool kLoopK = kVariant == 35 || kVariant == 36 || kEnds;
  constexpr bool kG2 = kVariant == 30 || kVariant == 32;
  constexpr bool kStamp = kVariant == 31 || kVariant == 32;
  constexpr bool kStampEnds = kVariant == 39 || kVariant == 44;
  if ((kStamp || kStampEnds) && threadIdx.x == 0) {
    stamp<kStamp || kStampEnds>(p, kS64StartNs, global_ns());
    stamp<kStamp || kStampEnds>(p, kS64StartClk, clock64());
  }
  if (threadIdx.x == 0) {
    mbar_init(bar, kG2 ? 256 : 128);  // full[2]: every producer thread arrives (kG2: + group 2's)
    mbar_init(bar + 8, kG2 ? 256 : 128);
    mbar_init(bar + 16, 8);  // empty[2]: every consumer warp
    mbar_init(bar + 24, 8);
    if (kQFirst) mbar_init(bar + kBarQIn * 8, 1);  // Q in: group 1's thread 0
  }
  __syncthreads();
  if constexpr (kLean) {
    // kG2: the producer holds 7 chunks instead of 11 and group 2 decodes (88 + 240 + 176 = 504)
    if (threadIdx.x < 128) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kG2 ? 88 : kProducerRegs1));
      producer_lean<kG2, kStamp, kQFirst, kIdxEarly, kStampEnds>(p, smem, b, t0, t1, ntiles);
    } else if (threadIdx.x < 256) {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kQkRegs));
      consumer_qk<kVariant == 40, true, kStamp, kSoft, kLoopK, kEnds, kStampEnds, kQFirst>(
          p, smem, b, split, hb, ntiles);
    } else if constexpr (kG2) {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(176));
      consumer_pv<true, true, kStamp>(p, smem, b, split, hb, ntiles);
    } else {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kPvRegs));
      consumer_pv<true, false, kStamp, kSoft, kEnds>(p, smem, b, split, hb, ntiles);
    }
  } else if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kVariant == 0 ? kProducerRegs
                                                                           : kProducerRegs1));
    producer<(kVariant >= 2), 2, kOffKV, kOffValid, kOffBar, (kVariant == 5)>(p, smem, b, t0, t1,
                                                                             ntiles);
  } else if (kVariant == 0) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    consumer(p, smem, b, split, hb, ntiles);
  } else if (threadIdx.x < 256) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kQkRegs));
    consumer_qk<(kVariant == 3)>(p, smem, b, split, hb, ntiles);
  } else {
    // 160 < the launch's 168: .dec (an .inc below the current count is an illegal instruction,
    // seen on the H200)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kPvRegs));
    consumer_pv(p, smem, b, split, hb, ntiles);
  }
#else
  __trap();  // built for sm_90a only (wgmma, setmaxnreg)
#endif
}

template <bool kLate>
cudaError_t launch_few(const DecodeParams& p, cudaStream_t stream) {
  static const cudaError_t attr = [] {
    const cudaError_t e = cudaFuncSetAttribute(
        decode_few_kernel<kLate>, cudaFuncAttributeMaxDynamicSharedMemorySize, kFSmem);
    return e != cudaSuccess ? e
                            : cudaFuncSetAttribute(decode_few_kernel<kLate>,
                                                   cudaFuncAttributePreferredSharedMemoryCarveout,
                                                   100);  // room for two CTAs per SM
  }();
  if (attr != cudaSuccess) return attr;
  const dim3 grid(1, p.nsplit, p.batch);
  decode_few_kernel<kLate><<<grid, 256, kFSmem, stream>>>(p);
  return cudaGetLastError();
}

template <int kMode>
cudaError_t launch_few2(const DecodeParams& p, cudaStream_t stream) {
  static const cudaError_t attr = cudaFuncSetAttribute(
      decode_few2_kernel<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, kGSmem);
  if (attr != cudaSuccess) return attr;
  const dim3 grid(1, p.nsplit, p.batch);
  decode_few2_kernel<kMode><<<grid, kMode == 2 ? 512 : 384, kGSmem, stream>>>(p);
  return cudaGetLastError();
}

template <int kVariant>
cudaError_t launch(const DecodeParams& p, cudaStream_t stream) {
  static const cudaError_t attr = cudaFuncSetAttribute(
      decode_kernel<kVariant>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (attr != cudaSuccess) return attr;
  const dim3 grid((p.heads + kHeads - 1) / kHeads, p.nsplit, p.batch);
  decode_kernel<kVariant><<<grid, 384, kSmem, stream>>>(p);
  return cudaGetLastError();
}

// Few heads: the decode kernel, then (several splits) combine_splits_kernel; more heads: variant 5
// (whose splits kernels/cuda_decode.py merges with the Triton combine kernel).
template <int kNC, int kDec, bool kFuse, int kPipe>
cudaError_t launch_few3_combine(const DecodeParams& p, cudaStream_t stream, bool pdl) {
  if (p.heads > kFewHeads) return launch<5>(p, stream);
  const cudaError_t e = launch_few3<kNC, kDec, kFuse, kPipe>(p, stream);
  return e != cudaSuccess || p.nsplit == 1 ? e : launch_combine(p, stream, pdl);
}

}  // namespace

int sparse_mla_decode_sm90_smem() { return kSmem; }

cudaError_t sparse_mla_decode_sm90(const DecodeParams& p, cudaStream_t stream) {
  switch (p.variant) {
    case 0: return launch<0>(p, stream);
    case 1: return launch<1>(p, stream);
    case 2: return launch<2>(p, stream);
    case 3: return launch<3>(p, stream);
    case 4: return p.heads <= kFewHeads ? launch_few<false>(p, stream) : launch<2>(p, stream);
    case 5: return p.heads <= kFewHeads ? launch_few<true>(p, stream) : launch<5>(p, stream);
    case 6: return p.heads <= kFewHeads ? launch_few2<1>(p, stream) : launch<5>(p, stream);
    case 7: return p.heads <= kFewHeads ? launch_few2<2>(p, stream) : launch<5>(p, stream);
    case 8: return p.heads <= kFewHeads ? launch_few3<1>(p, stream) : launch<5>(p, stream);
    case 9: return p.heads <= kFewHeads ? launch_few3<2>(p, stream) : launch<5>(p, stream);
    case 10: return p.heads <= kFewHeads ? launch_few3<1, 1>(p, stream) : launch<5>(p, stream);
    case 14:  // 15: the same kernel, never given counters (the combine kernel merges)
    case 15: return p.heads <= kFewHeads ? launch_few3<1, 1, true>(p, stream) : launch<5>(p, stream);
    // 16, 17 (round 10): 15's build with O^T's first k-step decoded before S^T's wait (kPipe 1),
    // + no wait for O^T at the end of a tile (2); 18: two consumer groups with 10's decode
    case 16: return p.heads <= kFewHeads ? launch_few3<1, 1, true, 1>(p, stream) : launch<5>(p, stream);
    case 17: return p.heads <= kFewHeads ? launch_few3<1, 1, true, 2>(p, stream) : launch<5>(p, stream);
    case 18: return p.heads <= kFewHeads ? launch_few3<2, 1>(p, stream) : launch<5>(p, stream);
    // 19: 18 with one wgmma batch in flight (kPipe 3); 20: 15's build with the same
    case 19: return p.heads <= kFewHeads ? launch_few3<2, 1, false, 3>(p, stream) : launch<5>(p, stream);
    case 20: return p.heads <= kFewHeads ? launch_few3<1, 1, true, 3>(p, stream) : launch<5>(p, stream);
    case 21:  // 15's kernel, its splits merged by combine_splits_kernel (21: PDL, 22: plain launch)
    case 22: return launch_few3_combine<1, 1, true, 0>(p, stream, p.variant == 21);
    // 23: 19's kernel + 21's combine; 24: + O^T's first k-step early (kPipe 4); 25: + the early
    // PDL trigger (kPipe 5)
    case 23: return launch_few3_combine<2, 1, false, 3>(p, stream, true);
    case 24: return launch_few3_combine<2, 1, false, 4>(p, stream, true);
    case 25: return launch_few3_combine<2, 1, false, 5>(p, stream, true);
    case 26: {  // 24's kernel at > 8 tiles a split, else 16's (one group); the CUDA combine at
                // 2..4 splits (more: kernels/cuda_decode.py runs the Triton one, 16 splits a step)
      if (p.heads > kFewHeads) return launch<5>(p, stream);
      const cudaError_t e = p.split_len > 8 * kTile ? launch_few3<2, 1, false, 4>(p, stream)
                                                     : launch_few3<1, 1, true, 1>(p, stream);
      const bool combine = p.nsplit > 1 && p.nsplit <= 4;
      return e != cudaSuccess || !combine ? e : launch_combine(p, stream, true);
    }
    // 29-32 (issue 51): more heads: the lean producer decode (29), + group 2 decoding dims
    // 256..511 (30), each with per-role wait clocks in p.counters (31, 32); few heads: 27
    // 33: 29 with softmax_lazy (group 1's softmax shortened, the rescale skipped where no row's
    // reference max moved)
    // 34: 29 above 2 tiles a split, else 5 (29's permuted Q and output cost ~1.3 us at 1 tile a
    // split: H64 B1 21.0 vs 19.7 us on the H200, issue 51 call 2); few heads: 27
    case 29:
    case 30:
    case 31:
    case 32:
    case 33:
    case 34:
    case 35:
    case 36:
    // 37 (issue 51, round 2): 36 above 2 tiles a split, else 5; 38: 37 with 38's kernel (36 with
    // the compact ends: Q by cp.async in rolled loops, the output staged in shared memory and
    // stored 16 bytes at a time); 39: 38's kernel with the ends' stamps (kernels/probe_pieces.py);
    // 40: 38 with group 1's next Q K^T issued right behind its P V; 41-43: 38 with the producer's
    // kQFirst, kIdxEarly, both; 44: 43's kernel with 39's stamps
    case 37:
    case 38:
    case 39:
    case 40:
    case 41:
    case 42:
    case 43:
    case 44: {
      if (p.variant == 34 && p.heads > kFewHeads)
        return p.split_len > 2 * kTile ? launch<29>(p, stream) : launch<5>(p, stream);
      if (p.variant != 39 && p.variant >= 37 && p.variant <= 43 && p.heads > kFewHeads) {
        if (p.split_len <= 2 * kTile) return launch<5>(p, stream);
        switch (p.variant) {
          case 37: return launch<36>(p, stream);
          case 38: return launch<38>(p, stream);
          case 40: return launch<40>(p, stream);
          case 41: return launch<41>(p, stream);
          case 42: return launch<42>(p, stream);
          default: return launch<43>(p, stream);
        }
      }
      if (p.heads > kFewHeads) {
        switch (p.variant) {
          case 44: return launch<44>(p, stream);
          case 39: return launch<39>(p, stream);
          case 29: return launch<29>(p, stream);
          case 33: return launch<33>(p, stream);
          case 35: return launch<35>(p, stream);
          case 36: return launch<36>(p, stream);
          case 30: return launch<30>(p, stream);
          case 31: return launch<31>(p, stream);
          default: return launch<32>(p, stream);
        }
      }
      DecodeParams q = p;
      q.variant = 27;
      q.counters = nullptr;
      return sparse_mla_decode_sm90(q, stream);
    }
    case 27:  // 26 with the two splits of a query merged by their cluster (no combine kernel)
    case 28: {  // 27 with the phases' clocks in p.counters (kernels/probe_pieces.py)
      if (p.heads > kFewHeads) return launch<5>(p, stream);
      const bool two = p.split_len > 8 * kTile;
      if (p.nsplit == 2 && p.variant == 27)
        return two ? launch_few3_pair<2, 1, false, 4, false>(p, stream)
                   : launch_few3_pair<1, 1, true, 1, false>(p, stream);
      if (p.nsplit == 2)
        return two ? launch_few3_pair<2, 1, false, 4, true>(p, stream)
                   : launch_few3_pair<1, 1, true, 1, true>(p, stream);
      const cudaError_t e = two ? launch_few3<2, 1, false, 4>(p, stream)
                                : launch_few3<1, 1, true, 1>(p, stream);
      const bool combine = p.nsplit > 1 && p.nsplit <= 4;
      return e != cudaSuccess || !combine ? e : launch_combine(p, stream, true);
    }
    default: return cudaErrorInvalidValue;
  }
}

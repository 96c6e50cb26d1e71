// NVFP4 sparse MLA decode for sm_90a: the launcher the torch binding calls (no torch here, so
// that nvcc alone can compile and report on the kernel).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

struct DecodeParams {
  const uint16_t* q;      // [B, H, 576] bf16
  const uint8_t* cache;   // rows of 352 bytes
  const int32_t* idx;     // [B, topk] flat slots, -1 = padding
  float* opart;           // [B, nsplit, H, 512] (splits > 1)
  float* lpart;           // [B, nsplit, H], log2 units (splits > 1)
  uint16_t* out;          // [B, H, 512] bf16 (one split)
  float* lse;             // [B, H], natural log (one split)
  int* counters;          // [B] zeros, variant 14's splits counted per query (nullptr: none)
  float qk_scale;         // sm_scale * log2(e)
  int heads, topk, split_len, nsplit, batch;
  int variant;            // consumer layout / producer options (decode_sm90.cu's header)
  int64_t stride_qb, stride_qh, stride_ib, stride_ob, stride_oh;  // in elements
};

// Dynamic shared memory the kernel needs (bytes).
int sparse_mla_decode_sm90_smem();
cudaError_t sparse_mla_decode_sm90(const DecodeParams& p, cudaStream_t stream);

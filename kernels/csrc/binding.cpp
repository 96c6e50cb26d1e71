// Torch binding of the sm_90a NVFP4 sparse MLA decode: checks shapes and hands raw pointers to
// the launcher in decode_sm90.cu. Split sizes and the combine live in kernels/cuda_decode.py.
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "decode_sm90.h"

void decode(const torch::Tensor& q, const torch::Tensor& cache, const torch::Tensor& indices,
            const torch::Tensor& opart, const torch::Tensor& lpart, const torch::Tensor& out,
            const torch::Tensor& lse, double qk_scale, int64_t split_len, int64_t nsplit,
            int64_t variant, const torch::Tensor& counters) {
  TORCH_CHECK(q.is_cuda() && q.scalar_type() == torch::kBFloat16 && q.dim() == 3 &&
              q.size(2) == 576 && q.stride(2) == 1 && q.stride(1) % 8 == 0 &&
              q.stride(0) % 8 == 0 &&
              reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0,
              "q: [B, H, 576] bf16, rows 16-byte aligned");
  TORCH_CHECK(cache.scalar_type() == torch::kUInt8 && cache.is_contiguous() &&
              cache.size(-1) == 352 && reinterpret_cast<uintptr_t>(cache.data_ptr()) % 16 == 0,
              "cache: contiguous NVFP4 rows of 352 bytes");
  TORCH_CHECK(indices.scalar_type() == torch::kInt32 && indices.dim() == 2 &&
              indices.stride(1) == 1, "indices: [B, topk] int32");
  TORCH_CHECK(out.scalar_type() == torch::kBFloat16 && out.stride(2) == 1 &&
              out.stride(1) % 2 == 0 && out.stride(0) % 2 == 0, "out: [B, H, 512] bf16");
  TORCH_CHECK(lse.scalar_type() == torch::kFloat32 && lse.is_contiguous(), "lse: [B, H] fp32");
  const int64_t batch = q.size(0), heads = q.size(1), topk = indices.size(1);
  TORCH_CHECK(indices.size(0) == batch && topk > 0 && split_len % 64 == 0 &&
              (nsplit - 1) * split_len < topk && nsplit * split_len >= topk,
              "splits must cover the top-k, none empty");
  TORCH_CHECK(nsplit == 1 || (opart.is_contiguous() && lpart.is_contiguous() &&
                              opart.numel() == batch * nsplit * heads * 512 &&
                              lpart.numel() == batch * nsplit * heads),
              "opart [B, nsplit, H, 512], lpart [B, nsplit, H] fp32");
  TORCH_CHECK(counters.numel() == 0 ||
              (counters.scalar_type() == torch::kInt32 && counters.is_cuda() &&
               counters.is_contiguous() && counters.numel() >= batch),
              "counters: empty, or [>= B] int32 zeros");
  DecodeParams p{};
  p.counters = counters.numel() == 0 ? nullptr : counters.data_ptr<int32_t>();
  p.q = reinterpret_cast<const uint16_t*>(q.data_ptr());
  p.cache = cache.data_ptr<uint8_t>();
  p.idx = indices.data_ptr<int32_t>();
  p.opart = nsplit == 1 ? nullptr : opart.data_ptr<float>();
  p.lpart = nsplit == 1 ? nullptr : lpart.data_ptr<float>();
  p.out = reinterpret_cast<uint16_t*>(out.data_ptr());
  p.lse = lse.data_ptr<float>();
  p.qk_scale = static_cast<float>(qk_scale);
  p.heads = static_cast<int>(heads);
  p.topk = static_cast<int>(topk);
  p.split_len = static_cast<int>(split_len);
  p.nsplit = static_cast<int>(nsplit);
  p.batch = static_cast<int>(batch);
  p.variant = static_cast<int>(variant);
  p.stride_qb = q.stride(0);
  p.stride_qh = q.stride(1);
  p.stride_ib = indices.stride(0);
  p.stride_ob = out.stride(0);
  p.stride_oh = out.stride(1);
  const cudaError_t err =
      sparse_mla_decode_sm90(p, c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
  TORCH_CHECK(err == cudaSuccess, "sparse_mla_decode_sm90: ", cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode", &decode, "NVFP4 sparse MLA decode, sm_90a (one split, fp32 partials, or partials merged by the last split)");
  m.def("smem_bytes", &sparse_mla_decode_sm90_smem, "dynamic shared memory per CTA");
}

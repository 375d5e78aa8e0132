// The DSA lightning indexer's scores I[b, s, t] = sum_j w[b, s, j] relu(scale <qi[b, s, j], ki[b, t]>),
// one warp per score: the lanes split each head's dot product (kernel_math.h), a warp sum
// completes it, and the heads' terms add in head order. Two launches: every key of every query
// (causally invisible keys -inf) for the top-k, and only the selected keys for the scores the
// indexer loss differentiates. The reference materializes [b, sq, nh, sk] fp32 per-head scores
// first; these write [b, sq, sk] (dense) or [b, sq, topk] and nothing else.
#include <cmath>

#include "dtype_access.cuh"
#include "kernels.h"

namespace lf::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct IndexerShape {
  int64_t b, sq, sk, nh, di;
  float scale;
};

template <class T>
__device__ float index_score(const T* qi, const T* ki, const T* w, int64_t bi, int64_t s, int64_t t,
                             const IndexerShape& sh, int lane) {
  float acc = 0.0f;
  for (int64_t j = 0; j < sh.nh; ++j) {
    const float dot = warp_sum(indexer_dot_partial(qi, ki, bi, s, j, t, sh.sq, sh.sk, sh.nh, sh.di, lane, 32));
    acc += indexer_head_term(w, bi, s, j, sh.sq, sh.nh, dot, sh.scale);
  }
  return acc;
}

// scores [b, sq, sk]: one warp per entry.
template <class T>
__global__ void dense_kernel(const T* __restrict__ qi, const T* __restrict__ ki, const T* __restrict__ w,
                             float* __restrict__ scores, IndexerShape sh) {
  const int lane = threadIdx.x % 32;
  const int64_t items = sh.b * sh.sq * sh.sk, warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t item = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32; item < items; item += warps) {
    const int64_t t = item % sh.sk, s = (item / sh.sk) % sh.sq, bi = item / (sh.sk * sh.sq);
    // The branch is uniform over the warp (one item per warp): the warp sums stay converged.
    const float v = indexer_visible(s, t, sh.sq, sh.sk) ? index_score(qi, ki, w, bi, s, t, sh, lane) : -INFINITY;
    if (lane == 0) scores[item] = v;
  }
}

// out [b, sq, topk]: the scores at indices [b, sq, topk] (-inf at -1 slots).
template <class T>
__global__ void selected_kernel(const T* __restrict__ qi, const T* __restrict__ ki, const T* __restrict__ w,
                                const int64_t* __restrict__ indices, float* __restrict__ out, int64_t topk,
                                IndexerShape sh) {
  const int lane = threadIdx.x % 32;
  const int64_t items = sh.b * sh.sq * topk, warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t item = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32; item < items; item += warps) {
    const int64_t t = indices[item], s = (item / topk) % sh.sq, bi = item / (topk * sh.sq);
    const float v = t >= 0 ? index_score(qi, ki, w, bi, s, t, sh, lane) : -INFINITY;
    if (lane == 0) out[item] = v;
  }
}

template <class T>
cudaError_t launch(const void* qi, const void* ki, const void* w, const int64_t* indices, float* out, int64_t topk,
                   const IndexerShape& sh, cudaStream_t s) {
  const auto* q = static_cast<const T*>(qi);
  const auto* k = static_cast<const T*>(ki);
  const auto* wt = static_cast<const T*>(w);
  if (indices == nullptr)
    dense_kernel<T><<<grid_for(sh.b * sh.sq * sh.sk, kWarps), kThreads, 0, s>>>(q, k, wt, out, sh);
  else
    selected_kernel<T><<<grid_for(sh.b * sh.sq * topk, kWarps), kThreads, 0, s>>>(q, k, wt, indices, out, topk, sh);
  return cudaGetLastError();
}

}  // namespace

cudaError_t dsa_index_scores(const void* qi, const void* ki, const void* w, const int64_t* indices, float* out,
                             int64_t b, int64_t sq, int64_t sk, int64_t nh, int64_t di, int64_t topk, float scale,
                             DType dtype, cudaStream_t stream) {
  if (b * sq * (indices == nullptr ? sk : topk) == 0) return cudaSuccess;
  const IndexerShape sh{b, sq, sk, nh, di, scale};
  switch (dtype) {
    case DType::f32: return launch<float>(qi, ki, w, indices, out, topk, sh, stream);
    case DType::bf16: return launch<__nv_bfloat16>(qi, ki, w, indices, out, topk, sh, stream);
    case DType::f16: return launch<__half>(qi, ki, w, indices, out, topk, sh, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace lf::cuda_kernels

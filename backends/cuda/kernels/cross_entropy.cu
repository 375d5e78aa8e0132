// The cross entropy's row kernels on a chunk of logits z [c, valid] (chunked_linear_cross_entropy
// calls them through CudaOps): one block per row, the threads striding over the columns
// (kernel_math.h: ce_*), block reductions in shared memory. Three passes over the chunk: the row
// max, then the target's shifted logit and the exp sum (each all-reduced over vocabulary shards by
// the caller in between), then dL/dz written over z in z's dtype.
#include "dtype_access.cuh"
#include "kernels.h"

namespace lf::cuda_kernels {
namespace {

constexpr int kThreads = 256;  // power of two: the tree reductions rely on it

// Tree reduction over the block; every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float o = shared[threadIdx.x + stride];
      shared[threadIdx.x] = kMax ? (o > shared[threadIdx.x] ? o : shared[threadIdx.x]) : shared[threadIdx.x] + o;
    }
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

template <class T>
__global__ void row_max_kernel(const T* __restrict__ z, float* __restrict__ m, int64_t valid) {
  __shared__ float shared[kThreads];
  const int64_t row = blockIdx.x;
  const float v = block_reduce<true>(ce_max_partial(z, row, valid, threadIdx.x, kThreads), shared);
  if (threadIdx.x == 0) m[row] = v;
}

// sums [2, c]: row 0 the target's z - m where mine, row 1 the exp sum.
template <class T>
__global__ void exp_sums_kernel(const T* __restrict__ z, const float* __restrict__ m, const int64_t* __restrict__ safe,
                                const bool* __restrict__ mine, float* __restrict__ sums, int64_t c, int64_t valid) {
  __shared__ float shared[kThreads];
  const int64_t row = blockIdx.x;
  const float s = block_reduce<false>(ce_exp_sum_partial(z, row, valid, m[row], threadIdx.x, kThreads), shared);
  if (threadIdx.x == 0) {
    sums[row] = mine[row] ? load(z, row * valid + safe[row]) - m[row] : 0.0f;
    sums[c + row] = s;
  }
}

template <class T>
__global__ void grad_kernel(T* __restrict__ z, const float* __restrict__ m, const float* __restrict__ sums,
                            const int64_t* __restrict__ safe, const bool* __restrict__ mine,
                            const float* __restrict__ wt, int64_t c, int64_t valid) {
  const int64_t row = blockIdx.x;
  const float mr = m[row], sum = sums[c + row], w = wt[row];
  const int64_t sr = safe[row];
  const bool row_mine = mine[row];
  for (int64_t j = threadIdx.x; j < valid; j += kThreads) ce_grad_item(z, row, j, valid, mr, sum, sr, row_mine, w);
}

template <class T>
cudaError_t launch(CeRowStep step, void* z, float* m, float* sums, const int64_t* safe, const bool* mine,
                   const float* wt, int64_t c, int64_t valid, cudaStream_t s) {
  const auto rows = static_cast<unsigned>(c);
  switch (step) {
    case CeRowStep::max: row_max_kernel<T><<<rows, kThreads, 0, s>>>(static_cast<const T*>(z), m, valid); break;
    case CeRowStep::exp_sums:
      exp_sums_kernel<T><<<rows, kThreads, 0, s>>>(static_cast<const T*>(z), m, safe, mine, sums, c, valid);
      break;
    case CeRowStep::grad:
      grad_kernel<T><<<rows, kThreads, 0, s>>>(static_cast<T*>(z), m, sums, safe, mine, wt, c, valid);
      break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t cross_entropy_rows(CeRowStep step, void* z, float* m, float* sums, const int64_t* safe, const bool* mine,
                               const float* wt, int64_t c, int64_t valid, DType dtype, cudaStream_t stream) {
  if (c == 0) return cudaSuccess;
  if (c > 0x7fffffff || valid <= 0) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::f32: return launch<float>(step, z, m, sums, safe, mine, wt, c, valid, stream);
    case DType::bf16: return launch<__nv_bfloat16>(step, z, m, sums, safe, mine, wt, c, valid, stream);
    case DType::f16: return launch<__half>(step, z, m, sums, safe, mine, wt, c, valid, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace lf::cuda_kernels

// Multi-tensor kernels of the optimizer step: AdamW over every parameter of a list in one launch,
// and the fp64 sum of squares of a list of tensors (the gradient norm) in one launch plus a fixed
// order sum of the per-block partials. The host passes a table of the tensors' pointers and
// sizes and a table of chunks (tensor, first element), both int64 on the device; each block takes
// one chunk. Replaces the reference's nine ATen launches per parameter (AdamW) and one reduction
// per tensor (norm).
#include "dtype_access.cuh"
#include "kernels.h"

namespace lf::cuda_kernels {
namespace {

constexpr int kThreads = 256;  // power of two: the tree reduction relies on it

template <class G>
__global__ void adamw_kernel(const int64_t* __restrict__ table, const int64_t* __restrict__ chunks, int64_t chunk,
                             AdamWConsts k) {
  const int64_t t = chunks[2 * blockIdx.x], first = chunks[2 * blockIdx.x + 1];
  const int64_t* row = table + 5 * t;
  auto* p = reinterpret_cast<float*>(row[0]);
  const auto* g = reinterpret_cast<const G*>(row[1]);
  auto* m = reinterpret_cast<float*>(row[2]);
  auto* v = reinterpret_cast<float*>(row[3]);
  const int64_t end = first + chunk < row[4] ? first + chunk : row[4];
  for (int64_t i = first + threadIdx.x; i < end; i += blockDim.x) adamw_item(p, g, m, v, i, k);
}

template <class T>
__device__ double square_sum(const void* base, int64_t first, int64_t end) {
  return square_sum_partial(static_cast<const T*>(base), first, end, threadIdx.x, blockDim.x);
}

// table rows: (pointer, numel, dtype code); partial[b]: chunk b's sum of squares.
__global__ void square_sum_kernel(const int64_t* __restrict__ table, const int64_t* __restrict__ chunks,
                                  int64_t chunk, double* __restrict__ partial) {
  __shared__ double shared[kThreads];
  const int64_t t = chunks[2 * blockIdx.x], first = chunks[2 * blockIdx.x + 1];
  const int64_t* row = table + 3 * t;
  const void* base = reinterpret_cast<const void*>(row[0]);
  const int64_t end = first + chunk < row[1] ? first + chunk : row[1];
  double acc = 0.0;
  switch (static_cast<DType>(row[2])) {
    case DType::f32: acc = square_sum<float>(base, first, end); break;
    case DType::bf16: acc = square_sum<__nv_bfloat16>(base, first, end); break;
    case DType::f16: acc = square_sum<__half>(base, first, end); break;
  }
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

}  // namespace

cudaError_t adamw_multi(const int64_t* table, const int64_t* chunks, int64_t num_chunks, int64_t chunk,
                        const AdamWConsts& k, DType grad_dtype, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  if (num_chunks > 0x7fffffff) return cudaErrorInvalidValue;
  const auto blocks = static_cast<unsigned>(num_chunks);
  switch (grad_dtype) {
    case DType::f32: adamw_kernel<float><<<blocks, kThreads, 0, stream>>>(table, chunks, chunk, k); break;
    case DType::bf16: adamw_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(table, chunks, chunk, k); break;
    case DType::f16: adamw_kernel<__half><<<blocks, kThreads, 0, stream>>>(table, chunks, chunk, k); break;
  }
  return cudaGetLastError();
}

cudaError_t square_sum_multi(const int64_t* table, const int64_t* chunks, int64_t num_chunks, int64_t chunk,
                             double* partial, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  if (num_chunks > 0x7fffffff) return cudaErrorInvalidValue;
  square_sum_kernel<<<static_cast<unsigned>(num_chunks), kThreads, 0, stream>>>(table, chunks, chunk, partial);
  return cudaGetLastError();
}

}  // namespace lf::cuda_kernels

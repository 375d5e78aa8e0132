// RMSNorm forward: one block per row; each thread accumulates x^2 over a strided slice of the
// row in fp32, a shared-memory tree reduces the block, then every thread writes its slice of
// y = x * rstd * w.
// Backward: each block takes a range of rows; per row, a tree reduces sum(g xhat) (g = dy w,
// xhat = x rstd), then dx = rstd (g - xhat mean(g xhat)); each thread adds dy xhat of its columns
// into the block's own row of an fp32 [row blocks, h] partial, which the caller sums over the
// blocks (a fixed order: no atomics) for dw.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dtype_access.cuh"
#include "kernels.h"

namespace lf::cuda_kernels {
namespace {

constexpr int kThreads = 256;  // power of two: the tree reduction below relies on it


template <class T>
__global__ void rms_norm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                    T* __restrict__ y, float* __restrict__ rstd, int64_t h,
                                    float eps) {
  __shared__ float partial[kThreads];
  const int64_t row = blockIdx.x;
  partial[threadIdx.x] = rms_square_partial(x, row, h, threadIdx.x, kThreads);
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float r = rms_rstd(partial[0], h, eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int64_t i = threadIdx.x; i < h; i += kThreads) rms_norm_fwd_item(x, w, y, row, i, h, r);
}

__device__ float block_sum(float v, float* partial) {
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float total = partial[0];
  __syncthreads();  // partial is reused by the next row
  return total;
}

template <class T>
__global__ void rms_norm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                    const float* __restrict__ rstd, T* __restrict__ dx,
                                    float* __restrict__ dw_partial, int64_t rows, int64_t h,
                                    int64_t rows_per_block) {
  __shared__ float partial[kThreads];
  const int64_t first = blockIdx.x * rows_per_block;
  const int64_t end = first + rows_per_block < rows ? first + rows_per_block : rows;
  float* dwp = dw_partial + blockIdx.x * h;
  for (int64_t i = threadIdx.x; i < h; i += kThreads) dwp[i] = 0.0f;
  for (int64_t row = first; row < end; ++row) {
    const float r = rstd[row];
    const float mean =
        block_sum(rms_bwd_dot_partial(dy, x, w, row, h, r, threadIdx.x, kThreads), partial) / static_cast<float>(h);
    for (int64_t i = threadIdx.x; i < h; i += kThreads) rms_norm_bwd_item(dy, x, w, dx, dwp, row, i, h, r, mean);
  }
}

template <class T>
cudaError_t launch_bwd(const void* dy, const void* x, const void* w, const float* rstd, void* dx, float* dw_partial,
                       int64_t rows, int64_t h, int64_t row_blocks, cudaStream_t s) {
  const int64_t per = (rows + row_blocks - 1) / row_blocks;
  rms_norm_bwd_kernel<T><<<static_cast<unsigned>(row_blocks), kThreads, 0, s>>>(
      static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(w), rstd, static_cast<T*>(dx),
      dw_partial, rows, h, per);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t h,
                   float eps, cudaStream_t s) {
  rms_norm_fwd_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), rstd, h, eps);
  return cudaGetLastError();
}

}  // namespace

cudaError_t rms_norm_fwd(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                         int64_t h, float eps, DType dtype, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;  // grid.x limit
  switch (dtype) {
    case DType::f32: return launch<float>(x, w, y, rstd, rows, h, eps, stream);
    case DType::bf16: return launch<__nv_bfloat16>(x, w, y, rstd, rows, h, eps, stream);
    case DType::f16: return launch<__half>(x, w, y, rstd, rows, h, eps, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t rms_norm_bwd(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                         float* dw_partial, int64_t rows, int64_t h, int64_t row_blocks, DType dtype,
                         cudaStream_t stream) {
  if (row_blocks <= 0 || row_blocks > 0x7fffffff) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::f32: return launch_bwd<float>(dy, x, w, rstd, dx, dw_partial, rows, h, row_blocks, stream);
    case DType::bf16: return launch_bwd<__nv_bfloat16>(dy, x, w, rstd, dx, dw_partial, rows, h, row_blocks, stream);
    case DType::f16: return launch_bwd<__half>(dy, x, w, rstd, dx, dw_partial, rows, h, row_blocks, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace lf::cuda_kernels

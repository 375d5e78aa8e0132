// RMSNorm forward: one block per row; each thread accumulates x^2 over a strided slice of the
// row in fp32, a shared-memory tree reduces the block, then every thread writes its slice of
// y = x * rstd * w. The backward stays on the reference (ATen) until it is worth a kernel.
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
  const T* xr = x + row * h;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += kThreads) {
    const float v = load(xr, i);
    sum += v * v;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float r = rsqrtf(partial[0] / static_cast<float>(h) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int64_t i = threadIdx.x; i < h; i += kThreads)
    store(y, row * h + i, load(xr, i) * r * load(w, i));
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

}  // namespace lf::cuda_kernels

// Fused SwiGLU forward and backward: one thread per output element of a [rows, f] grid, reading
// gate and up from the two halves of each gate_up row (kernel_math.h: swiglu_*_item).
// Elementwise and memory-bound, so the only gain over ATen is reading gate_up once and writing
// once; math in fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dtype_access.cuh"
#include "kernels.h"

namespace lf::cuda_kernels {
namespace {


template <class T>
__global__ void swiglu_fwd_kernel(const T* __restrict__ gu, T* __restrict__ y, int64_t rows,
                                  int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    swiglu_fwd_item(gu, y, i, f);
}

template <class T>
__global__ void swiglu_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ gu,
                                  T* __restrict__ dgu, int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    swiglu_bwd_item(dy, gu, dgu, i, f);
}

template <class T>
cudaError_t launch_fwd(const void* gu, void* y, int64_t rows, int64_t f, cudaStream_t s) {
  swiglu_fwd_kernel<T><<<grid_for(rows * f, 256), 256, 0, s>>>(static_cast<const T*>(gu),
                                                                 static_cast<T*>(y), rows, f);
  return cudaGetLastError();
}
template <class T>
cudaError_t launch_bwd(const void* dy, const void* gu, void* dgu, int64_t rows, int64_t f,
                       cudaStream_t s) {
  swiglu_bwd_kernel<T><<<grid_for(rows * f, 256), 256, 0, s>>>(
      static_cast<const T*>(dy), static_cast<const T*>(gu), static_cast<T*>(dgu), rows, f);
  return cudaGetLastError();
}

}  // namespace

cudaError_t swiglu_fwd(const void* gate_up, void* y, int64_t rows, int64_t f, DType dtype,
                       cudaStream_t stream) {
  if (rows * f == 0) return cudaSuccess;
  switch (dtype) {
    case DType::f32: return launch_fwd<float>(gate_up, y, rows, f, stream);
    case DType::bf16: return launch_fwd<__nv_bfloat16>(gate_up, y, rows, f, stream);
    case DType::f16: return launch_fwd<__half>(gate_up, y, rows, f, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t swiglu_bwd(const void* dy, const void* gate_up, void* dgate_up, int64_t rows,
                       int64_t f, DType dtype, cudaStream_t stream) {
  if (rows * f == 0) return cudaSuccess;
  switch (dtype) {
    case DType::f32: return launch_bwd<float>(dy, gate_up, dgate_up, rows, f, stream);
    case DType::bf16: return launch_bwd<__nv_bfloat16>(dy, gate_up, dgate_up, rows, f, stream);
    case DType::f16: return launch_bwd<__half>(dy, gate_up, dgate_up, rows, f, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace lf::cuda_kernels

// RoPE forward and backward in one kernel: one thread per rotated pair or passed-through element
// of each [d] row (kernel_math.h: rope_item), cos/sin in fp32, math in fp32. Reads x once and
// writes y once, where the reference's ATen ops make five passes and two temporaries.
#include "dtype_access.cuh"
#include "kernels.h"

namespace lf::cuda_kernels {
namespace {

template <class T>
__global__ void rope_kernel(const T* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
                            T* __restrict__ y, int64_t items, int64_t per_pos, int64_t d, int64_t r,
                            bool interleaved, bool transpose) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    rope_item(x, cos, sin, y, i, per_pos, d, r, interleaved, transpose);
}

template <class T>
cudaError_t launch(const void* x, const float* cos, const float* sin, void* y, int64_t items, int64_t per_pos,
                   int64_t d, int64_t r, bool interleaved, bool transpose, cudaStream_t s) {
  rope_kernel<T><<<grid_for(items, 256), 256, 0, s>>>(static_cast<const T*>(x), cos, sin, static_cast<T*>(y),
                                                      items, per_pos, d, r, interleaved, transpose);
  return cudaGetLastError();
}

}  // namespace

cudaError_t rope(const void* x, const float* cos, const float* sin, void* y, int64_t rows, int64_t per_pos,
                 int64_t d, int64_t r, bool interleaved, bool transpose, DType dtype, cudaStream_t stream) {
  const int64_t items = rows * rope_items_per_row(d, r);
  if (items == 0) return cudaSuccess;
  switch (dtype) {
    case DType::f32: return launch<float>(x, cos, sin, y, items, per_pos, d, r, interleaved, transpose, stream);
    case DType::bf16:
      return launch<__nv_bfloat16>(x, cos, sin, y, items, per_pos, d, r, interleaved, transpose, stream);
    case DType::f16: return launch<__half>(x, cos, sin, y, items, per_pos, d, r, interleaved, transpose, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace lf::cuda_kernels

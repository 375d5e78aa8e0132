// What cuda_ops.cpp and cuda_train_ops.cpp share to call kernels/: the kernels' storage type of
// an ATen dtype, the launch check and the current stream. Private to the CUDA module.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "kernels/kernels.h"
#include "loongforge/core/error.h"

namespace lf::backend::cuda {

inline std::optional<cuda_kernels::DType> kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return cuda_kernels::DType::f32;
    case at::kBFloat16: return cuda_kernels::DType::bf16;
    case at::kHalf: return cuda_kernels::DType::f16;
    default: return std::nullopt;
  }
}

inline void check_launch(cudaError_t err, const char* kernel) {
  LF_CHECK(err == cudaSuccess, "CUDA kernel ", kernel, " failed to launch: ", cudaGetErrorString(err),
           lf::hint("the module is built for LOONGFORGE_CUDA_ARCHS (default sm_80 and sm_90); check the GPU"));
}

inline cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

}  // namespace lf::backend::cuda

// Launch wrappers of the CUDA backend's hand-written kernels: raw device pointers, sizes and a
// stream, no LibTorch types, so the .cu files compile with nvcc alone. Callers (cuda_ops.cpp)
// pass contiguous tensors and check the returned cudaError_t. Not an op table: the math and
// its fallbacks are decided in cuda_ops.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lf::cuda_kernels {

enum class DType : int { f32 = 0, bf16 = 1, f16 = 2 };

// gate_up: [rows, 2f] (gate | up), y: [rows, f]; math in fp32.
cudaError_t swiglu_fwd(const void* gate_up, void* y, int64_t rows, int64_t f, DType dtype,
                       cudaStream_t stream);
// dy: [rows, f] -> dgate_up: [rows, 2f]
cudaError_t swiglu_bwd(const void* dy, const void* gate_up, void* dgate_up, int64_t rows,
                       int64_t f, DType dtype, cudaStream_t stream);

// x: [rows, h], w: [h] (same dtype as x), y: [rows, h], rstd: [rows] fp32. One block per row.
cudaError_t rms_norm_fwd(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                         int64_t h, float eps, DType dtype, cudaStream_t stream);

}  // namespace lf::cuda_kernels

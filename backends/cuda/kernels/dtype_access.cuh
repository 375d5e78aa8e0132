// Element access in fp32 for the kernels' storage types (fp32, bf16, fp16): every kernel computes
// in fp32 and converts on load and store. Device helpers only; no LibTorch headers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace lf::cuda_kernels {

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ inline void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }
__device__ inline void store(__half* p, int64_t i, float v) { p[i] = __float2half(v); }

}  // namespace lf::cuda_kernels

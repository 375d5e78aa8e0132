// Device helpers of the kernels. Element access in fp32 for the storage types (fp32, bf16, fp16:
// every kernel computes in fp32 and converts on load and store) is in kernel_math.h, shared with
// the host tests; no LibTorch headers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernel_math.h"

namespace lf::cuda_kernels {

// A grid-stride loop's grid for n items: at most 65535 * 8 blocks.
inline int grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

// Sum over the 32 lanes of a warp; every lane gets the total.
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace lf::cuda_kernels

// MoE token (un)permutation kernels (kernel_math.h has each item's math):
// - unpermute forward: one thread per output element sums its token's k slots in fp32, reading
//   the experts' rows in place (the reference gathers an [n, k, h] fp32 copy first);
// - unpermute backward: one thread per (slot, column) writes dy; one warp per slot reduces
//   dprobs = <dout[t], y[row]>;
// - permute backward: one thread per (token, column) sums the token's permuted rows, found
//   through a token-ordered row list, so the sum has a fixed order (no atomics).
#include "dtype_access.cuh"
#include "kernels.h"

namespace lf::cuda_kernels {
namespace {

constexpr int kThreads = 256;

template <class T, class P>
__global__ void unpermute_fwd_kernel(const T* __restrict__ y, const int64_t* __restrict__ position,
                                     const P* __restrict__ probs, T* __restrict__ out, int64_t items, int64_t k,
                                     int64_t h) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    unpermute_fwd_item(y, position, probs, out, i, k, h);
}

template <class T, class P>
__global__ void unpermute_bwd_dy_kernel(const T* __restrict__ dout, const int64_t* __restrict__ position,
                                        const P* __restrict__ probs, T* __restrict__ dy, int64_t items, int64_t k,
                                        int64_t h) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    unpermute_bwd_dy_item(dout, position, probs, dy, i, k, h);
}

// One warp per slot (kThreads / 32 slots per block).
template <class T, class P>
__global__ void unpermute_dprobs_kernel(const T* __restrict__ dout, const T* __restrict__ y,
                                        const int64_t* __restrict__ position, P* __restrict__ dprobs, int64_t slots,
                                        int64_t k, int64_t h) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t slot = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; slot < slots;
       slot += warps) {
    const float total = warp_sum(unpermute_dprobs_partial(dout, y, position, slot, k, h, lane, 32));
    if (lane == 0) store(dprobs, slot, total);
  }
}

template <class T>
__global__ void permute_bwd_kernel(const T* __restrict__ dpermuted, const int64_t* __restrict__ rows,
                                   const int64_t* __restrict__ first, T* __restrict__ dx, int64_t items, int64_t h) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    permute_bwd_item(dpermuted, rows, first, dx, i, h);
}

template <class T, class P>
cudaError_t launch_unpermute_fwd(const void* y, const int64_t* position, const void* probs, void* out, int64_t n,
                                 int64_t k, int64_t h, cudaStream_t s) {
  unpermute_fwd_kernel<T, P><<<grid_for(n * h, kThreads), kThreads, 0, s>>>(
      static_cast<const T*>(y), position, static_cast<const P*>(probs), static_cast<T*>(out), n * h, k, h);
  return cudaGetLastError();
}

template <class T, class P>
cudaError_t launch_unpermute_bwd(const void* dout, const void* y, const int64_t* position, const void* probs,
                                 void* dy, void* dprobs, int64_t n, int64_t k, int64_t h, cudaStream_t s) {
  unpermute_bwd_dy_kernel<T, P><<<grid_for(n * k * h, kThreads), kThreads, 0, s>>>(
      static_cast<const T*>(dout), position, static_cast<const P*>(probs), static_cast<T*>(dy), n * k * h, k, h);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  unpermute_dprobs_kernel<T, P><<<grid_for(n * k, kThreads / 32), kThreads, 0, s>>>(
      static_cast<const T*>(dout), static_cast<const T*>(y), position, static_cast<P*>(dprobs), n * k, k, h);
  return cudaGetLastError();
}

// Calls f.template run<T, P>() for the storage types of y (T) and probs (P).
template <class F>
cudaError_t dispatch2(DType a, DType b, const F& f) {
  auto inner = [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    switch (b) {
      case DType::f32: return f.template run<T, float>();
      case DType::bf16: return f.template run<T, __nv_bfloat16>();
      case DType::f16: return f.template run<T, __half>();
    }
    return cudaErrorInvalidValue;
  };
  switch (a) {
    case DType::f32: return inner(float{});
    case DType::bf16: return inner(__nv_bfloat16{});
    case DType::f16: return inner(__half{});
  }
  return cudaErrorInvalidValue;
}

struct UnpermuteFwd {
  const void *y, *probs;
  const int64_t* position;
  void* out;
  int64_t n, k, h;
  cudaStream_t s;
  template <class T, class P>
  cudaError_t run() const { return launch_unpermute_fwd<T, P>(y, position, probs, out, n, k, h, s); }
};

struct UnpermuteBwd {
  const void *dout, *y, *probs;
  const int64_t* position;
  void *dy, *dprobs;
  int64_t n, k, h;
  cudaStream_t s;
  template <class T, class P>
  cudaError_t run() const { return launch_unpermute_bwd<T, P>(dout, y, position, probs, dy, dprobs, n, k, h, s); }
};

}  // namespace

cudaError_t moe_unpermute_fwd(const void* y, const int64_t* position, const void* probs, void* out, int64_t n,
                              int64_t k, int64_t h, DType y_dtype, DType probs_dtype, cudaStream_t stream) {
  if (n * h == 0) return cudaSuccess;
  return dispatch2(y_dtype, probs_dtype, UnpermuteFwd{y, probs, position, out, n, k, h, stream});
}

cudaError_t moe_unpermute_bwd(const void* dout, const void* y, const int64_t* position, const void* probs, void* dy,
                              void* dprobs, int64_t n, int64_t k, int64_t h, DType y_dtype, DType probs_dtype,
                              cudaStream_t stream) {
  if (n * k == 0) return cudaSuccess;
  return dispatch2(y_dtype, probs_dtype, UnpermuteBwd{dout, y, probs, position, dy, dprobs, n, k, h, stream});
}

cudaError_t moe_permute_bwd(const void* dpermuted, const int64_t* rows, const int64_t* first, void* dx, int64_t n,
                            int64_t h, DType dtype, cudaStream_t stream) {
  if (n * h == 0) return cudaSuccess;
  const int grid = grid_for(n * h, kThreads);
  switch (dtype) {
    case DType::f32:
      permute_bwd_kernel<float><<<grid, kThreads, 0, stream>>>(static_cast<const float*>(dpermuted), rows, first,
                                                              static_cast<float*>(dx), n * h, h);
      break;
    case DType::bf16:
      permute_bwd_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(dpermuted), rows, first, static_cast<__nv_bfloat16*>(dx), n * h, h);
      break;
    case DType::f16:
      permute_bwd_kernel<__half><<<grid, kThreads, 0, stream>>>(static_cast<const __half*>(dpermuted), rows, first,
                                                               static_cast<__half*>(dx), n * h, h);
      break;
  }
  return cudaGetLastError();
}

}  // namespace lf::cuda_kernels

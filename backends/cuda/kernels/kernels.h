// Launch wrappers of the CUDA backend's hand-written kernels: raw device pointers, sizes and a
// stream, no LibTorch types, so the .cu files compile with nvcc alone. Callers (cuda_ops.cpp)
// pass contiguous tensors and check the returned cudaError_t. Not an op table: the math and
// its fallbacks are decided in cuda_ops.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernel_math.h"  // AdamWConsts

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

// dy, x: [rows, h], w: [h], rstd: [rows] fp32 (the forward's) -> dx [rows, h]; dw_partial: fp32
// [row_blocks, h], one row per block of rows (1 <= row_blocks <= rows), summed by the caller.
cudaError_t rms_norm_bwd(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                         float* dw_partial, int64_t rows, int64_t h, int64_t row_blocks, DType dtype,
                         cudaStream_t stream);

// The cross entropy's row passes over a chunk of logits z [c, valid] (z's dtype; m [c], sums [2, c],
// wt [c] fp32; safe [c] int64; mine [c] bool): max writes m; exp_sums writes sums (row 0 the
// target's z - m where mine, row 1 sum exp(z - m)); grad writes dL/dz over z.
enum class CeRowStep : int { max, exp_sums, grad };
cudaError_t cross_entropy_rows(CeRowStep step, void* z, float* m, float* sums, const int64_t* safe, const bool* mine,
                               const float* wt, int64_t c, int64_t valid, DType dtype, cudaStream_t stream);

// RoPE over x [rows, d] (rows = s * per_pos) with cos, sin [s, r] fp32 -> y [rows, d]; transpose:
// the backward (kernel_math.h: rope_item).
cudaError_t rope(const void* x, const float* cos, const float* sin, void* y, int64_t rows, int64_t per_pos,
                 int64_t d, int64_t r, bool interleaved, bool transpose, DType dtype, cudaStream_t stream);

// AdamW over a list of fp32 parameters. table: [tensors, 5] int64 on the device (param, grad,
// exp_avg, exp_avg_sq pointers, numel); chunks: [num_chunks, 2] int64 (tensor, first element),
// each covering `chunk` elements (fewer at a tensor's end). Every grad has grad_dtype.
cudaError_t adamw_multi(const int64_t* table, const int64_t* chunks, int64_t num_chunks, int64_t chunk,
                        const AdamWConsts& k, DType grad_dtype, cudaStream_t stream);
// Sum of squares in fp64. table: [tensors, 3] int64 (pointer, numel, DType); chunks as above;
// partial: [num_chunks] fp64, chunk i's sum.
cudaError_t square_sum_multi(const int64_t* table, const int64_t* chunks, int64_t num_chunks, int64_t chunk,
                             double* partial, cudaStream_t stream);

// MoE. y: [m, h], position, probs: [n, k] -> out [n, h] (y's dtype).
cudaError_t moe_unpermute_fwd(const void* y, const int64_t* position, const void* probs, void* out, int64_t n,
                              int64_t k, int64_t h, DType y_dtype, DType probs_dtype, cudaStream_t stream);
// dout: [n, h] -> dy [m, h] (rows no slot owns are left as they are: zero them first), dprobs [n, k]
// (probs' dtype; 0 at dropped slots).
cudaError_t moe_unpermute_bwd(const void* dout, const void* y, const int64_t* position, const void* probs, void* dy,
                              void* dprobs, int64_t n, int64_t k, int64_t h, DType y_dtype, DType probs_dtype,
                              cudaStream_t stream);
// dpermuted: [m, h]; rows: [m] permuted row ids in token order; first: [n + 1] offsets -> dx [n, h].
cudaError_t moe_permute_bwd(const void* dpermuted, const int64_t* rows, const int64_t* first, void* dx, int64_t n,
                            int64_t h, DType dtype, cudaStream_t stream);

// DSA indexer scores (fp32). indices == nullptr: every key, out [b, sq, sk] with causally
// invisible keys -inf; else the keys of indices [b, sq, topk], out [b, sq, topk] (-inf at -1).
// qi [b, sq, nh, di], ki [b, sk, di], w [b, sq, nh], all of dtype.
cudaError_t dsa_index_scores(const void* qi, const void* ki, const void* w, const int64_t* indices, float* out,
                             int64_t b, int64_t sq, int64_t sk, int64_t nh, int64_t di, int64_t topk, float scale,
                             DType dtype, cudaStream_t stream);

}  // namespace lf::cuda_kernels

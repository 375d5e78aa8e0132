// The per-item math of the CUDA kernels, as host + device functions: each kernel's thread (or
// warp lane) calls one of these for its item, and tests/backend/test_cuda_kernel_math.cpp calls
// the same functions on the host over every item of a grid, against the CPU reference. So the
// index arithmetic and the formulas of the kernels are checked on every machine; what only a GPU
// checks (tools/gpu-check, the op harness) is the launch, the warp reductions and the dtypes
// other than fp32. Plain C++ without CUDA headers when a host compiler includes it.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define LF_HD __host__ __device__ __forceinline__
#else
#define LF_HD inline
#endif

namespace lf::cuda_kernels {

LF_HD float load(const float* p, int64_t i) { return p[i]; }
LF_HD void store(float* p, int64_t i, float v) { p[i] = v; }
#if defined(__CUDACC__)
// Declared before the item templates below so that they find them.
LF_HD float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
LF_HD float load(const __half* p, int64_t i) { return __half2float(p[i]); }
LF_HD void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }
LF_HD void store(__half* p, int64_t i, float v) { p[i] = __float2half(v); }
#endif

// ---- RMSNorm (OpTable::rms_norm_fwd / rms_norm_bwd) ------------------------------------------
// Row `row` of x [rows, h]; thread tid of `threads` takes columns tid, tid + threads, .. and the
// threads' partials are summed (a block reduction on the GPU).
template <class T>
LF_HD float rms_square_partial(const T* x, int64_t row, int64_t h, int tid, int threads) {
  float s = 0.0f;
  for (int64_t i = tid; i < h; i += threads) {
    const float v = load(x, row * h + i);
    s += v * v;
  }
  return s;
}
// rstd = rsqrt(sum(x^2) / h + eps) from the row's summed partials.
LF_HD float rms_rstd(float square_sum, int64_t h, float eps) {
  return 1.0f / std::sqrt(square_sum / static_cast<float>(h) + eps);
}
// y = x rstd w at (row, i).
template <class T>
LF_HD void rms_norm_fwd_item(const T* x, const T* w, T* y, int64_t row, int64_t i, int64_t h, float rstd) {
  store(y, row * h + i, load(x, row * h + i) * rstd * load(w, i));
}
// The backward's row sum: sum_i dy_i w_i xhat_i (xhat = x rstd), thread tid's share.
template <class T>
LF_HD float rms_bwd_dot_partial(const T* dy, const T* x, const T* w, int64_t row, int64_t h, float rstd, int tid,
                                int threads) {
  float s = 0.0f;
  for (int64_t i = tid; i < h; i += threads) s += load(dy, row * h + i) * load(w, i) * (load(x, row * h + i) * rstd);
  return s;
}
// dx = rstd (dy w - xhat mean) at (row, i), mean = the row sum / h; adds dy xhat into the block's
// fp32 dw partial row `dw_row`.
template <class T>
LF_HD void rms_norm_bwd_item(const T* dy, const T* x, const T* w, T* dx, float* dw_row, int64_t row, int64_t i,
                             int64_t h, float rstd, float mean) {
  const float xhat = load(x, row * h + i) * rstd, d = load(dy, row * h + i);
  store(dx, row * h + i, rstd * (d * load(w, i) - xhat * mean));
  dw_row[i] += d * xhat;
}

// ---- SwiGLU (OpTable::swiglu_fwd / swiglu_bwd) -----------------------------------------------
// Item i of [rows, f]; gate_up rows are [gate (f) | up (f)].
template <class T>
LF_HD void swiglu_fwd_item(const T* gu, T* y, int64_t i, int64_t f) {
  const int64_t r = i / f, c = i % f;
  const float g = load(gu, r * 2 * f + c), u = load(gu, r * 2 * f + f + c);
  store(y, i, g / (1.0f + std::exp(-g)) * u);
}
// dgate = dy u sig (1 + g (1 - sig)), dup = dy g sig.
template <class T>
LF_HD void swiglu_bwd_item(const T* dy, const T* gu, T* dgu, int64_t i, int64_t f) {
  const int64_t r = i / f, c = i % f;
  const float g = load(gu, r * 2 * f + c), u = load(gu, r * 2 * f + f + c), d = load(dy, i);
  const float sig = 1.0f / (1.0f + std::exp(-g));
  store(dgu, r * 2 * f + c, d * u * sig * (1.0f + g * (1.0f - sig)));
  store(dgu, r * 2 * f + f + c, d * g * sig);
}

// ---- RoPE (OpTable::rope_fwd / rope_bwd) -----------------------------------------------------
// x, y: [rows, d] with rows = s * per_pos (per_pos = b * n); cos, sin: [s, r] fp32. Each row has
// r / 2 rotated pairs and d - r passed-through elements: rope_items_per_row items.
LF_HD int64_t rope_items_per_row(int64_t d, int64_t r) { return r / 2 + (d - r); }

// Item `item` of the [rows x rope_items_per_row] grid. A pair (lo, hi) is (i, i + r/2) for the
// halves layout, (2i, 2i + 1) interleaved. Forward: y = x cos + R(x) sin with R(x)_lo = -x_hi,
// R(x)_hi = x_lo; backward (transpose): dx = dy cos - R(dy sin).
template <class T>
LF_HD void rope_item(const T* x, const float* cos, const float* sin, T* y, int64_t item, int64_t per_pos,
                     int64_t d, int64_t r, bool interleaved, bool transpose) {
  const int64_t q = r / 2, per_row = q + (d - r);
  const int64_t row = item / per_row, k = item % per_row;
  const T* xr = x + row * d;
  T* yr = y + row * d;
  if (k >= q) {
    const int64_t j = r + (k - q);
    store(yr, j, load(xr, j));
    return;
  }
  const int64_t lo = interleaved ? 2 * k : k, hi = interleaved ? 2 * k + 1 : k + q;
  const int64_t pos = row / per_pos;
  const float* c = cos + pos * r;
  const float* s = sin + pos * r;
  const float a = load(xr, lo), b = load(xr, hi);
  if (transpose) {
    store(yr, lo, a * c[lo] + b * s[hi]);
    store(yr, hi, b * c[hi] - a * s[lo]);
  } else {
    store(yr, lo, a * c[lo] - b * s[lo]);
    store(yr, hi, b * c[hi] + a * s[hi]);
  }
}

// ---- Cross entropy rows (chunked_linear_cross_entropy's CrossEntropyRowOps) ------------------
// z: a chunk of logits [c, valid]; thread tid of `threads` takes columns tid, tid + threads, .. of
// a row, and the threads' partials are then combined (max / sum; a block reduction on the GPU).
template <class T>
LF_HD float ce_max_partial(const T* z, int64_t row, int64_t valid, int tid, int threads) {
  float m = -INFINITY;
  for (int64_t j = tid; j < valid; j += threads) {
    const float e = load(z, row * valid + j);
    m = e > m ? e : m;
  }
  return m;
}

template <class T>
LF_HD float ce_exp_sum_partial(const T* z, int64_t row, int64_t valid, float m, int tid, int threads) {
  float s = 0.0f;
  for (int64_t j = tid; j < valid; j += threads) s += std::exp(load(z, row * valid + j) - m);
  return s;
}

// Element (row, j): z := wt (exp(z - m) / sum - [j == safe and mine]).
template <class T>
LF_HD void ce_grad_item(T* z, int64_t row, int64_t j, int64_t valid, float m, float sum, int64_t safe, bool mine,
                        float wt) {
  const float p = std::exp(load(z, row * valid + j) - m) / sum;
  store(z, row * valid + j, wt * (p - (mine && j == safe ? 1.0f : 0.0f)));
}

// ---- AdamW (OpTable::adamw_step) -------------------------------------------------------------
// The update's constants, computed once on the host in the reference's precision.
struct AdamWConsts {
  float grad_scale, decay;  // decay = 1 - lr * weight_decay (applied when decays)
  bool decays;
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bc2_sqrt;   // sqrt(1 - beta2^step)
  float eps;
  float step_size;  // -lr / (1 - beta1^step)
};

// Element i of one tensor, in the reference's order: g *= scale; p *= decay; m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p += step_size * m / (sqrt(v) / bc2_sqrt + eps).
template <class G>
LF_HD void adamw_item(float* p, const G* g, float* m, float* v, int64_t i, const AdamWConsts& k) {
  const float gi = load(g, i) * k.grad_scale;
  float pi = p[i];
  if (k.decays) pi *= k.decay;
  const float mi = m[i] * k.beta1 + k.one_minus_beta1 * gi;
  const float vi = v[i] * k.beta2 + k.one_minus_beta2 * gi * gi;
  m[i] = mi;
  v[i] = vi;
  p[i] = pi + k.step_size * (mi / (std::sqrt(vi) / k.bc2_sqrt + k.eps));
}

// ---- Sum of squares (OpTable::squared_norm) ---------------------------------------------------
// Elements [first, end) of x, thread tid of `threads`'s share, in fp64.
template <class T>
LF_HD double square_sum_partial(const T* x, int64_t first, int64_t end, int tid, int threads) {
  double acc = 0.0;
  for (int64_t i = first + tid; i < end; i += threads) {
    const double e = static_cast<double>(load(x, i));
    acc += e * e;
  }
  return acc;
}

// ---- MoE (OpTable::moe_permute_bwd, moe_unpermute_fwd / bwd) ---------------------------------
// unpermute forward, item (t, c) of [n, h]: out[t, c] = sum_j probs[t, j] y[position[t, j], c],
// dropped slots (position -1) adding nothing; fp32 accumulation in slot order.
template <class T, class P>
LF_HD void unpermute_fwd_item(const T* y, const int64_t* position, const P* probs, T* out, int64_t item,
                              int64_t k, int64_t h) {
  const int64_t t = item / h, c = item % h;
  float acc = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t row = position[t * k + j];
    if (row >= 0) acc += load(probs, t * k + j) * load(y, row * h + c);
  }
  store(out, item, acc);
}

// unpermute backward, dy part, item (t, j, c) of [n, k, h]: the slot's row of dy is
// probs[t, j] dout[t, c] (each valid slot owns one row of y; dropped slots write nothing).
template <class T, class P>
LF_HD void unpermute_bwd_dy_item(const T* dout, const int64_t* position, const P* probs, T* dy, int64_t item,
                                 int64_t k, int64_t h) {
  const int64_t slot = item / h, c = item % h;
  const int64_t row = position[slot];
  if (row < 0) return;
  store(dy, row * h + c, load(probs, slot) * load(dout, (slot / k) * h + c));
}

// unpermute backward, dprobs part: lane `lane` of `lanes` sums its columns c = lane, lane + lanes,
// .. of <dout[t], y[position[t, j]]> for slot = t * k + j; the lanes' sums are then added (a warp
// reduction on the GPU). A dropped slot's partials are 0.
template <class T>
LF_HD float unpermute_dprobs_partial(const T* dout, const T* y, const int64_t* position, int64_t slot, int64_t k,
                                     int64_t h, int lane, int lanes) {
  const int64_t row = position[slot];
  if (row < 0) return 0.0f;
  const int64_t t = slot / k;
  float acc = 0.0f;
  for (int64_t c = lane; c < h; c += lanes) acc += load(dout, t * h + c) * load(y, row * h + c);
  return acc;
}

// permute backward, item (t, c) of [n, h]: dx[t, c] = sum of dpermuted[rows[i], c] for i in
// [first[t], first[t + 1]): the permuted rows that came from token t (rows: the permuted row ids
// in token order, first: [n + 1] offsets). A gather, so the sum's order is fixed: no atomics.
template <class T>
LF_HD void permute_bwd_item(const T* dpermuted, const int64_t* rows, const int64_t* first, T* dx, int64_t item,
                            int64_t h) {
  const int64_t t = item / h, c = item % h;
  float acc = 0.0f;
  for (int64_t i = first[t]; i < first[t + 1]; ++i) acc += load(dpermuted, rows[i] * h + c);
  store(dx, item, acc);
}

// ---- DSA indexer (OpTable::dsa_indexer_topk / dsa_indexer_scores_fwd) -----------------------
// qi [b, sq, nh, di], ki [b, sk, di], w [b, sq, nh]. The dot product of head j's query at
// (bi, s) with key t, lane `lane` of `lanes`'s share (columns lane, lane + lanes, ..).
template <class T>
LF_HD float indexer_dot_partial(const T* qi, const T* ki, int64_t bi, int64_t s, int64_t j, int64_t t, int64_t sq,
                                int64_t sk, int64_t nh, int64_t di, int lane, int lanes) {
  const T* q = qi + ((bi * sq + s) * nh + j) * di;
  const T* kk = ki + (bi * sk + t) * di;
  float acc = 0.0f;
  for (int64_t c = lane; c < di; c += lanes) acc += load(q, c) * load(kk, c);
  return acc;
}

// Adds head j's term of the index score I = sum_j w_j relu(scale <q_j, k>) given the head's
// full dot product.
template <class T>
LF_HD float indexer_head_term(const T* w, int64_t bi, int64_t s, int64_t j, int64_t sq, int64_t nh, float dot,
                              float scale) {
  const float a = scale * dot;
  return a > 0.0f ? load(w, (bi * sq + s) * nh + j) * a : 0.0f;
}

// Query s of sq sees key t of sk (causal, aligned bottom-right as the reference's mask).
LF_HD bool indexer_visible(int64_t s, int64_t t, int64_t sq, int64_t sk) { return t <= s + (sk - sq); }

}  // namespace lf::cuda_kernels

// Vectorisable fp32 row kernels shared by the CPU backend's fused ops (cpu_fused.cpp,
// cpu_train_ops.cpp). Each is compiled for AVX-512, AVX2 and the baseline (GCC target_clones:
// the loader picks the best the CPU has), and written so the compiler vectorises it: no calls,
// fixed-width partial sums, a polynomial exp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LF_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LF_CPU_CLONES
#endif

namespace lf::backend::cpu_math {

// exp(x) for fp32 (Cephes' expf: exp(x) = 2^k exp(r), |r| <= ln2 / 2, a degree-6 polynomial),
// within 2 ulp of std::exp on [-87.3, 88.3]; inputs above are clamped to that range, inputs
// below give 0 (as exp underflows; a masked score's probability must not be ~1e-38, whose
// products with the values are denormals).
inline float vexp(float x0) {
  constexpr float kLow = -87.3365478515625f;
  const float x = std::min(88.3762626647949f, std::max(kLow, x0));
  const float k = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x0 < kLow ? 0.0f : y * scale;
}

// z[j] += a[j]
void add_row(float* __restrict z, const float* __restrict a, int64_t n);
// dp[j] = p[j] (dp[j] - d): a softmax row's gradient from its probabilities p and dP, d = <dP, p>
void softmax_grad_row(const float* __restrict p, float* __restrict dp, float d, int64_t n);
// max over z[0, n)
float row_max(const float* z, int64_t n);
// z[j] = exp(z[j] - m) in place; returns the sum of the new values (fp32 lanes, added in fp64)
double row_exp_sum(float* z, float m, int64_t n);
// y = silu(g) u
void silu_mul(const float* g, const float* u, float* y, int64_t n);
// dg = dy u silu'(g), du = dy silu(g)
void silu_mul_bwd(const float* dy, const float* g, const float* u, float* dg, float* du, int64_t n);
// GELU, tanh form, as x sigmoid(2u) (u = sqrt(2/pi) (x + 0.044715 x^3); (1 + tanh u) / 2 =
// sigmoid(2u)), saturated exactly where fp32 tanh(u) is +-1 (|u| > 9): y = 0 / x, dx = 0 / dy,
// never a denormal; and its backward dx = dy (s + 2 x s (1 - s) du/dx), s = sigmoid(2u).
void gelu_tanh(const float* x, float* y, int64_t n);
void gelu_tanh_bwd(const float* dy, const float* x, float* dx, int64_t n);
// GeGLU: y = gelu_tanh(g) u; the backward dg = dy u gelu_tanh'(g), du = dy gelu_tanh(g) from one
// sigmoid per element
void geglu_tanh(const float* g, const float* u, float* y, int64_t n);
void geglu_tanh_bwd(const float* dy, const float* g, const float* u, float* dg, float* du, int64_t n);
// RMSNorm rows: y = x r w; the backward's dot sum (dy w) x in fp64; dx = r (dy w - x r m) and
// acc += dy x r (the weight gradient's per-thread partial sums)
void rms_norm_row(const float* x, float r, const float* w, float* y, int64_t n);
double rms_norm_bwd_dot(const float* dy, const float* w, const float* x, int64_t n);
void rms_norm_bwd_row(const float* dy, const float* x, const float* w, float r, float m, float* dx, float* acc,
                      int64_t n);
// bf16 rows (their 16 bits) to fp32 and back: widening is exact; narrowing rounds to nearest even
// and makes every NaN the quiet NaN 0x7FC0, bit for bit as c10::BFloat16(float)
void bf16_to_float(const uint16_t* src, float* dst, int64_t n);
void float_to_bf16(const float* src, uint16_t* dst, int64_t n);
// sum of x[j]^2 and of a[j] b[j] in fp64
double sum_sq(const float* x, int64_t n);
double dot(const float* a, const float* b, int64_t n);
// AdamW on [0, n) (torch.optim.AdamW's update; see OpTable::adamw_step)
void adamw(float* p, const float* g, float* m, float* v, int64_t n, float gs, float decay, bool decays, float b1,
           float one_b1, float b2, float one_b2, float bc2_sqrt, float eps, float step_size);

}  // namespace lf::backend::cpu_math

// The vectorisable fp32 row kernels (cpu_math.h).
#include "cpu_math.h"

#include <limits>

namespace lf::backend::cpu_math {

constexpr int kLanes = 16;

LF_CPU_CLONES float row_max(const float* z, int64_t n) {
  float lane[kLanes];
  for (float& l : lane) l = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] = std::max(lane[k], z[j + k]);
  if (j < n) {  // the tail as one more vector, padded with -inf (no scalar loop)
    float t[kLanes];
    for (int k = 0; k < kLanes; ++k) t[k] = j + k < n ? z[j + k] : -std::numeric_limits<float>::infinity();
    for (int k = 0; k < kLanes; ++k) lane[k] = std::max(lane[k], t[k]);
  }
  float m = -std::numeric_limits<float>::infinity();
  for (float l : lane) m = std::max(m, l);
  return m;
}

LF_CPU_CLONES double row_exp_sum(float* z, float m, int64_t n) {
  float lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float e = vexp(z[j + k] - m);
      z[j + k] = e;
      lane[k] += e;
    }
  if (j < n) {  // the tail as one more vector, padded with -inf (exp 0)
    float t[kLanes];
    for (int k = 0; k < kLanes; ++k) t[k] = j + k < n ? z[j + k] : -std::numeric_limits<float>::infinity();
    for (int k = 0; k < kLanes; ++k) {
      t[k] = vexp(t[k] - m);
      lane[k] += t[k];
    }
    std::memcpy(z + j, t, sizeof(float) * static_cast<size_t>(n - j));
  }
  double s = 0;
  for (float l : lane) s += l;
  return s;
}

LF_CPU_CLONES void add_row(float* __restrict z, const float* __restrict a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) z[j] += a[j];
}

LF_CPU_CLONES void softmax_grad_row(const float* __restrict p, float* __restrict dp, float d, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - d);
}

LF_CPU_CLONES void silu_mul(const float* g, const float* u, float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = g[j] / (1.0f + vexp(-g[j])) * u[j];
}

LF_CPU_CLONES void silu_mul_bwd(const float* dy, const float* g, const float* u, float* dg, float* du, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float sig = 1.0f / (1.0f + vexp(-g[j]));
    dg[j] = dy[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
    du[j] = dy[j] * g[j] * sig;
  }
}

LF_CPU_CLONES void bf16_to_float(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t b = static_cast<uint32_t>(src[j]) << 16;
    std::memcpy(dst + j, &b, sizeof b);
  }
}

LF_CPU_CLONES void float_to_bf16(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    uint32_t b;
    std::memcpy(&b, src + j, sizeof b);
    const auto rounded = static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
    dst[j] = (b & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>(0x7FC0) : rounded;
  }
}

namespace {
constexpr float kGeluK = 0.7978845608028654f, kGeluC = 0.044715f, kGeluSaturated = 9.0f;

// sigmoid(2u), exactly 0 or 1 beyond the saturation (fp32 tanh(u) is -1 / 1 there).
inline float gelu_sigmoid(float u) {
  const float s = 1.0f / (1.0f + vexp(-2.0f * std::min(kGeluSaturated, std::max(-kGeluSaturated, u))));
  return u < -kGeluSaturated ? 0.0f : (u > kGeluSaturated ? 1.0f : s);
}
}  // namespace

namespace {
// sigmoid(2u) of x (gelu_tanh(x) = x s), and gelu_tanh'(x) from it.
inline float gelu_s(float x) { return gelu_sigmoid(kGeluK * (x + kGeluC * x * x * x)); }
inline float gelu_slope(float x, float s) {
  return s + 2.0f * x * s * (1.0f - s) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
}
}  // namespace

LF_CPU_CLONES void gelu_tanh(const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = x[j] * gelu_s(x[j]);
}

LF_CPU_CLONES void gelu_tanh_bwd(const float* __restrict dy, const float* __restrict x, float* __restrict dx,
                                 int64_t n) {
  for (int64_t j = 0; j < n; ++j) dx[j] = dy[j] * gelu_slope(x[j], gelu_s(x[j]));
}

LF_CPU_CLONES void geglu_tanh(const float* __restrict g, const float* __restrict u, float* __restrict y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = g[j] * gelu_s(g[j]) * u[j];
}

LF_CPU_CLONES void geglu_tanh_bwd(const float* __restrict dy, const float* __restrict g, const float* __restrict u,
                                  float* __restrict dg, float* __restrict du, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float s = gelu_s(g[j]);  // one sigmoid for gelu and gelu'
    dg[j] = dy[j] * u[j] * gelu_slope(g[j], s);
    du[j] = dy[j] * (g[j] * s);
  }
}

LF_CPU_CLONES double dot(const float* a, const float* b, int64_t n) {
  double lane[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lane[k] += static_cast<double>(a[j + k]) * b[j + k];
  double s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; j < n; ++j) s += static_cast<double>(a[j]) * b[j];
  return s;
}

double sum_sq(const float* x, int64_t n) { return dot(x, x, n); }

LF_CPU_CLONES void rms_norm_row(const float* __restrict x, float r, const float* __restrict w, float* __restrict y,
                                int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = x[j] * r * w[j];
}

LF_CPU_CLONES double rms_norm_bwd_dot(const float* dy, const float* w, const float* x, int64_t n) {
  double lane[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lane[k] += static_cast<double>(dy[j + k] * w[j + k]) * x[j + k];
  double s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; j < n; ++j) s += static_cast<double>(dy[j] * w[j]) * x[j];
  return s;
}

LF_CPU_CLONES void rms_norm_bwd_row(const float* __restrict dy, const float* __restrict x, const float* __restrict w,
                                    float r, float m, float* __restrict dx, float* __restrict acc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float xhat = x[j] * r;
    dx[j] = r * (dy[j] * w[j] - xhat * m);
    acc[j] += dy[j] * xhat;
  }
}

LF_CPU_CLONES void adamw(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                         int64_t n, float gs, float decay, bool decays, float b1, float one_b1, float b2, float one_b2,
                         float bc2_sqrt, float eps, float step_size) {
  const float d = decays ? decay : 1.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float gj = g[j] * gs;
    const float mj = m[j] * b1 + one_b1 * gj;
    const float vj = v[j] * b2 + one_b2 * gj * gj;
    m[j] = mj;
    v[j] = vj;
    p[j] = p[j] * d + step_size * (mj / (std::sqrt(vj) / bc2_sqrt + eps));
  }
}

}  // namespace lf::backend::cpu_math

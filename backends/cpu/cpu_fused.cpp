// CpuOps: fused CPU kernels for RMSNorm, SwiGLU, GELU and GeGLU (tanh form) and RoPE (backends/cpu/cpu_ops.h). Each op is one
// parallel loop over rows instead of the reference's 4-6 ATen ops, each its own parallel region
// with a barrier: on a small CPU those barriers cost more than the arithmetic
// (docs/performance.md). Same math as the reference in fp32 (row sums in double); contiguous
// fp32 or bf16 only (RoPE: any view with a unit-stride last dim), anything else, and empty
// tensors, go to the reference. The op harness checks every case against ReferenceOps.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <array>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu_math.h"
#include "cpu_ops.h"

namespace lf::backend {
namespace {

// Empty tensors go to the reference: the row kernels divide numel by the last dim.
bool fusable(std::initializer_list<const at::Tensor*> ts) {
  const auto dtype = (*ts.begin())->scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16) return false;
  for (const auto* t : ts)
    if (!t->device().is_cpu() || t->scalar_type() != dtype || !t->is_contiguous() || t->numel() == 0) return false;
  return true;
}

// The fused RoPE: halves (not interleaved), fp32 or bf16 x (any view with a unit-stride last dim,
// rope_kernel) with CPU tables in either dtype; the kernel reads them as fp32 (rope_tables).
bool rope_fusable(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  const auto floating = [](const at::Tensor& t) {
    return (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16) && t.device().is_cpu();
  };
  return !interleaved && floating(x) && floating(cos) && floating(sin) && (x.stride(3) == 1 || x.size(3) == 1);
}

// The tables as contiguous fp32: themselves when they are (the decoder's, for either dtype of x),
// else an [s, r] copy (the values a bf16 table holds, as the reference reads them).
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& cos, const at::Tensor& sin) {
  return {cos.to(at::kFloat).contiguous(), sin.to(at::kFloat).contiguous()};
}

// Rows per task: enough work per thread that the split is worth a region.
int64_t grain(int64_t row_len) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_len)); }

// bf16 rows go through the same fp32 row kernels (cpu_math): widened into per-task buffers,
// their results narrowed back as c10::BFloat16(float) rounds (an element-wise scalar loop with
// std::exp took 2-3x the fp32 time: llama_10m's bf16 SwiGLU 47 against 16 ms a step).
const uint16_t* bits(const c10::BFloat16* p) { return reinterpret_cast<const uint16_t*>(p); }
uint16_t* bits(c10::BFloat16* p) { return reinterpret_cast<uint16_t*>(p); }
template <class T>
constexpr bool kF32 = std::is_same_v<T, float>;

// The weight in fp32: itself, or widened once for the whole call.
template <class T>
struct F32Weight {
  std::vector<float> held;
  const float* p;
  F32Weight(const T* w, int64_t h) {
    if constexpr (kF32<T>) {
      p = w;
    } else {
      held.resize(static_cast<size_t>(h));
      cpu_math::bf16_to_float(bits(w), held.data(), h);
      p = held.data();
    }
  }
};

template <class T>
void rms_norm_fwd_kernel(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& y, at::Tensor& rstd) {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  const T* xp = x.data_ptr<T>();
  const F32Weight<T> wf(w.data_ptr<T>(), h);
  T* yp = y.data_ptr<T>();
  float* rp = rstd.data_ptr<float>();
  at::parallel_for(0, rows, grain(h), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(kF32<T> ? 0 : static_cast<size_t>(2 * h));  // bf16: the row and its output
    for (int64_t i = begin; i < end; ++i) {
      const float* xr;
      float* yr;
      if constexpr (kF32<T>) {
        xr = xp + i * h, yr = yp + i * h;
      } else {
        cpu_math::bf16_to_float(bits(xp + i * h), buf.data(), h);
        xr = buf.data(), yr = buf.data() + h;
      }
      const float r = static_cast<float>(1.0 / std::sqrt(cpu_math::sum_sq(xr, h) / static_cast<double>(h) + eps));
      rp[i] = r;
      cpu_math::rms_norm_row(xr, r, wf.p, yr, h);
      if constexpr (!kF32<T>) cpu_math::float_to_bf16(yr, bits(yp + i * h), h);
    }
  });
}

// dx = rstd (g - xhat mean(g xhat)) with g = dy w, xhat = x rstd; dw = sum over rows of dy xhat
// (per-thread partial sums, added at the end).
template <class T>
void rms_norm_bwd_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
                         at::Tensor& dx, at::Tensor& dw_partial) {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  const T* dyp = dy.data_ptr<T>();
  const T* xp = x.data_ptr<T>();
  const F32Weight<T> wf(w.data_ptr<T>(), h);
  const float* rp = rstd.data_ptr<float>();
  T* dxp = dx.data_ptr<T>();
  float* part = dw_partial.data_ptr<float>();
  at::parallel_for(0, rows, grain(h), [&](int64_t begin, int64_t end) {
    float* acc = part + at::get_thread_num() * h;
    std::vector<float> buf(kF32<T> ? 0 : static_cast<size_t>(3 * h));  // bf16: dy, x and dx rows
    for (int64_t i = begin; i < end; ++i) {
      const float *dyr, *xr;
      float* dxr;
      if constexpr (kF32<T>) {
        dyr = dyp + i * h, xr = xp + i * h, dxr = dxp + i * h;
      } else {
        cpu_math::bf16_to_float(bits(dyp + i * h), buf.data(), h);
        cpu_math::bf16_to_float(bits(xp + i * h), buf.data() + h, h);
        dyr = buf.data(), xr = buf.data() + h, dxr = buf.data() + 2 * h;
      }
      const float r = rp[i];  // r factored out of the dot
      const float m = static_cast<float>(r * cpu_math::rms_norm_bwd_dot(dyr, wf.p, xr, h) / static_cast<double>(h));
      cpu_math::rms_norm_bwd_row(dyr, xr, wf.p, r, m, dxr, acc, h);
      if constexpr (!kF32<T>) cpu_math::float_to_bf16(dxr, bits(dxp + i * h), h);
    }
  });
}

template <class T>
void swiglu_fwd_kernel(const at::Tensor& gu, at::Tensor& y) {
  const int64_t f = gu.size(-1) / 2, rows = gu.numel() / (2 * f);
  const T* p = gu.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  at::parallel_for(0, rows, grain(2 * f), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(kF32<T> ? 0 : static_cast<size_t>(3 * f));  // bf16: [gate | up] and y rows
    for (int64_t i = begin; i < end; ++i) {
      if constexpr (kF32<T>) {
        cpu_math::silu_mul(p + i * 2 * f, p + i * 2 * f + f, yp + i * f, f);
      } else {
        cpu_math::bf16_to_float(bits(p + i * 2 * f), buf.data(), 2 * f);
        cpu_math::silu_mul(buf.data(), buf.data() + f, buf.data() + 2 * f, f);
        cpu_math::float_to_bf16(buf.data() + 2 * f, bits(yp + i * f), f);
      }
    }
  });
}

template <class T>
void swiglu_bwd_kernel(const at::Tensor& dy, const at::Tensor& gu, at::Tensor& dgu) {
  const int64_t f = gu.size(-1) / 2, rows = gu.numel() / (2 * f);
  const T* p = gu.data_ptr<T>();
  const T* dyp = dy.data_ptr<T>();
  T* out = dgu.data_ptr<T>();
  at::parallel_for(0, rows, grain(2 * f), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(kF32<T> ? 0 : static_cast<size_t>(5 * f));  // bf16: [gate | up], dy, [dgate | dup]
    for (int64_t i = begin; i < end; ++i) {
      if constexpr (kF32<T>) {
        const T* g = p + i * 2 * f;
        T* dg = out + i * 2 * f;
        cpu_math::silu_mul_bwd(dyp + i * f, g, g + f, dg, dg + f, f);
      } else {
        float *gu_f = buf.data(), *dy_f = gu_f + 2 * f, *dgu_f = dy_f + f;
        cpu_math::bf16_to_float(bits(p + i * 2 * f), gu_f, 2 * f);
        cpu_math::bf16_to_float(bits(dyp + i * f), dy_f, f);
        cpu_math::silu_mul_bwd(dy_f, gu_f, gu_f + f, dgu_f, dgu_f + f, f);
        cpu_math::float_to_bf16(dgu_f, bits(out + i * 2 * f), 2 * f);
      }
    }
  });
}

// Non-interleaved halves over the first r dims (Megatron/HF); the rest passes through.
// forward:  y[i] = x[i] c[i] - x[i+q] s[i],   y[i+q] = x[i+q] c[i+q] + x[i] s[i+q]   (q = r / 2)
// backward (the transpose): dx[i] = dy[i] c[i] + dy[i+q] s[i+q],  dx[i+q] = dy[i+q] c[i+q] - dy[i] s[i]
// One row: the first r dims rotated, the rest copied.
inline void rope_row(const float* __restrict xr, const float* __restrict c, const float* __restrict sn,
                     float* __restrict yr, int64_t r, int64_t d, bool transpose) {
  const int64_t q = r / 2;
  if (transpose) {
    for (int64_t i = 0; i < q; ++i) {
      yr[i] = xr[i] * c[i] + xr[i + q] * sn[i + q];
      yr[i + q] = xr[i + q] * c[i + q] - xr[i] * sn[i];
    }
  } else {
    for (int64_t i = 0; i < q; ++i) {
      yr[i] = xr[i] * c[i] - xr[i + q] * sn[i];
      yr[i + q] = xr[i + q] * c[i + q] + xr[i] * sn[i + q];
    }
  }
  for (int64_t j = r; j < d; ++j) yr[j] = xr[j];
}

// x is read through its strides (any view of [s, b, n, d] with a unit-stride last dim: the
// backward's dy is attention's dq, [b, n, s, d] memory seen as [s, b, n, d]); y is contiguous.
// bf16 rows are widened into a per-task buffer and narrowed back (cpu_math).
template <class T>
void rope_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool transpose, at::Tensor& y) {
  const int64_t s = x.size(0), nb = x.size(1), nh = x.size(2), d = x.size(3), per_pos = nb * nh;
  const int64_t r = cos.size(1);
  const int64_t s0 = x.stride(0), s1 = x.stride(1), s2 = x.stride(2);
  const T* xp = x.data_ptr<T>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  T* yp = y.data_ptr<T>();
  at::parallel_for(0, s * per_pos, grain(d), [&](int64_t begin, int64_t end) {
    std::vector<float> buf(kF32<T> ? 0 : static_cast<size_t>(2 * d));  // bf16: the row and its output
    for (int64_t row = begin; row < end; ++row) {
      const int64_t pos = row / per_pos, bi = row % per_pos / nh, hi = row % nh;
      const T* xr = xp + pos * s0 + bi * s1 + hi * s2;
      if constexpr (kF32<T>) {
        rope_row(xr, cp + pos * r, sp + pos * r, yp + row * d, r, d, transpose);
      } else {
        cpu_math::bf16_to_float(bits(xr), buf.data(), d);
        rope_row(buf.data(), cp + pos * r, sp + pos * r, buf.data() + d, r, d, transpose);
        cpu_math::float_to_bf16(buf.data() + d, bits(yp + row * d), d);
      }
    }
  });
}

#define LF_CPU_DISPATCH(dtype, ...)          \
  if ((dtype) == at::kFloat) {               \
    using scalar = float;                    \
    __VA_ARGS__;                             \
  } else {                                   \
    using scalar = c10::BFloat16;            \
    __VA_ARGS__;                             \
  }

}  // namespace

RmsNormFwd CpuOps::rms_norm_fwd(const at::Tensor& x, const at::Tensor& w, double eps) const {
  check_rms_norm_args(x, w);
  if (!fusable({&x, &w})) return ReferenceOps::rms_norm_fwd(x, w, eps);
  at::Tensor y = at::empty_like(x);
  auto sizes = x.sizes().vec();
  sizes.pop_back();
  at::Tensor rstd = at::empty(sizes, x.options().dtype(at::kFloat));
  LF_CPU_DISPATCH(x.scalar_type(), rms_norm_fwd_kernel<scalar>(x, w, eps, y, rstd));
  return {y, rstd};
}

RmsNormBwd CpuOps::rms_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                const at::Tensor& rstd) const {
  check_rms_norm_args(x, w);
  if (!fusable({&x, &dy, &w}) || rstd.scalar_type() != at::kFloat || !rstd.is_contiguous() ||
      dy.sizes() != x.sizes())
    return ReferenceOps::rms_norm_bwd(dy, x, w, rstd);
  at::Tensor dx = at::empty_like(x);
  at::Tensor partial = at::zeros({at::get_num_threads(), x.size(-1)}, x.options().dtype(at::kFloat));
  LF_CPU_DISPATCH(x.scalar_type(), rms_norm_bwd_kernel<scalar>(dy, x, w, rstd, dx, partial));
  return {dx, partial.sum(0).to(w.scalar_type())};
}

at::Tensor CpuOps::swiglu_fwd(const at::Tensor& gate_up) const {
  check_swiglu_args(gate_up);
  if (!fusable({&gate_up})) return ReferenceOps::swiglu_fwd(gate_up);
  auto sizes = gate_up.sizes().vec();
  sizes.back() /= 2;
  at::Tensor y = at::empty(sizes, gate_up.options());
  LF_CPU_DISPATCH(gate_up.scalar_type(), swiglu_fwd_kernel<scalar>(gate_up, y));
  return y;
}

at::Tensor CpuOps::swiglu_bwd(const at::Tensor& dy, const at::Tensor& gate_up) const {
  check_swiglu_args(gate_up);
  if (!fusable({&gate_up, &dy}) || dy.numel() * 2 != gate_up.numel()) return ReferenceOps::swiglu_bwd(dy, gate_up);
  at::Tensor dgu = at::empty_like(gate_up);
  LF_CPU_DISPATCH(gate_up.scalar_type(), swiglu_bwd_kernel<scalar>(dy, gate_up, dgu));
  return dgu;
}

// Element-wise kernels over n elements of fp32 or bf16 tensors: `row(ins, outs, count)` on fp32
// pointers, one parallel pass; bf16 goes through per-task fp32 buffers of up to 4096 elements
// (widened, the fp32 kernel, narrowed back: the fp32 kernel's results rounded once).
template <size_t NIn, size_t NOut, class Row>
void elementwise(at::ScalarType dtype, int64_t n, const std::array<const at::Tensor*, NIn>& in,
                 const std::array<at::Tensor*, NOut>& out, Row row) {
  if (dtype == at::kFloat) {
    std::array<const float*, NIn> ip;
    std::array<float*, NOut> op;
    for (size_t i = 0; i < NIn; ++i) ip[i] = in[i]->template data_ptr<float>();
    for (size_t i = 0; i < NOut; ++i) op[i] = out[i]->template data_ptr<float>();
    at::parallel_for(0, n, 16384, [&](int64_t b, int64_t e) {
      std::array<const float*, NIn> ib;
      std::array<float*, NOut> ob;
      for (size_t i = 0; i < NIn; ++i) ib[i] = ip[i] + b;
      for (size_t i = 0; i < NOut; ++i) ob[i] = op[i] + b;
      row(ib, ob, e - b);
    });
    return;
  }
  constexpr int64_t kBlock = 4096;
  std::array<const uint16_t*, NIn> ip;
  std::array<uint16_t*, NOut> op;
  for (size_t i = 0; i < NIn; ++i) ip[i] = bits(in[i]->template data_ptr<c10::BFloat16>());
  for (size_t i = 0; i < NOut; ++i) op[i] = bits(out[i]->template data_ptr<c10::BFloat16>());
  at::parallel_for(0, n, 16384, [&](int64_t b, int64_t e) {
    std::vector<float> buf(static_cast<size_t>((NIn + NOut) * kBlock));
    std::array<float*, NIn> iw;
    std::array<const float*, NIn> ib;
    std::array<float*, NOut> ob;
    for (size_t i = 0; i < NIn; ++i) ib[i] = iw[i] = buf.data() + i * kBlock;
    for (size_t i = 0; i < NOut; ++i) ob[i] = buf.data() + (NIn + i) * kBlock;
    for (int64_t j = b; j < e; j += kBlock) {
      const int64_t c = std::min(kBlock, e - j);
      for (size_t i = 0; i < NIn; ++i) cpu_math::bf16_to_float(ip[i] + j, iw[i], c);
      row(ib, ob, c);
      for (size_t i = 0; i < NOut; ++i) cpu_math::float_to_bf16(ob[i], op[i] + j, c);
    }
  });
}

// GELU (tanh form): one parallel pass over the elements (cpu_math::gelu_tanh).
at::Tensor CpuOps::gelu_tanh_fwd(const at::Tensor& x) const {
  if (!fusable({&x})) return ReferenceOps::gelu_tanh_fwd(x);
  at::Tensor y = at::empty_like(x);
  elementwise<1, 1>(x.scalar_type(), x.numel(), {&x}, {&y},
                    [](const auto& i, const auto& o, int64_t c) { cpu_math::gelu_tanh(i[0], o[0], c); });
  return y;
}

at::Tensor CpuOps::gelu_tanh_bwd(const at::Tensor& dy, const at::Tensor& x) const {
  if (!fusable({&x, &dy}) || dy.sizes() != x.sizes()) return ReferenceOps::gelu_tanh_bwd(dy, x);
  at::Tensor dx = at::empty_like(x);
  elementwise<2, 1>(x.scalar_type(), x.numel(), {&dy, &x}, {&dx},
                    [](const auto& i, const auto& o, int64_t c) { cpu_math::gelu_tanh_bwd(i[0], i[1], o[0], c); });
  return dx;
}

// GeGLU (tanh form): one parallel pass over the elements (cpu_math::geglu_tanh), the backward's
// gelu and gelu' from one sigmoid per element.
at::Tensor CpuOps::geglu_tanh_fwd(const at::Tensor& gate, const at::Tensor& up) const {
  check_geglu_args(gate, up);
  if (!fusable({&gate, &up})) return ReferenceOps::geglu_tanh_fwd(gate, up);
  at::Tensor y = at::empty_like(gate);
  elementwise<2, 1>(gate.scalar_type(), gate.numel(), {&gate, &up}, {&y},
                    [](const auto& i, const auto& o, int64_t c) { cpu_math::geglu_tanh(i[0], i[1], o[0], c); });
  return y;
}

GatedBwd CpuOps::geglu_tanh_bwd(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up) const {
  check_geglu_args(gate, up, dy);
  if (!fusable({&gate, &up, &dy})) return ReferenceOps::geglu_tanh_bwd(dy, gate, up);
  at::Tensor dg = at::empty_like(gate), du = at::empty_like(up);
  elementwise<3, 2>(gate.scalar_type(), gate.numel(), {&dy, &gate, &up}, {&dg, &du},
                    [](const auto& i, const auto& o, int64_t c) {
                      cpu_math::geglu_tanh_bwd(i[0], i[1], i[2], o[0], o[1], c);
                    });
  return {dg, du};
}

at::Tensor CpuOps::rope_fwd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            bool interleaved) const {
  check_rope_args(x, cos, sin);
  if (!rope_fusable(x, cos, sin, interleaved)) return ReferenceOps::rope_fwd(x, cos, sin, interleaved);
  const auto [c, sn] = rope_tables(cos, sin);
  at::Tensor y = at::empty(x.sizes(), x.options());
  LF_CPU_DISPATCH(x.scalar_type(), rope_kernel<scalar>(x, c, sn, /*transpose=*/false, y));
  return y;
}

at::Tensor CpuOps::rope_bwd(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin,
                            bool interleaved) const {
  check_rope_args(dy, cos, sin);
  if (!rope_fusable(dy, cos, sin, interleaved)) return ReferenceOps::rope_bwd(dy, cos, sin, interleaved);
  const auto [c, sn] = rope_tables(cos, sin);
  at::Tensor dx = at::empty(dy.sizes(), dy.options());
  LF_CPU_DISPATCH(dy.scalar_type(), rope_kernel<scalar>(dy, c, sn, /*transpose=*/true, dx));
  return dx;
}

}  // namespace lf::backend

#include "loongforge/models/blocks/norms.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/parallel/tensor/layers.h"

namespace lf::models {

Norm::Norm(ParamBuilder& b, const std::string& prefix, int64_t h, NormSpec s) : spec(s) {
  weight = b.add(prefix + ".weight", at::ones({h}), Sharding::replicated(), true);
  if (s.layer_norm) bias = b.add(prefix + ".bias", at::zeros({h}), Sharding::replicated(), true);
}

at::Tensor Norm::operator()(const lf::backend::DeviceBackend& be, const at::Tensor& x) const {
  return spec.layer_norm ? lf::ops::layer_norm(be, x, weight, bias, spec.eps) : lf::ops::rms_norm(be, x, weight, spec.eps);
}

at::Tensor Norm::first_linear(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp,
                              const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                              const lf::ops::WeightGradSlots* slots, const lf::ops::Fp8Recipe* fp8) const {
  // FP8: the normed input is quantized for the GEMM (the FP8 linear keeps that copy, not x).
  if (fp8) return lf::parallel::column_parallel_linear((*this)(be, x), w, b, tp, false, slots, fp8);
  if (!spec.layer_norm && tp.size() == 1) return lf::ops::rms_norm_linear(be, x, weight, spec.eps, w, b, slots);
  return lf::parallel::column_parallel_linear((*this)(be, x), w, b, tp, false, slots);
}

at::Tensor plain_norm(const lf::backend::DeviceBackend& be, const at::Tensor& x, const NormSpec& spec) {
  auto ones = at::ones({x.size(-1)}, x.options().requires_grad(false));
  return spec.layer_norm ? lf::ops::layer_norm(be, x, ones, at::zeros_like(ones), spec.eps)
                         : lf::ops::rms_norm(be, x, ones, spec.eps);
}

AdaptiveNorm::AdaptiveNorm(ParamBuilder& b, const std::string& prefix, int64_t cond_size, int64_t h,
                           int64_t outputs, NormSpec spec)
    : h_(h), outputs_(outputs), spec_(spec) {
  LF_CHECK(outputs == 2 || outputs == 3, prefix, ": an adaptive norm has 2 (shift, scale) or 3 (+ gate) outputs, got ",
           outputs);
  weight_ = b.add(prefix + ".adaLN_modulation.weight", at::zeros({outputs * h, cond_size}), Sharding::replicated(), false);
  bias_ = b.add(prefix + ".adaLN_modulation.bias", at::zeros({outputs * h}), Sharding::replicated(), true);
}

AdaptiveNorm::Modulation AdaptiveNorm::modulation(const lf::backend::DeviceBackend&, const at::Tensor& cond) const {
  LF_CHECK(cond.dim() == 2, "adaptive norm: the conditioning must be [batch, features], got ", cond.sizes());
  auto m = at::linear(at::silu(cond), weight_, bias_);  // [b, outputs h]
  auto parts = m.split(h_, -1);
  Modulation out;
  out.shift = parts[0];
  out.scale = parts[1];
  if (outputs_ == 3) out.gate = parts[2];
  return out;
}

at::Tensor AdaptiveNorm::operator()(const lf::backend::DeviceBackend& be, const at::Tensor& x, const Modulation& m) const {
  // x: [s, b, h]; shift/scale: [b, h] broadcast over the sequence.
  return plain_norm(be, x, spec_) * (1 + m.scale.unsqueeze(0)) + m.shift.unsqueeze(0);
}

at::Tensor AdaptiveNorm::gated(const at::Tensor& residual, const at::Tensor& branch, const Modulation& m) {
  return m.gate.defined() ? residual + m.gate.unsqueeze(0) * branch : residual + branch;
}

}  // namespace lf::models

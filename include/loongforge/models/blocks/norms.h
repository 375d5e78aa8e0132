// Normalisation blocks: RMSNorm / LayerNorm with a learned scale (and LayerNorm's bias), and the
// adaptive (modulated) norm of diffusion transformers: a parameter-free norm whose shift and
// scale (and a residual gate) come from a conditioning vector (DiT's adaLN). Every op goes
// through the backend. Not the attention or MLP blocks.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/models/blocks/param_builder.h"

namespace lf::ops {
class WeightGradSlots;  // backend/functional.h
struct Fp8Recipe;       // backend/fp8.h
class Fp8Policy;        // backend/fp8.h
}
namespace lf::parallel {
struct TensorParallel;  // parallel/tensor/layers.h
}

namespace lf::models {

struct NormSpec {
  bool layer_norm = false;  // false: RMSNorm
  double eps = 1e-5;
};

// A norm's parameters: weight [h] (ones), bias [h] (zeros, LayerNorm only). Replicated over TP.
struct Norm {
  at::Tensor weight, bias;
  NormSpec spec;

  Norm() = default;
  // Registers `prefix`.weight (and .bias) in `b`.
  Norm(ParamBuilder& b, const std::string& prefix, int64_t h, NormSpec spec);
  // x: [.., h] -> [.., h]
  at::Tensor operator()(const lf::backend::DeviceBackend& be, const at::Tensor& x) const;
  // A block's first linear over the normed input: column_parallel_linear((*this)(be, x), w, b, tp,
  // false, slots). For an RMSNorm on one TP rank, lf::ops::rms_norm_linear: the normed input is
  // recomputed in backward instead of held. (Under TP the norm stays outside the TP region: inside
  // it each rank's norm-weight gradient would be only its own columns' part.)
  at::Tensor first_linear(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp,
                          const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                          const lf::ops::WeightGradSlots* slots, const lf::ops::Fp8Recipe* fp8 = nullptr) const;
};

// x: [.., h] -> the norm without a learned scale or bias.
at::Tensor plain_norm(const lf::backend::DeviceBackend& be, const at::Tensor& x, const NormSpec& spec);

// DiT's adaptive norm: modulation = Linear(SiLU(c)) -> `outputs` chunks of h each: shift, scale
// (and gate when outputs == 3). Applied as norm(x) * (1 + scale) + shift; the gate multiplies the
// residual branch (gated()). The modulation weight starts at zero (adaLN-Zero: the block is the
// identity at initialisation). Replicated over TP.
class AdaptiveNorm {
 public:
  AdaptiveNorm() = default;
  // cond_size: the conditioning vector's width; h: the hidden size; outputs: 2 or 3.
  AdaptiveNorm(ParamBuilder& b, const std::string& prefix, int64_t cond_size, int64_t h, int64_t outputs,
               NormSpec spec);
  struct Modulation {
    at::Tensor shift, scale, gate;  // [b, h] each (gate undefined unless outputs == 3)
  };
  // cond: [b, cond_size] -> the modulation of each sample.
  Modulation modulation(const lf::backend::DeviceBackend& be, const at::Tensor& cond) const;
  // x: [s, b, h] -> norm(x) * (1 + scale) + shift (broadcast over s).
  at::Tensor operator()(const lf::backend::DeviceBackend& be, const at::Tensor& x, const Modulation& m) const;
  // residual + gate * branch (gate broadcast over s); without a gate: residual + branch.
  static at::Tensor gated(const at::Tensor& residual, const at::Tensor& branch, const Modulation& m);

 private:
  at::Tensor weight_, bias_;  // [outputs h, cond_size], [outputs h]
  int64_t h_ = 0, outputs_ = 2;
  NormSpec spec_;
};

}  // namespace lf::models

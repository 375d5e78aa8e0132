// The transformer MLP: column-parallel fc1 ([gate; up] for SwiGLU, each half split over TP on its
// own), the activation (SwiGLU, or GELU in erf form), row-parallel fc2; optional biases. Written
// for one device, parallel through parallel/tensor. Not the MoE layer.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "loongforge/backend/device_backend.h"
#include "loongforge/models/blocks/lora.h"
#include "loongforge/models/blocks/norms.h"
#include "loongforge/models/blocks/param_builder.h"

namespace lf::ops {
class WeightGradSlots;  // backend/functional.h
}

namespace lf::models {

struct MlpConfig {
  int64_t hidden_size = 0;      // input width (and output width unless output_size is set)
  int64_t ffn_hidden_size = 0;  // f
  bool swiglu = true;           // false: GELU
  bool bias = false;            // biases in fc1 and fc2
  double init_std = 0.02, out_std = 0.02;
  int64_t output_size = 0;      // 0: hidden_size (an encoder may project to another width)
};

class Mlp {
 public:
  Mlp() = default;
  // Registers prefix.linear_fc1.weight [2 f, h] (swiglu) or [f, h] (+ .bias), then
  // prefix.linear_fc2.weight [out, f] (+ .bias [out], replicated, added after the reduction).
  Mlp(ParamBuilder& b, const std::string& prefix, const MlpConfig& c);
  // x: [s(/tp), b, h] -> [s(/tp), b, out]. The activation is recomputed in backward, not kept
  // (lf::ops::activated_linear), unless a down_proj adapter reads it; then selective_recompute
  // recomputes it. lora: adapters on gate/up/down_proj (null: none; SwiGLU only).
  // slots: gradient-accumulation fusion for linear_fc1 and linear_fc2 (lf::ops::linear), or null.
  // pre_norm: x is the un-normed input and this norm comes first (Norm::first_linear fuses it into
  // linear_fc1 where it can, unless adapters read the normed input); null: x is the input.
  // fp8: which of linear_fc1 / linear_fc2 run in FP8 at this token count (null: neither).
  at::Tensor forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp, const at::Tensor& x,
                     bool selective_recompute = false, const LoraInputs* lora = nullptr,
                     const lf::ops::WeightGradSlots* slots = nullptr, const Norm* pre_norm = nullptr,
                     const lf::ops::Fp8Policy* fp8 = nullptr) const;

 private:
  MlpConfig c_;
  at::Tensor fc1_, fc1_bias_, fc2_, fc2_bias_;
};

}  // namespace lf::models

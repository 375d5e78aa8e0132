// A regression head: a linear map of the final hidden states to `output_size` values per position
// and the mean squared error against float targets, averaged per sample (a sample is the unit
// its normaliser counts). The skeleton of a diffusion model's velocity / noise prediction and of
// an action expert's flow-matching output. Replicated over TP.
#pragma once

#include <ATen/core/Tensor.h>

#include "loongforge/models/blocks/embeddings.h"

namespace lf::models {

class RegressionHead {
 public:
  RegressionHead() = default;
  // Registers output_layer.{weight [out, h], bias [out]}.
  RegressionHead(ParamBuilder& b, int64_t hidden_size, int64_t output_size, double init_std);
  // x: [s, b, h] -> predictions [b, s, out].
  at::Tensor forward(const at::Tensor& x) const;
  // predictions, targets: [b, s, out] -> per-sample mean squared error [b] (fp32).
  static at::Tensor per_sample_mse(const at::Tensor& predictions, const at::Tensor& targets);

 private:
  ReplicatedLinear out_;
};

}  // namespace lf::models

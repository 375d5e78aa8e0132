#include "loongforge/models/heads/regression_head.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "loongforge/core/error.h"

namespace lf::models {

RegressionHead::RegressionHead(ParamBuilder& b, int64_t hidden_size, int64_t output_size, double init_std)
    : out_(b, "output_layer", hidden_size, output_size, init_std, true) {}

at::Tensor RegressionHead::forward(const at::Tensor& x) const { return out_.forward(x).transpose(0, 1); }

at::Tensor RegressionHead::per_sample_mse(const at::Tensor& predictions, const at::Tensor& targets) {
  LF_CHECK(predictions.sizes() == targets.sizes(), "regression: predictions ", predictions.sizes(),
           " and targets ", targets.sizes(), " differ in shape");
  auto diff = predictions.to(at::kFloat) - targets.to(predictions.device(), at::kFloat);
  return diff.pow(2).flatten(1).mean(1);
}

}  // namespace lf::models

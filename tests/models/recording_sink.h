// A gradient sink for model tests (models/model.h's GradientSink, which the trainer implements
// over its gradient buffer): it gives each registered parameter a slot for its weight gradient
// (written on the first ask of a step, added to on later ones) and counts the asks; take() gives
// none, so a fused output layer keeps autograd's path.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "loongforge/models/model.h"

namespace lf::testing {

struct RecordingSink final : lf::models::GradientSink {
  std::map<const void*, at::Tensor> slots;  // by parameter: its slot, zeroed before the step
  mutable std::map<const void*, int> asked;  // by parameter: how often it asked
  std::optional<lf::backend::GradInto> take(const at::Tensor&, const std::string&) const override { return std::nullopt; }
  std::optional<lf::backend::GradInto> weight_grad_slot(const at::Tensor& w) const override {
    auto it = slots.find(w.unsafeGetTensorImpl());
    if (it == slots.end()) return std::nullopt;
    const bool written = asked[w.unsafeGetTensorImpl()]++ > 0;
    return lf::backend::GradInto{it->second, 1.0, written};
  }
  // Runs `step` (a forward and backward of `model`) with this sink given to the model.
  template <class Model, class Step>
  void run(Model& model, Step&& step) {
    model.set_gradient_sink(this);
    step();
    model.set_gradient_sink(nullptr);
  }
  // What parameter p got in the step: its slot (if it has one) plus its .grad.
  at::Tensor total_grad(const at::Tensor& p) const {
    at::Tensor g = p.grad().defined() ? p.grad().clone() : at::zeros_like(p);
    auto it = slots.find(p.unsafeGetTensorImpl());
    return it == slots.end() ? g : g + it->second;
  }
};

// |got - want| <= rel * max|want| (fp32 sums in another order).
inline double relative_max_difference(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / std::max(1e-12, want.abs().max().item<double>());
}

}  // namespace lf::testing

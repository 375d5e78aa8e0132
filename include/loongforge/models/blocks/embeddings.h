// Input embeddings: the vocabulary-parallel token embedding (table rows split over TP, rows past
// the real vocabulary zero padding) and the linear embedding of float feature vectors (the input
// projection of feature models and encoders). Not positional encodings (blocks/rope.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "loongforge/models/blocks/param_builder.h"

namespace lf::ops {
class WeightGradSlots;  // backend/functional.h
}

namespace lf::models {

// The vocabulary rows are drawn for the real vocabulary only and padded with zeros, so the draw
// (and every tensor drawn after it) does not depend on the padding, which depends on TP.
at::Tensor vocab_table(ParamBuilder& b, int64_t vocab, int64_t padded, int64_t h, double std);

class TokenEmbedding {
 public:
  TokenEmbedding() = default;
  // Registers `name` with `full` (a vocab_table) split over TP along the vocabulary.
  TokenEmbedding(ParamBuilder& b, const std::string& name, const at::Tensor& full);
  // Over a table registered elsewhere (a pipeline stage's tied copy of the embedding).
  explicit TokenEmbedding(at::Tensor weight) : weight_(std::move(weight)) {}
  // tokens: [b, s] int64 -> [s, b, h], or this rank's sequence chunk [s / tp, b, h] with
  // sequence parallelism when `scatter` (false: the whole sequence on every rank, for a
  // composite that splices other embeddings in before scattering). slots: gradient-accumulation
  // fusion for the table (lf::ops::embedding), or null.
  at::Tensor forward(const lf::parallel::TensorParallel& tp, const at::Tensor& tokens, bool scatter = true,
                     const lf::ops::WeightGradSlots* slots = nullptr) const;
  const at::Tensor& weight() const { return weight_; }

 private:
  at::Tensor weight_;
};

// y = x W^T + b over the last dim, replicated over TP: weight [out, in] ~ N(0, std), bias [out].
class ReplicatedLinear {
 public:
  ReplicatedLinear() = default;
  ReplicatedLinear(ParamBuilder& b, const std::string& prefix, int64_t in, int64_t out, double std, bool bias);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  at::Tensor weight_, bias_;
};

}  // namespace lf::models

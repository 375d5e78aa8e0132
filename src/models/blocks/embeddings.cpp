#include "loongforge/models/blocks/embeddings.h"

#include <ATen/Functions.h>

#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {

at::Tensor vocab_table(ParamBuilder& b, int64_t vocab, int64_t padded, int64_t h, double std) {
  if (b.meta()) return b.normal({padded, h}, std);
  auto t = b.normal({vocab, h}, std);
  return padded == vocab ? t : at::cat({t, at::zeros({padded - vocab, h})}, 0);
}

TokenEmbedding::TokenEmbedding(ParamBuilder& b, const std::string& name, const at::Tensor& full) {
  weight_ = b.add(name, full, Sharding::vocabulary(), false);
}

at::Tensor TokenEmbedding::forward(const lf::parallel::TensorParallel& tp, const at::Tensor& tokens, bool scatter,
                                   const lf::ops::WeightGradSlots* slots) const {
  lf::parallel::TensorParallel t = tp;
  if (!scatter) t.sequence_parallel = false;
  return lf::parallel::vocab_parallel_embedding(tokens.t().contiguous(), weight_, t, slots);
}

ReplicatedLinear::ReplicatedLinear(ParamBuilder& b, const std::string& prefix, int64_t in, int64_t out, double std,
                                   bool bias) {
  weight_ = b.add(prefix + ".weight", b.normal({out, in}, std), Sharding::replicated(), false);
  if (bias) bias_ = b.add(prefix + ".bias", at::zeros({out}), Sharding::replicated(), true);
}

at::Tensor ReplicatedLinear::forward(const at::Tensor& x) const { return at::linear(x, weight_, bias_); }

}  // namespace lf::models

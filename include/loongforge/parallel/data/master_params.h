// Mixed precision and ZeRO-1 parameter ownership: fp32 master weights for the ranges of a
// GradBuffer this rank owns (the whole model without the distributed optimizer, its DP shard
// with it), and the way back into the model's (bf16 or fp32) parameters: a copy, or an
// all-gather over DP in the parameters' dtype. fp32 parameters are their own masters: they are
// moved into one flat buffer laid out as the gradient buffer (the parameter objects stay the
// same; their storage changes) and the shards are views of it, so nothing is copied, no second
// fp32 copy of the model exists, and ZeRO-1 all-gathers the shards into that buffer in place. Not the update rule (train/optimizer.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "loongforge/parallel/data/grad_buffer.h"

namespace lf::parallel {

class MasterParams {
 public:
  // Copies the current model parameters (through their fp32 values) into the masters.
  explicit MasterParams(const GradBuffer& grads);

  // Copies the model parameters into the masters again (after loading weights without
  // optimizer state).
  void reset_from_model();

  // Per bucket: [owned_end - owned_begin] fp32, aligned with grads.reduced_grad(b).
  std::vector<at::Tensor>& shards() { return shards_; }
  const std::vector<at::Tensor>& shards() const { return shards_; }
  // Writes the masters into the model parameters (rounding to their dtype). Under ZeRO-1 every
  // bucket's shards are all-gathered over DP (async, all buckets in flight, then waited in
  // order), so every DP rank ends with the same full parameters.
  void publish();
  // Bytes held by the masters on this rank (for logs and tests: 1/dp of the model under ZeRO-1).
  int64_t bytes() const;

 private:
  const GradBuffer& grads_;
  bool aliased_ = false;  // fp32: the shards are views of flat_, where the parameters live
  at::Tensor flat_;
  std::vector<at::Tensor> shards_;
  std::vector<at::Tensor> gathered_;  // ZeRO-1: per bucket [numel] in the parameter dtype
};

}  // namespace lf::parallel

// ChunkPipe's keys and values: one chunk of a long sequence attends to the keys/values of the
// chunks before it. The exchange format between the ChunkPipe schedule (which keeps them and
// feeds their gradients back) and the model (which reads the prefix and produces its own). Only
// tensors; no schedule and no attention math here.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace lf::parallel::pipeline {

// Per layer of this stage (index j: its j-th layer), after QK norm and RoPE.
struct ChunkAttention {
  // In: the earlier chunks' keys/values [b, nkv / tp, start, d]; undefined (or empty vectors)
  // for the first chunk of a sequence.
  std::vector<at::Tensor> prefix_k, prefix_v;
  // Out: this chunk's keys/values [b, nkv / tp, c, d], in the autograd graph under grad mode
  // (their gradient from later chunks is fed back as extra backward roots).
  std::vector<at::Tensor> k, v;
};

}  // namespace lf::parallel::pipeline

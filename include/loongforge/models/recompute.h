// Activation checkpointing: run a piece of the model without keeping its intermediate
// activations and recompute them during backward (Megatron's CheckpointFunction, in C++ autograd),
// the job's policy of what to recompute (RecomputeOptions; the decoder layers apply it in
// models/blocks/transformer_layer.h), and its application to a plain stack of blocks.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace lf::parallel {
class RngTracker;
}

namespace lf {
class StreamPair;
}

namespace lf::models {

// Activation recomputation (Megatron's --recompute-*). full: a layer keeps only its input and
// recomputes everything in backward; method uniform groups num_layers consecutive layers per
// checkpoint, block checkpoints the first num_layers layers only. selective: recompute the parts
// whose activations are large and cheap to redo: RoPE + core attention and the MLP activation.
struct RecomputeOptions {
  enum class Granularity { none, full, selective };
  enum class Method { uniform, block };
  Granularity granularity = Granularity::none;
  Method method = Method::uniform;
  int64_t num_layers = 1;
};

using RecomputeFn = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

// Returns fn(inputs) with an autograd graph of one node. `inputs` are the activations fn reads;
// parameters fn uses directly (model leaves) get their gradients accumulated during the
// recomputation's backward, as without recomputation. Backward reruns fn with gradients on,
// with `rng`'s streams (if given) reset to their state at forward time, so dropout masks repeat;
// fn's collectives (tensor parallelism) run again in the same order on every rank. Without grad
// mode, or when no input requires grad, this is fn(inputs). `streams` (the MoE overlap across
// micro-batches): while the replay has `rng` reset, the backward's stream does not hand over to
// the forward's, which would otherwise draw from (and advance) the replayed generator.
at::Tensor recompute(RecomputeFn fn, const std::vector<at::Tensor>& inputs,
                     lf::parallel::RngTracker* rng = nullptr, lf::StreamPair* streams = nullptr);

// A stack of n blocks without dropout (the vision towers): x = block(i, x) for i in [0, n), under
// the job's full recomputation (uniform: groups of num_layers blocks; block: the first num_layers
// blocks, one at a time; else, and for selective, plainly). A group ends at every index of
// `exposed`, and after(i, x) sees the output of each block that ends a group (its last one's
// included). `block` runs again in backward: it must own (capture by value) what it reads.
// The blocks from index i of n that one checkpoint covers, and whether they are recomputed: full
// uniform, min(num_layers, n - i) recomputed; full block, one, recomputed while i < num_layers;
// otherwise one, kept.
struct BlockGroup {
  int64_t size = 1;
  bool recomputed = false;
};
BlockGroup recompute_group(const RecomputeOptions& options, int64_t i, int64_t n);

using BlockFn = std::function<at::Tensor(int64_t index, const at::Tensor& x)>;
at::Tensor run_blocks(int64_t n, at::Tensor x, const RecomputeOptions& options, const BlockFn& block,
                      const std::vector<int64_t>& exposed = {},
                      const std::function<void(int64_t index, const at::Tensor& x)>& after = {});

}  // namespace lf::models

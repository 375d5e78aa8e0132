// Activation checkpointing: run a piece of the model without keeping its intermediate
// activations and recompute them during backward (Megatron's CheckpointFunction, in C++ autograd).
// Not the policy of what to recompute (RecomputeOptions, models/blocks/transformer_layer.h).
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

}  // namespace lf::models

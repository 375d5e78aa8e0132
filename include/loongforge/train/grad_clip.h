// Global-norm gradient clipping under tensor and data parallelism (Megatron's
// get_grad_norm_fp32 + clip_grad_by_total_norm_fp32) over a GradBuffer's reduced gradients.
// Not the reduction itself (train/grad_buffer.h) nor the update (train/optimizer.h).
#pragma once

#include "loongforge/backend/communicator.h"
#include "loongforge/train/grad_buffer.h"

namespace lf::train {

// Who must agree on the norm and how to count each gradient element exactly once.
struct GradNormGroups {
  // The model-parallel group (tp x pp): every rank of it holds different parameters or different
  // shards of them. Null or size 1: none.
  lf::backend::Communicator* model_parallel = nullptr;
  // This rank's index in its TP group: parameters replicated over TP (partition_dim < 0) are
  // counted on TP rank 0 only, TP-sharded ones on every TP rank.
  int tp_rank = 0;
};

// sqrt of the sum of squares of every gradient element of the whole model, after
// grads.finish_grad_sync(). Each rank sums (in fp64, in buffer order) the squares of the elements
// it owns and counts; the sum is all-reduced over DP when each DP rank owns a shard (ZeRO-1),
// then over the model-parallel group. Every rank of the job returns the same value.
double global_grad_norm(const GradBuffer& grads, const GradNormGroups& groups);

// Multiplies the reduced gradients by max_norm / (norm + 1e-6) when that is < 1 (clip_grad > 0).
// Returns the coefficient applied (1 when none).
double clip_grads(GradBuffer& grads, double norm, double max_norm);

}  // namespace lf::train

// Global-norm gradient clipping over every gradient buffer of a model (Megatron's
// get_grad_norm_fp32 + clip_grad_by_total_norm_fp32), whatever each buffer's layout. Not the
// reduction itself (parallel/data/grad_buffer.h) nor the update (train/optimizer.h).
#pragma once

#include <vector>

#include "loongforge/backend/communicator.h"
#include "loongforge/backend/op_table.h"
#include "loongforge/parallel/data/grad_buffer.h"

namespace lf::train {

using lf::parallel::GradBuffer;

// sqrt of the sum of squares of every gradient element of the whole model, after every buffer's
// finish_grad_sync(). Each element is counted by exactly one rank of the job: a parameter
// replicated over its TP group by TP rank 0; a buffer's reduced gradient by its data-parallel
// rank 0, or under ZeRO-1 by the rank owning the shard; a pipeline stage's tied copy not at all
// (the owner counts). Every rank sums its share in fp64 in buffer order, then one all-reduce
// over `world` (null or size 1: none). Every rank of the job returns the same value. `ops`: the
// backend's squared_norm over this rank's pieces (one pass; null: the reference formula).
double global_grad_norm(const std::vector<GradBuffer*>& grads, lf::backend::Communicator* world,
                        const lf::backend::OpTable* ops = nullptr);

// The coefficient clip_grads would apply: max_norm / (norm + 1e-6) when that is < 1, else 1.
double clip_coefficient(double norm, double max_norm);

// Multiplies the reduced gradients by max_norm / (norm + 1e-6) when that is < 1 (max_norm > 0).
// Returns the coefficient applied (1 when none).
double clip_grads(const std::vector<GradBuffer*>& grads, double norm, double max_norm);

// Multiplies every reduced gradient by `factor` (unscaling a loss-scaled backward).
void scale_grads(const std::vector<GradBuffer*>& grads, double factor);

}  // namespace lf::train

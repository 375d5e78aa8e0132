// Pipeline schedules over the micro-batches of one step: no pipelining (every forward, then every
// backward: accumulation only) and 1F1B (Megatron's non-interleaved schedule: pp - stage - 1
// warm-up forwards, then one forward / one backward, then the remaining backwards). A schedule
// runs one stage's part and moves activations and gradients through a StageExchange; the model
// and the data are behind StageStep. Not interleaved (virtual stages) nor ChunkPipe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

#include "loongforge/parallel/pipeline/p2p.h"

namespace lf::parallel::pipeline {

// One stage's model step for one micro-batch, as the schedules see it.
struct StageStep {
  // input: the previous stage's activation for micro-batch m, a leaf that requires grad
  // (undefined on the first stage, which reads its own data). Returns the activation for the next
  // stage, or on the last stage the scalar loss to backpropagate (already scaled).
  std::function<at::Tensor(int64_t m, const at::Tensor& input)> forward;
  // Called right before micro-batch m's backward (e.g. GradBuffer::begin_micro_batch). Backwards
  // run in micro-batch order 0, 1, ... on every stage, in both schedules.
  std::function<void(int64_t m)> before_backward;
};

// Both return, on the last stage, the sum of the scalar losses (0 elsewhere), and leave every
// parameter's gradient accumulated over the micro-batches. Every stage of the group must call
// the same schedule with the same micro-batch count.
double run_without_pipelining(StageExchange& exchange, int64_t micro_batches, const StageStep& step);
double run_1f1b(StageExchange& exchange, int64_t micro_batches, const StageStep& step);

// The number of warm-up forwards of 1F1B on `stage` of `stages` (Megatron: stages - stage - 1,
// at most the micro-batch count).
int64_t warmup_forwards(int stage, int stages, int64_t micro_batches);

}  // namespace lf::parallel::pipeline

// ChunkPipe: pipeline parallelism over the chunks of one very long sequence. The chunks are
// consecutive micro-batches; chunk k attends to the keys/values of chunks 0..k-1, which this
// schedule keeps per stage and whose gradients it feeds back. Activation memory is one chunk's,
// not the sequence's: a first pass runs every chunk forward without autograd, keeping only the
// keys/values (and the stage's input); then, last chunk first, each chunk is recomputed with
// autograd and backpropagated, its keys'/values' gradients from the later chunks added as extra
// roots and its prefix's gradients accumulated for the earlier chunks. Not the 1F1B schedules
// (pipeline/schedules.h), whose micro-batches are independent.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

#include "loongforge/parallel/pipeline/chunk_attention.h"
#include "loongforge/parallel/pipeline/p2p.h"
#include "loongforge/parallel/pipeline/schedules.h"

namespace lf::parallel::pipeline {

struct ChunkPipeStep {
  // Chunk k of the sequence on this stage. input: the previous stage's activation (undefined on
  // the first stage, which reads its own tokens). kv.prefix_*: the earlier chunks' keys/values
  // (set by the schedule); the step's model fills kv.k / kv.v with this chunk's. with_grad false:
  // the first pass, under no-grad, which only needs the keys/values (the last stage may return
  // its hidden states, skipping the head); true: the recomputation whose result is
  // backpropagated, the scaled loss on the last stage. Both passes must compute the same values
  // (e.g. replay the dropout RNG).
  std::function<at::Tensor(int64_t chunk, const at::Tensor& input, ChunkAttention& kv, bool with_grad)> forward;
  // Called right before chunk k's backward (chunks run backward from the last to the first).
  std::function<void(int64_t chunk)> before_backward;
};

// Runs the `chunks` chunks of one sequence (equal lengths) through this stage; returns on the last
// stage the sum of the chunk losses (0 elsewhere) and leaves every parameter's gradient
// accumulated. exchange: nullptr for a single stage (no pipeline). Every stage of the group must
// call it with the same chunk count.
double run_chunkpipe(StageExchange* exchange, int64_t chunks, const ChunkPipeStep& step,
                     ScheduleTrace* trace = nullptr);

}  // namespace lf::parallel::pipeline

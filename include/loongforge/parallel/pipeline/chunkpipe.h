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
#include <map>
#include <string>

#include "loongforge/data/batch.h"
#include "loongforge/parallel/pipeline/chunk_attention.h"
#include "loongforge/parallel/pipeline/p2p.h"
#include "loongforge/parallel/pipeline/schedules.h"

namespace lf::parallel::pipeline {

struct ChunkPipeStep {
  // Chunk k of the sequence on this stage. input: the previous stage's activations (empty on the
  // first stage, which reads its own tokens). kv.prefix_*: the earlier chunks' keys/values (set by
  // the schedule); the step's model fills kv.k / kv.v with this chunk's. with_grad false: the
  // first pass, under no-grad, which only needs the keys/values (the last stage may skip its
  // head); true: the recomputation whose result is backpropagated, the scaled loss on the last
  // stage. Both passes must compute the same values (e.g. replay the dropout RNG).
  std::function<StageResult(int64_t chunk, const TensorMap& input, ChunkAttention& kv, bool with_grad)> forward;
  // Called right before chunk k's backward (chunks run backward from the last to the first).
  std::function<void(int64_t chunk)> before_backward;
};

// Runs the `chunks` chunks of one sequence (equal lengths) through this stage; returns on the last
// stage the sum of the chunk losses (0 elsewhere) and leaves every parameter's gradient
// accumulated. exchange: nullptr for a single stage (no pipeline). Every stage of the group must
// call it with the same chunk count.
double run_chunkpipe(StageExchange* exchange, int64_t chunks, const ChunkPipeStep& step,
                     ScheduleTrace* trace = nullptr);

// A model as ChunkPipe drives it over one micro-batch: `forward` runs this stage on one chunk
// (`chunk`: the micro-batch's sequence fields cut to positions [start, start + c)); `with_head`
// false on the last stage skips the head and the loss (the first pass). The RNG hooks (optional)
// save and restore the model's dropout streams, so the recomputation draws the first pass's masks.
struct ChunkedStage {
  std::function<StageResult(const lf::data::Batch& chunk, const TensorMap& input, int64_t start,
                            ChunkAttention& kv, bool with_head)>
      forward;
  std::function<std::map<std::string, at::Tensor>()> rng_state;
  std::function<void(const std::map<std::string, at::Tensor>&)> set_rng_state;
  std::function<void(int64_t chunk)> before_backward;
};

// Training: the sequence of `micro_batch` in chunks of chunk_size (every sequence field sliced),
// run_chunkpipe with the dropout streams saved before each chunk's first pass and replayed in its
// recomputation; afterwards the streams continue where the first pass left them. Returns the last
// stage's loss sum.
double chunkpipe_train(StageExchange* exchange, const lf::data::Batch& micro_batch, int64_t sequence_length,
                       int64_t chunk_size, const ChunkedStage& stage, ScheduleTrace* trace = nullptr);

// Evaluation: forward only, chunk after chunk, each chunk's prefix the concatenation of the
// earlier chunks' keys/values; under pipeline parallelism the chunks travel the stages in order.
// `stage.forward` is called with with_head = true; on the last stage its result is the caller's
// (it scores inside the callback).
void chunkpipe_evaluate(StageExchange* exchange, const lf::data::Batch& micro_batch, int64_t sequence_length,
                        int64_t chunk_size, const ChunkedStage& stage);

}  // namespace lf::parallel::pipeline

// Pipeline schedules over the micro-batches of one step: no pipelining (every forward, then every
// backward: accumulation only), 1F1B (Megatron's non-interleaved schedule: pp - stage - 1
// warm-up forwards, then one forward / one backward, then the remaining backwards) and
// interleaved 1F1B over virtual stages (Megatron's order). A schedule runs one stage's part and
// moves activations and gradients through a StageExchange; the model and the data are behind
// StageStep. ChunkPipe (chunks of one sequence) is parallel/pipeline/chunkpipe.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loongforge/core/trace_spans.h"
#include "loongforge/parallel/pipeline/p2p.h"

namespace lf::parallel::pipeline {

using lf::data::TensorMap;

// What one forward of a stage produced.
struct StageResult {
  TensorMap activations;  // for the next stage (every stage but the last)
  at::Tensor loss;        // the last stage: the scalar to backpropagate (already scaled)
};

// One stage's model step for one micro-batch, as the schedules see it.
struct StageStep {
  // input: the previous stage's activations for micro-batch m (empty on the first stage, which
  // reads its own data); entries that carry gradients are leaves that require grad. Returns the
  // activations for the next stage, or on the last stage the scaled loss.
  std::function<StageResult(int64_t m, const TensorMap& input)> forward;
  // Called right before micro-batch m's backward (e.g. GradBuffer::begin_micro_batch). Backwards
  // run in micro-batch order 0, 1, ... on every stage, in both schedules.
  std::function<void(int64_t m)> before_backward;
  // The MoE overlap across micro-batches (empty: none). When set, run_1f1b warms up with one
  // forward more than 1F1B (min(stages - stage, m)), so that in the steady state the forward of
  // micro-batch i + warm-up and the backward of i do not depend on each other on any stage, and
  // runs each such pair through it: forward and backward (each with its receive and send) as two
  // streams taking turns (lf::StreamPair); the call returns when both have.
  std::function<void(const std::function<void()>& forward, const std::function<void()>& backward)> run_pair;
};

// The interleaved schedule's step: rank r's model chunk c is virtual stage c * pp + r.
struct VirtualStageStep {
  // As StageStep::forward for model chunk `chunk`. input is empty only for chunk 0 on the first
  // stage; the last stage's last chunk returns the scaled loss.
  std::function<StageResult(int chunk, int64_t m, const TensorMap& input)> forward;
  // Before each backward; `final`: the last backward of the step on this rank (chunk 0 of the
  // last micro-batch), after which every gradient of this rank is complete.
  std::function<void(int chunk, int64_t m, bool final)> before_backward;
  // The MoE overlap across micro-batches (empty: none), as StageStep::run_pair: the order warms up
  // with one forward more (interleaved_1f1b_order's `paired`) and each steady-state forward runs
  // with the backward after it. Both receives come first, then the two computations as a pair,
  // then both sends (forward's first), so a transport matching messages by order still pairs them.
  std::function<void(const std::function<void()>& forward, const std::function<void()>& backward)> run_pair;
};

// Backpropagates one stage's forward: the output entries that require grad with `output_grads`
// (by name; the last stage: the loss alone), then returns the gradients of the input entries
// that require grad (zeros where none reached them: the previous stage waits for each).
TensorMap stage_backward(const StageResult& output, const TensorMap& output_grads, const TensorMap& input,
                         bool last, const std::string& where);

// One compute call of a schedule on one stage.
struct ScheduledOp {
  char kind;  // 'F' or 'B'
  int chunk;
  int64_t micro_batch;
  bool paired = false;  // a forward that runs with the next op, a backward (the MoE overlap's pairs)
  bool operator==(const ScheduledOp&) const = default;
};

// Megatron's interleaved 1F1B order on `stage` of `stages` with `chunks` model chunks per stage:
// forward k runs chunk (k mod (pp v)) / pp of micro-batch (k / (pp v)) pp + k mod pp, backward k
// the chunks in reverse; 2 (pp - stage - 1) + (v - 1) pp warm-up forwards (all of them when
// m == pp), then one forward / one backward, then the remaining backwards. Needs m a multiple of
// pp (an error naming both). With equal chunk costs the bubble is (pp - 1) / (v m + pp - 1).
// `paired` (VirtualStageStep::run_pair): one warm-up forward more, and each steady-state forward
// marked to run with the backward after it. Neither op of such a pair needs the other's result on
// any stage (tests/parallel/test_pipeline.cpp simulates the pairs as single steps).
std::vector<ScheduledOp> interleaved_1f1b_order(int stage, int stages, int chunks, int64_t micro_batches,
                                                bool paired = false);

// A timeline of one stage's compute (--pipeline-trace): each forward and backward with its start
// and duration, and the span of each step, which starts and ends at a barrier of the pipeline
// group so that every stage measures the same step time. Times: microseconds of the machine's
// steady clock (comparable between processes on one node).
struct ScheduleTrace {
  struct Event {
    char kind;  // 'F' or 'B'
    int64_t micro_batch;
    double start_us, duration_us;
    int chunk = 0;  // model chunk (interleaved schedule)
  };
  std::vector<Event> events;
  std::vector<std::pair<double, double>> steps;  // [start, end) of each traced step
  // Work inside the forwards and backwards that the model records (Model::set_trace), each
  // drawn on its own named row below the schedule's.
  lf::TraceSpans spans;

  // Idle share of this stage over the traced steps: 1 - compute time / step time (compute time:
  // the union of the forwards' and backwards' spans, which overlap when micro-batches pair). For
  // equal stages of fixed cost 1F1B gives (p - 1) / (m + p - 1).
  double bubble_fraction() const;
  // Chrome trace JSON (chrome://tracing, Perfetto): one complete event per forward/backward on
  // row `stage`, plus one per step, plus the model's spans on their named rows.
  void write_chrome_trace(const std::string& path, int stage) const;
};

// Both return, on the last stage, the sum of the scalar losses (0 elsewhere), and leave every
// parameter's gradient accumulated over the micro-batches. Every stage of the group must call
// the same schedule with the same micro-batch count (and all of them with a trace, or none).
double run_without_pipelining(StageExchange& exchange, int64_t micro_batches, const StageStep& step,
                              ScheduleTrace* trace = nullptr);
double run_1f1b(StageExchange& exchange, int64_t micro_batches, const StageStep& step,
                ScheduleTrace* trace = nullptr);

// Interleaved 1F1B over this stage's `chunks` model chunks (interleaved_1f1b_order). Activations
// and gradients travel the ring of StageExchange with message ids checked. Every stage must use the
// same chunk and micro-batch counts.
double run_interleaved_1f1b(StageExchange& exchange, int chunks, int64_t micro_batches,
                            const VirtualStageStep& step, ScheduleTrace* trace = nullptr);

// The number of warm-up forwards of 1F1B on `stage` of `stages` (Megatron: stages - stage - 1,
// at most the micro-batch count); `paired` (StageStep::run_pair): one more.
int64_t warmup_forwards(int stage, int stages, int64_t micro_batches, bool paired = false);

}  // namespace lf::parallel::pipeline

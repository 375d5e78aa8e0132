// Pipeline schedules over the micro-batches of one step: no pipelining (every forward, then every
// backward: accumulation only) and 1F1B (Megatron's non-interleaved schedule: pp - stage - 1
// warm-up forwards, then one forward / one backward, then the remaining backwards). A schedule
// runs one stage's part and moves activations and gradients through a StageExchange; the model
// and the data are behind StageStep. Not interleaved (virtual stages) nor ChunkPipe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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

// A timeline of one stage's compute (--pipeline-trace): each forward and backward with its start
// and duration, and the span of each step, which starts and ends at a barrier of the pipeline
// group so that every stage measures the same step time. Times: microseconds of the machine's
// steady clock (comparable between processes on one node).
struct ScheduleTrace {
  struct Event {
    char kind;  // 'F' or 'B'
    int64_t micro_batch;
    double start_us, duration_us;
  };
  std::vector<Event> events;
  std::vector<std::pair<double, double>> steps;  // [start, end) of each traced step

  // Idle share of this stage over the traced steps: 1 - compute time / step time. For equal
  // stages of fixed cost 1F1B gives (p - 1) / (m + p - 1).
  double bubble_fraction() const;
  // Chrome trace JSON (chrome://tracing, Perfetto): one complete event per forward/backward on
  // row `stage`, plus one per step.
  void write_chrome_trace(const std::string& path, int stage) const;
};

// Both return, on the last stage, the sum of the scalar losses (0 elsewhere), and leave every
// parameter's gradient accumulated over the micro-batches. Every stage of the group must call
// the same schedule with the same micro-batch count (and all of them with a trace, or none).
double run_without_pipelining(StageExchange& exchange, int64_t micro_batches, const StageStep& step,
                              ScheduleTrace* trace = nullptr);
double run_1f1b(StageExchange& exchange, int64_t micro_batches, const StageStep& step,
                ScheduleTrace* trace = nullptr);

// The number of warm-up forwards of 1F1B on `stage` of `stages` (Megatron: stages - stage - 1,
// at most the micro-batch count).
int64_t warmup_forwards(int stage, int stages, int64_t micro_batches);

}  // namespace lf::parallel::pipeline

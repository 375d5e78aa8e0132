// Where a training step's time goes: the PyTorch profiler (Kineto, CPU activities) around the
// iterations [profile_step_start, profile_step_end) (Megatron's --profile), each op's self time
// (its duration less that of the ops it called) summed by category, and a Chrome trace. Not a
// timer of the whole run (the progress line's tokens/s) nor a memory profile.
//
// Categories, by the op itself or the nearest enclosing LoongForge scope: GEMMs (split into the
// output layer's and the rest), attention, norms/activations/RoPE, the cross entropy's own
// element-wise work, the optimizer, the gradient buffer (accumulation, reduction, zeroing),
// tensor allocation (aten::empty*), other ATen ops (element-wise, copies), and the wall time of
// the profiled steps outside any op (the trainer's own code, autograd bookkeeping).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace lf::train {

struct ProfileRow {
  std::string name;
  double ms = 0;   // self time over the profiled steps
  int64_t calls = 0;
};

struct ProfileReport {
  int64_t steps = 0;
  double wall_ms = 0;                 // the profiled steps, end to end
  std::vector<ProfileRow> categories; // by category, largest first; sums to wall_ms
  std::vector<ProfileRow> top_ops;    // the ops with the most self time, largest first
  std::vector<std::string> lines() const;  // "profile | ..." lines for the log
};

class StepProfiler {
 public:
  StepProfiler();
  ~StepProfiler();
  void start();
  // Stops; writes the Chrome trace to `trace_path` when not empty.
  ProfileReport stop(int64_t steps, const std::string& trace_path);
  bool running() const { return running_; }

 private:
  bool running_ = false;
  double start_ms_ = 0;
};

}  // namespace lf::train

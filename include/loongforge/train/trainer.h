// The training loop: micro-batches with gradient accumulation into the bucketed fp32 gradient
// buffer (train/grad_buffer.h: overlapped DP reduction, ZeRO-1), AdamW with the LR schedule
// (train/optimizer.h), periodic logging (terminal and --metrics-file JSON lines), validation,
// NaN/Inf detection (stop, or skip under training.skip_nonfinite_steps), deterministic mode and
// the exit conditions. Model and data are given to it; it does not build them (tools/train does),
// and it does not parallelise the model itself. See docs/training.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>

#include "loongforge/backend/device_backend.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/decoder.h"

namespace lf::train {

// Where micro-batches come from: next() returns this data-parallel rank's next micro-batch of
// tokens [micro_batch_size, seq_length + 1] (int64; inputs are [:, :-1], labels [:, 1:]).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual at::Tensor next() = 0;
  // Starts over from the first micro-batch (validation: every evaluation sees the same data).
  virtual void rewind() {}
  // Resume: continue after `consumed_samples` samples of the global stream (all DP ranks).
  // false: not supported (the trainer then skips whole micro-batches with next()).
  virtual bool seek(int64_t consumed_samples) { return false; }
};

struct EvalResult {
  double loss = 0;      // mean per-token loss over the evaluated tokens
  double accuracy = 0;  // fraction of tokens whose argmax prediction equals the label
  int64_t tokens = 0;
};

struct TrainSummary {
  int64_t iterations = 0;
  double last_loss = 0;
  EvalResult first_eval, last_eval;
  double tokens_per_sec = 0;
  int64_t start_iteration = 0;  // loaded from --load (0: fresh start)
  bool preempted = false;       // stopped by SIGTERM after saving a checkpoint
};

class Trainer {
 public:
  Trainer(const lf::config::JobConfig& job, lf::models::Decoder& model,
          const lf::dist::ParallelContext& ctx, const lf::backend::DeviceBackend& backend,
          std::unique_ptr<BatchSource> train_data, std::unique_ptr<BatchSource> valid_data);
  ~Trainer();

  // The resolved configuration saved as config.yaml in checkpoints.
  void set_config_yaml(std::string yaml);
  // Loads --load (when set), trains to train_iters with --save checkpoints, SIGTERM handling and
  // a final save (docs/checkpoints.md).
  TrainSummary run();
  // Validation over eval_iters micro-batches per DP rank, averaged over the data-parallel group.
  EvalResult evaluate();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The model's activation recomputation from training.recompute_* (Megatron semantics: uniform
// with num_layers 1 when only the granularity is given).
lf::models::RecomputeOptions recompute_options(const lf::config::TrainingConfig& t);

// Micro-batches per step: global_batch_size / (micro_batch_size * dp); throws naming the values
// when they do not divide.
int64_t num_micro_batches(const lf::config::TrainingConfig& t, int dp_size);

}  // namespace lf::train

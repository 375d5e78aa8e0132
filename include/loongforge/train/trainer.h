// The training loop over any lf::models::Model: micro-batches as named tensors, one gradient
// buffer per parameter group (parallel/data/grad_buffer.h: overlapped DP reduction, ZeRO-1), the
// optimizer (AdamW / SGD, train/optimizer.h) with the LR schedule and loss scaling (fp16), the
// pipeline schedules (1F1B, interleaved, ChunkPipe) over the model's stage, periodic logging
// (terminal, --metrics-file JSON lines, --tensorboard-dir), validation, NaN/Inf handling,
// deterministic mode and the exit conditions. Loss terms are normalised by their unit counts over
// the whole global batch. Model and data are given to it; it does not build them (tools/train
// does), it never names a model family. See docs/training.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "loongforge/backend/device_backend.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/data/batch.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/model.h"
#include "loongforge/train/checkpoint.h"

namespace lf::train {

// Where micro-batches come from: next() returns this data-parallel rank's next micro-batch (CPU
// tensors; the trainer moves them to the device).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual lf::data::Batch next() = 0;
  // Starts over from the first micro-batch (validation: every evaluation sees the same data).
  virtual void rewind() {}
  // Resume: continue after `consumed_samples` samples of the global stream (all DP ranks).
  // false: not supported (the trainer then skips whole micro-batches with next()).
  virtual bool seek(int64_t consumed_samples) { return false; }
  // After each training step: this rank's forward/backward seconds for the micro-batches just
  // read (from the step's loss-count reduction to the start of the gradient reduction, so not the
  // time spent waiting for slower ranks). Load-balancing sources fit their cost model on it.
  virtual void report_compute_seconds(double seconds) {}
};

struct EvalResult {
  lf::models::Metrics metrics;  // summed over every evaluated micro-batch and rank
  bool ran = false;
  // sum / count of `name` (0 when absent).
  double value(const std::string& name) const;
};

struct TrainSummary {
  int64_t iterations = 0;
  double last_loss = 0;
  EvalResult first_eval, last_eval;
  double tokens_per_sec = 0;
  int64_t start_iteration = 0;    // loaded from --load (0: fresh start)
  int64_t skipped_iterations = 0; // fp16 overflows and skipped non-finite steps
  bool preempted = false;         // stopped by SIGTERM after saving a checkpoint
};

// Seams for tests only (a program's test build installs them; production passes none).
struct TrainerHooks {
  std::function<void(int64_t iteration, int global_rank)> after_iteration;
  SaveHooks* save = nullptr;
};

class Trainer {
 public:
  Trainer(const lf::config::JobConfig& job, lf::models::Model& model, const lf::dist::ParallelContext& ctx,
          const lf::backend::DeviceBackend& backend, std::unique_ptr<BatchSource> train_data,
          std::unique_ptr<BatchSource> valid_data, TrainerHooks hooks = {});
  ~Trainer();

  // The resolved configuration saved as config.yaml in checkpoints.
  void set_config_yaml(std::string yaml);
  // Loads --load (when set), trains to train_iters with --save checkpoints, SIGTERM handling and
  // a final save (docs/checkpoints.md).
  TrainSummary run();
  // Validation over eval_iters micro-batches per DP rank; every rank gets the same sums.
  EvalResult evaluate();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The model's activation recomputation from training.recompute_* (Megatron semantics: uniform
// with num_layers 1 when only the granularity is given).
lf::models::RecomputeOptions recompute_options(const lf::config::TrainingConfig& t);

// The FP8 policy of training.fp8_* (null: fp8_format unset): every FP8-capable GEMM, or the
// --fp8-policy file's choices (read and checked here: a bad file throws naming it and the key).
std::unique_ptr<lf::ops::Fp8Policy> fp8_policy(const lf::config::TrainingConfig& t);

// Micro-batches per step: global_batch_size / (micro_batch_size * dp); throws naming the values
// when they do not divide.
int64_t num_micro_batches(const lf::config::TrainingConfig& t, int dp_size);

// How a metric or loss term is shown in the progress line and the final summary: "lm loss" as
// "loss", others as named.
std::string display_name(const std::string& metric);

}  // namespace lf::train

// Learning-rate schedule with Megatron's semantics: linear warmup from lr_warmup_init, then
// constant / linear / cosine / inverse-square-root / WSD decay to min_lr over lr_decay_iters.
// Megatron steps its scheduler after every successful optimizer update, so an update uses the
// value at the number of updates completed before it: the first update runs at lr(0) (with
// warmup: lr_warmup_init), and a skipped update (fp16 overflow, a skipped non-finite step) does
// not advance it. A pure function of that count, which checkpoints store. Not the optimizer.
#pragma once

#include <cstdint>

#include "loongforge/core/config/job_config.h"

namespace lf::train {

class LrSchedule {
 public:
  // train_iters fills lr_decay_iters when that is unset, and the warmup fraction's base.
  LrSchedule(const lf::config::OptimizerConfig& config, int64_t train_iters);
  // The learning rate after `completed` successful updates (Megatron's get_lr at num_steps).
  double lr(int64_t completed) const;
  int64_t warmup_iters() const { return warmup_; }
  int64_t decay_iters() const { return decay_; }

 private:
  lf::config::OptimizerConfig c_;
  int64_t warmup_ = 0, decay_ = 0, wsd_decay_ = 0;
};

}  // namespace lf::train

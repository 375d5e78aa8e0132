// Learning-rate schedule with Megatron's semantics: linear warmup from lr_warmup_init, then
// constant / linear / cosine / inverse-square-root / WSD decay to min_lr over lr_decay_iters.
// A pure function of the iteration, so resume only needs the iteration. Not the optimizer.
#pragma once

#include <cstdint>

#include "loongforge/core/config/job_config.h"

namespace lf::train {

class LrSchedule {
 public:
  // train_iters fills lr_decay_iters when that is unset, and the warmup fraction's base.
  LrSchedule(const lf::config::OptimizerConfig& config, int64_t train_iters);
  // The learning rate of iteration `step` (1-based: the first update uses lr(1)).
  double lr(int64_t step) const;
  int64_t warmup_iters() const { return warmup_; }
  int64_t decay_iters() const { return decay_; }

 private:
  lf::config::OptimizerConfig c_;
  int64_t warmup_ = 0, decay_ = 0, wsd_decay_ = 0;
};

}  // namespace lf::train

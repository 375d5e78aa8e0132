// Loss scaling for fp16 training (Megatron's grad scalers): the loss is multiplied by the scale
// before backward and the gradients divided by it before the update. Dynamic: the scale halves
// (backoff) after `hysteresis` steps whose gradients overflowed (inf/NaN: the step is skipped)
// and doubles after `window` overflow-free steps; constant: a fixed scale (--loss-scale), in any
// precision. State (scale and trackers) goes into checkpoints. Not the optimizer.
#pragma once

#include <cstdint>

#include "loongforge/core/config/job_config.h"

namespace lf::train {

class LossScaler {
 public:
  // From the training section: fp16 without loss_scale -> dynamic; loss_scale -> constant;
  // otherwise scale 1 (inactive).
  explicit LossScaler(const lf::config::TrainingConfig& t);
  LossScaler(double initial, double min_scale, int64_t window, int64_t hysteresis, bool dynamic);

  double scale() const { return scale_; }
  bool active() const { return dynamic_ || scale_ != 1.0; }
  bool dynamic() const { return dynamic_; }
  // After a step: found_inf is whether the unscaled gradients were not finite.
  void update(bool found_inf);

  struct State {
    double scale = 1;
    int64_t growth_tracker = 0, hysteresis_tracker = 0;
  };
  State state() const { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  void set_state(const State& s);

 private:
  double scale_ = 1, min_scale_ = 1;
  int64_t window_ = 1000, hysteresis_ = 2;
  bool dynamic_ = false;
  int64_t growth_tracker_ = 0, hysteresis_tracker_ = 2;
};

}  // namespace lf::train

#include "loongforge/train/loss_scaler.h"

#include <algorithm>

#include "loongforge/core/error.h"

namespace lf::train {

LossScaler::LossScaler(const lf::config::TrainingConfig& t) {
  if (t.loss_scale) {
    scale_ = *t.loss_scale;
    LF_CHECK(scale_ > 0, "training.loss_scale must be positive, got ", scale_);
  } else if (t.fp16) {
    *this = LossScaler(t.initial_loss_scale, t.min_loss_scale, t.loss_scale_window, t.hysteresis, true);
  }
}

LossScaler::LossScaler(double initial, double min_scale, int64_t window, int64_t hysteresis, bool dynamic)
    : scale_(initial), min_scale_(min_scale), window_(window), hysteresis_(hysteresis), dynamic_(dynamic),
      hysteresis_tracker_(hysteresis) {
  LF_CHECK(initial > 0 && min_scale > 0 && window >= 1 && hysteresis >= 1, "loss scaler: initial ", initial,
           ", min ", min_scale, ", window ", window, ", hysteresis ", hysteresis, " (all must be positive)");
}

void LossScaler::update(bool found_inf) {
  if (!dynamic_) return;
  if (found_inf) {
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * 0.5, min_scale_);
    return;
  }
  if (++growth_tracker_ == window_) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = hysteresis_;
    scale_ *= 2.0;
  }
}

void LossScaler::set_state(const State& s) {
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  hysteresis_tracker_ = s.hysteresis_tracker;
}

}  // namespace lf::train

#include "loongforge/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "loongforge/core/error.h"

namespace lf::train {

LrSchedule::LrSchedule(const lf::config::OptimizerConfig& c, int64_t train_iters) : c_(c) {
  decay_ = c.lr_decay_iters.value_or(train_iters);
  warmup_ = c.lr_warmup_fraction ? static_cast<int64_t>(*c.lr_warmup_fraction * decay_)
                                 : c.lr_warmup_iters;
  LF_CHECK(warmup_ <= decay_, "lr warmup (", warmup_, " iterations) is longer than the decay (",
           decay_, " iterations)", lf::hint("lower --lr-warmup-iters or raise --lr-decay-iters"));
  wsd_decay_ = c.lr_wsd_decay_iters.value_or(decay_ - warmup_);
}

double LrSchedule::lr(int64_t step) const {
  const double max_lr = c_.lr, min_lr = c_.min_lr;
  if (warmup_ > 0 && step <= warmup_)
    return c_.lr_warmup_init + (max_lr - c_.lr_warmup_init) * static_cast<double>(step) / warmup_;
  const std::string& style = c_.lr_decay_style;
  if (style == "constant") return max_lr;
  if (step > decay_) return min_lr;
  if (style == "inverse-square-root") {
    double w = std::max<int64_t>(warmup_, 1);
    return std::max(min_lr, max_lr * std::sqrt(w) / std::sqrt(std::max<int64_t>(step, 1)));
  }
  const double ratio = static_cast<double>(step - warmup_) / std::max<int64_t>(decay_ - warmup_, 1);
  double coeff = 0;
  if (style == "linear") {
    coeff = 1.0 - ratio;
  } else if (style == "cosine") {
    coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  } else if (style == "WSD") {
    const int64_t anneal_start = decay_ - wsd_decay_;
    if (step <= anneal_start) {
      coeff = 1.0;
    } else {
      const double r = static_cast<double>(step - anneal_start) / std::max<int64_t>(wsd_decay_, 1);
      const std::string& s = c_.lr_wsd_decay_style;
      if (s == "linear") coeff = 1.0 - r;
      else if (s == "cosine") coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0);
      else if (s == "minus_sqrt") coeff = 1.0 - std::sqrt(r);
      else coeff = 2.0 * std::pow(0.5, r) - 1.0;  // exponential
    }
  } else {
    LF_FAIL("unknown lr_decay_style '", style, "'");
  }
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace lf::train

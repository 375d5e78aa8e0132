#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "loongforge/train/lr_schedule.h"

namespace {
using lf::config::OptimizerConfig;

OptimizerConfig base(std::string style) {
  OptimizerConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.lr_warmup_iters = 10;
  c.lr_decay_style = std::move(style);
  return c;
}

TEST(LrSchedule, LinearWarmupFromInit) {
  auto c = base("constant");
  c.lr_warmup_init = 0.2;
  lf::train::LrSchedule s(c, 110);
  EXPECT_DOUBLE_EQ(s.lr(1), 0.2 + 0.8 * 1 / 10.0);
  EXPECT_DOUBLE_EQ(s.lr(5), 0.2 + 0.8 * 5 / 10.0);
  EXPECT_DOUBLE_EQ(s.lr(10), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(50), 1.0);  // constant after warmup
}

TEST(LrSchedule, CosineAndLinearMatchMegatronFormulas) {
  lf::train::LrSchedule cos(base("cosine"), 110), lin(base("linear"), 110);
  for (int step : {11, 35, 60, 99, 110}) {
    double ratio = (step - 10) / 100.0;
    EXPECT_NEAR(cos.lr(step), 0.1 + 0.9 * 0.5 * (std::cos(std::numbers::pi * ratio) + 1), 1e-12);
    EXPECT_NEAR(lin.lr(step), 0.1 + 0.9 * (1 - ratio), 1e-12);
  }
  EXPECT_DOUBLE_EQ(cos.lr(500), 0.1);  // past the decay: min_lr
}

TEST(LrSchedule, WsdHoldsThenDecays) {
  auto c = base("WSD");
  c.lr_wsd_decay_iters = 20;
  c.lr_wsd_decay_style = "linear";
  lf::train::LrSchedule s(c, 110);
  EXPECT_DOUBLE_EQ(s.lr(90), 1.0);                       // stable phase ends at 110 - 20
  EXPECT_NEAR(s.lr(100), 0.1 + 0.9 * (1 - 10 / 20.0), 1e-12);
  EXPECT_NEAR(s.lr(110), 0.1, 1e-12);
}

TEST(LrSchedule, InverseSquareRoot) {
  lf::train::LrSchedule s(base("inverse-square-root"), 1000);
  EXPECT_NEAR(s.lr(40), std::sqrt(10.0) / std::sqrt(40.0), 1e-12);
  EXPECT_DOUBLE_EQ(s.lr(100000), 0.1);  // floored at min_lr
}

TEST(LrSchedule, WarmupLongerThanDecayIsAnError) {
  auto c = base("cosine");
  c.lr_warmup_iters = 200;
  EXPECT_THROW(lf::train::LrSchedule(c, 100), lf::Error);
}
}  // namespace

namespace {
// Megatron's OptimizerParamScheduler.get_lr at num_steps (megatron/core/optimizer_param_scheduler.py),
// written out independently of lr_schedule.cpp: the oracle for every decay style.
double megatron_get_lr(const OptimizerConfig& c, int64_t decay_steps, int64_t warmup_steps, int64_t wsd_steps,
                       int64_t num_steps) {
  const double max_lr = c.lr, min_lr = c.min_lr, init_lr = c.lr_warmup_init;
  if (warmup_steps > 0 && num_steps <= warmup_steps)
    return init_lr + (max_lr - init_lr) * static_cast<double>(num_steps) / static_cast<double>(warmup_steps);
  if (c.lr_decay_style == "constant") return max_lr;
  if (num_steps > decay_steps) return min_lr;
  if (c.lr_decay_style == "inverse-square-root") {
    const double w = static_cast<double>(std::max<int64_t>(warmup_steps, 1)), n = static_cast<double>(std::max<int64_t>(num_steps, 1));
    return std::max(min_lr, max_lr * std::pow(w, 0.5) / std::pow(n, 0.5));
  }
  const double ratio = static_cast<double>(num_steps - warmup_steps) / static_cast<double>(decay_steps - warmup_steps);
  double coeff = 0;
  if (c.lr_decay_style == "linear") coeff = 1.0 - ratio;
  if (c.lr_decay_style == "cosine") coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  if (c.lr_decay_style == "WSD") {
    const int64_t anneal_start = decay_steps - wsd_steps;
    if (num_steps <= anneal_start) {
      coeff = 1.0;
    } else {
      const double r = static_cast<double>(num_steps - anneal_start) / static_cast<double>(wsd_steps);
      const auto& s = c.lr_wsd_decay_style;
      if (s == "linear") coeff = 1.0 - r;
      if (s == "cosine") coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0);
      if (s == "exponential") coeff = 2.0 * std::pow(0.5, r) - 1.0;
      if (s == "minus_sqrt") coeff = 1.0 - std::sqrt(r);
    }
  }
  return min_lr + coeff * (max_lr - min_lr);
}

// Every decay style (and WSD's four anneals), with and without warmup and a warmup init, at every
// number of completed updates: lr(k) is Megatron's get_lr after k scheduler steps. The trainer
// uses lr(updates so far) for the next update, so the first update runs at lr(0).
TEST(LrSchedule, EveryStyleMatchesMegatronsGetLrAtEveryStep) {
  const int64_t train_iters = 40;
  for (std::string style : {"constant", "linear", "cosine", "inverse-square-root", "WSD"})
    for (std::string wsd : {"linear", "cosine", "exponential", "minus_sqrt"})
      for (int64_t warmup : {0, 5})
        for (double init : {0.0, 0.25}) {
          if (style != "WSD" && wsd != "linear") continue;
          OptimizerConfig c;
          c.lr = 2.0;
          c.min_lr = 0.2;
          c.lr_decay_style = style;
          c.lr_warmup_iters = warmup;
          c.lr_warmup_init = init;
          c.lr_decay_iters = 30;
          c.lr_wsd_decay_iters = 12;
          c.lr_wsd_decay_style = wsd;
          lf::train::LrSchedule s(c, train_iters);
          for (int64_t k = 0; k <= train_iters; ++k)
            EXPECT_NEAR(s.lr(k), megatron_get_lr(c, 30, warmup, 12, k), 1e-12)
                << style << "/" << wsd << " warmup " << warmup << " init " << init << " after " << k << " updates";
        }
  // The example: --lr-warmup-iters 3 --lr 4e-3: 0, 1.33e-3, 2.67e-3, 4e-3 for the first
  // four updates.
  OptimizerConfig c;
  c.lr = 4e-3;
  c.lr_warmup_iters = 3;
  c.lr_decay_style = "constant";
  lf::train::LrSchedule s(c, 10);
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_NEAR(s.lr(1), 4e-3 / 3, 1e-15);
  EXPECT_NEAR(s.lr(2), 8e-3 / 3, 1e-15);
  EXPECT_EQ(s.lr(3), 4e-3);
}
}  // namespace

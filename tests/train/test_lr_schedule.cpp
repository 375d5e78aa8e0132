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

// Helpers shared by the FP8 training tests (test_fp8_program.cpp, test_fp8_delayed_program.cpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "pp_training.h"

namespace lf::testing {

// The largest per-step loss difference of two runs, relative to a's.
inline double worst_loss_rel(const TrainRun& a, const TrainRun& b) {
  double worst = 0;
  for (size_t i = 0; i < a.losses.size() && i < b.losses.size(); ++i)
    worst = std::max(worst, std::abs(a.losses[i] - b.losses[i]) / std::abs(a.losses[i]));
  return worst;
}

// configs/demo_moe.yaml (8 experts top-2 after a dense first layer, shared experts, MTP) for 10
// steps of a global batch of 8 in micro-batches of 2 x 32 tokens.
inline TrainRun fp8_moe_run(int procs, std::vector<std::string> extra, const std::string& tag) {
  std::vector<std::string> a{"--global-batch-size", "8", "--micro-batch-size", "2", "--seq-length", "32",
                             "--lr", "3e-3", "--lr-warmup-iters", "2"};
  a.insert(a.end(), extra.begin(), extra.end());
  return train_example(source_dir() + "/configs/demo_moe.yaml", procs, a, tag);
}

// loongforge-train on `config` (default: the demo) for 3 steps with `args` must stop with a
// non-zero exit and every string of `want` in its output.
inline void expect_train_refused(const std::vector<std::string>& args, const std::vector<std::string>& want,
                                 const std::string& config = "") {
  std::vector<std::string> argv{bin("loongforge-train"), "--config-file",
                                config.empty() ? source_dir() + "/configs/demo.yaml" : config,
                                "--train-iters", "3", "--lr-warmup-iters", "1", "--eval-iters", "0"};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto r = run_command(argv, {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(120));
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (const auto& w : want) EXPECT_NE(r.output.find(w), std::string::npos) << "want '" << w << "' in:\n" << r.output;
}

// loongforge-fp8-policy at the demo's shapes (tiny, one timed call each, fp32) writing `out`.
inline RankResult run_fp8_policy_for_demo(const std::string& out, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv{bin("loongforge-fp8-policy"), "--hidden-size", "64", "--ffn-hidden-size", "172",
                                "--num-attention-heads", "4", "--num-query-groups", "2", "--swiglu",
                                "--tokens", "64,256", "--dtype", "fp32", "--iters", "1", "--warmup", "0",
                                "--out", out};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_command(argv, {{"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(120));
}

}  // namespace lf::testing

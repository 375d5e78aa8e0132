// Training runs for the program-level equivalence tests: loongforge-train (under loongforge-run
// for several processes) on the demo model with mock data for 10 steps, its per-step losses and
// gradient norms from the metrics file and the final parameters (every pipeline stage's dump
// merged), and the comparison of two such runs. Shared by test_tp_program.cpp,
// test_pp_program.cpp and test_chunkpipe_program.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "multiprocess.h"
#include "program_testing.h"

namespace lf::testing {

using Params = std::map<std::string, std::vector<float>>;

struct TrainRun {
  std::vector<double> losses, grad_norms;
  Params params;
  std::string output;
  int exit_code = -1;
};

// Runs a training command line (one OpenMP thread, parameters dumped to DIR/p.safetensors) and
// reads the per-step losses and gradient norms of its metrics file DIR/m.jsonl; the parameters
// are left to the caller (a pipeline run dumps one file per stage).
inline TrainRun run_training(const std::vector<std::string>& argv, const std::string& dir) {
  auto r = run_command(argv, {{"OMP_NUM_THREADS", "1"}, {"LOONGFORGE_DUMP_PARAMS", dir + "/p.safetensors"}},
                       std::chrono::seconds(300));
  TrainRun out;
  out.output = r.output;
  out.exit_code = r.exit_code;
  if (r.exit_code != 0) return out;
  std::ifstream in(dir + "/m.jsonl");
  std::string line;
  std::regex loss_re("\"loss\": ([-0-9.eE+]+)"), norm_re("\"grad_norm\": ([-0-9.eE+]+)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, loss_re)) out.losses.push_back(std::stod(m[1]));
    if (std::regex_search(line, m, norm_re)) out.grad_norms.push_back(std::stod(m[1]));
  }
  return out;
}

// A composite's example config through loongforge-train as users run it (loongforge-run
// --standalone for procs > 1): 10 steps, deterministic, a loss per step in DIR/m.jsonl, no
// evaluation, then `extra`; the final parameters read back. DIR: a new temporary directory named
// after `tag`.
inline TrainRun train_example(const std::string& config, int procs, const std::vector<std::string>& extra,
                              const std::string& tag) {
  const std::string dir = lf::testing::make_temp_dir(tag);
  std::vector<std::string> argv;
  if (procs > 1) argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
  const std::vector<std::string> t = {bin("loongforge-train"), "--config-file", config, "--train-iters", "10",
                                      "--metrics-file", dir + "/m.jsonl", "--data-cache-path", dir,
                                      "--deterministic-mode", "--log-interval", "1", "--eval-iters", "0"};
  argv.insert(argv.end(), t.begin(), t.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  TrainRun out = run_training(argv, dir);
  if (out.exit_code == 0 && std::filesystem::exists(dir + "/p.safetensors"))
    out.params = read_params(dir + "/p.safetensors");
  return out;
}

// 10 steps of a global batch of 8 (4 micro-batches of 2: 1F1B has a steady phase at PP 2 and 4)
// on the demo model with `layers` layers and mock data. pp > 1: stage k dumps PATH.pp<k>; the
// dumps are merged (each parameter lives on exactly one stage; the tied embedding's copy on the
// last stage is not dumped).
inline TrainRun train(int procs, int pp, int layers, std::vector<std::string> extra, const std::string& tag) {
  auto dir = lf::testing::make_temp_dir("pp-" + tag);
  std::vector<std::string> argv;
  if (procs > 1) argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
  std::vector<std::string> t = {
      bin("loongforge-train"), "--config-file", lf::testing::source_dir() + "/configs/demo.yaml",
      "--train-iters", "10", "--global-batch-size", "8", "--micro-batch-size", "2",
      "--metrics-file", dir + "/m.jsonl", "--eval-iters", "0", "--lr-warmup-iters", "2",
      "--data-cache-path", dir, "--deterministic-mode", "--pipeline-model-parallel-size",
      std::to_string(pp), "model.foundation.num_layers=" + std::to_string(layers)};
  argv.insert(argv.end(), t.begin(), t.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  TrainRun out = run_training(argv, dir);
  if (out.exit_code != 0) return out;
  if (std::find(extra.begin(), extra.end(), "--dry-run") != extra.end()) return out;
  if (pp == 1) {
    out.params = read_params(dir + "/p.safetensors");
  } else {
    for (int k = 0; k < pp; ++k) {
      for (auto& [name, v] : read_params(dir + "/p.safetensors.pp" + std::to_string(k))) {
        EXPECT_EQ(out.params.count(name), 0u) << name << " dumped by two stages";
        out.params[name] = std::move(v);
      }
    }
  }
  return out;
}

// Tolerances (fp32): the stages run the same ops on the same numbers as the single process; the
// differences are the order of floating-point sums where gradients meet (the tied embedding's
// two parts, the gradient norm summed per stage then over the pipeline group; with TP the split
// matmul reductions), ~1e-7 relative per op. Adam normalises the updates, so over 10 steps the
// runs stay within ~1e-6; 1e-5 catches any real mistake (a lost micro-batch or a missing
// embedding-gradient sum changes the loss at the 1e-3 level and the weights by ~lr = 1e-3).
// The gradient norm is compared too (1e-4 relative, as in test_optimizer_program.cpp): Adam is
// nearly invariant to the gradients' scale, so a norm that counted the tied embedding twice or
// missed a stage would hardly move loss or weights, but changes the norm by >1e-2.
struct Tolerances {
  double loss_rel = 1e-5, param_abs = 1e-5, norm_rel = 1e-4;
  // The single run's 10th loss below its 1st ("it learns"); off for objectives whose per-step
  // noise hides 10 steps of progress (flow matching on a small store: random times and noise).
  bool expect_learning = true;
};

inline void expect_same_training(const TrainRun& want, const TrainRun& got, const char* what,
                                 const Tolerances& tol = {}) {
  ASSERT_EQ(want.exit_code, 0) << want.output;
  ASSERT_EQ(got.exit_code, 0) << got.output;
  ASSERT_EQ(want.losses.size(), 10u) << want.output;
  ASSERT_EQ(got.losses.size(), 10u) << got.output;
  if (tol.expect_learning) {
    EXPECT_LT(want.losses.back(), want.losses.front());  // it learns
  }
  double worst_rel = 0;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], tol.loss_rel * std::abs(want.losses[i]))
        << what << ", step " << i + 1;
    worst_rel = std::max(worst_rel, std::abs(got.losses[i] - want.losses[i]) / std::abs(want.losses[i]));
  }
  ASSERT_EQ(got.grad_norms.size(), want.grad_norms.size());
  double worst_norm = 0;
  for (size_t i = 0; i < want.grad_norms.size(); ++i) {
    EXPECT_NEAR(got.grad_norms[i], want.grad_norms[i], tol.norm_rel * std::abs(want.grad_norms[i]))
        << what << ", step " << i + 1;
    worst_norm = std::max(worst_norm, std::abs(got.grad_norms[i] - want.grad_norms[i]) /
                                          std::abs(want.grad_norms[i]));
  }
  const double params = max_abs_diff(want.params, got.params);  // also: the same names
  EXPECT_LE(params, tol.param_abs) << what;
  std::cout << what << ": worst per-step loss relative difference " << worst_rel
            << ", gradient norm " << worst_norm << ", final parameters max-abs difference " << params
            << "\n";
}

// A 10-step run of `config` saved after 5 steps at `layout` (on `procs` ranks) and resumed in one
// process: steps 6..10 and the final parameters equal `straight` (the same 10 steps in one process)
// within the equivalence tolerances. The per-rank RNG states are not loaded at another layout, so
// this checks that the model's step-keyed random streams continue from the checkpoint's iteration.
inline void expect_resume_at_another_layout(const std::string& config, const TrainRun& straight, int procs,
                                            const std::vector<std::string>& layout, const std::string& tag) {
  const std::string dir = make_temp_dir(tag);
  std::vector<std::string> first_args = layout;
  first_args.insert(first_args.end(), {"--save", dir + "/ck", "--exit-interval", "5"});
  auto first = train_example(config, procs, first_args, tag + "-a");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = train_example(config, 1, {"--load", dir + "/ck"}, tag + "-b");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_EQ(second.losses.size(), 5u) << second.output;
  ASSERT_GE(straight.losses.size(), 10u) << straight.output;
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(second.losses[i], straight.losses[5 + i], 1e-5 * straight.losses[5 + i]) << tag << " step " << 6 + i;
  EXPECT_LE(max_abs_diff(straight.params, second.params), 1e-5) << tag;
}

}  // namespace lf::testing

// loongforge-train under pipeline parallelism, launched by loongforge-run: PP = 2 and PP = 4 with
// 1F1B and interleaved (v = 2), and TP = 2 x PP = 2 on 4 processes, train the same model as one
// process (same seed, same global batch, 10 steps), step by step and in the final parameters
// (every stage's dump merged); an uneven split; the layer split errors and the stage assignment
// of --dry-run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>

#include "multiprocess.h"
#include "program_testing.h"

namespace {
using lf::testing::bin;
using lf::testing::max_abs_diff;
using lf::testing::read_params;
using lf::testing::run_command;

using Params = std::map<std::string, std::vector<float>>;

struct TrainRun {
  std::vector<double> losses, grad_norms;
  Params params;
  std::string output;
  int exit_code = -1;
};

// 10 steps of a global batch of 8 (4 micro-batches of 2: 1F1B has a steady phase at PP 2 and 4)
// on the demo model with `layers` layers and mock data. pp > 1: stage k dumps PATH.pp<k>; the
// dumps are merged (each parameter lives on exactly one stage; the tied embedding's copy on the
// last stage is not dumped).
TrainRun train(int procs, int pp, int layers, std::vector<std::string> extra, const std::string& tag) {
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
constexpr double kLossRel = 1e-5, kParamAbs = 1e-5, kNormRel = 1e-4;

void expect_same_training(const TrainRun& want, const TrainRun& got, const char* what) {
  ASSERT_EQ(want.exit_code, 0) << want.output;
  ASSERT_EQ(got.exit_code, 0) << got.output;
  ASSERT_EQ(want.losses.size(), 10u) << want.output;
  ASSERT_EQ(got.losses.size(), 10u) << got.output;
  EXPECT_LT(want.losses.back(), want.losses.front());  // it learns
  double worst_rel = 0;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], kLossRel * std::abs(want.losses[i]))
        << what << ", step " << i + 1;
    worst_rel = std::max(worst_rel, std::abs(got.losses[i] - want.losses[i]) / std::abs(want.losses[i]));
  }
  ASSERT_EQ(got.grad_norms.size(), want.grad_norms.size());
  double worst_norm = 0;
  for (size_t i = 0; i < want.grad_norms.size(); ++i) {
    EXPECT_NEAR(got.grad_norms[i], want.grad_norms[i], kNormRel * std::abs(want.grad_norms[i]))
        << what << ", step " << i + 1;
    worst_norm = std::max(worst_norm, std::abs(got.grad_norms[i] - want.grad_norms[i]) /
                                          std::abs(want.grad_norms[i]));
  }
  const double params = max_abs_diff(want.params, got.params);  // also: the same names
  EXPECT_LE(params, kParamAbs) << what;
  std::cout << what << ": worst per-step loss relative difference " << worst_rel
            << ", gradient norm " << worst_norm << ", final parameters max-abs difference " << params
            << "\n";
}

TEST(PipelineParallelEquivalence, Pp2OneFOneBEqualsSingleProcess) {
  expect_same_training(train(1, 1, 2, {}, "single2"), train(2, 2, 2, {}, "pp2"), "PP 2 (1F1B)");
}

TEST(PipelineParallelEquivalence, Pp4OneFOneBEqualsSingleProcess) {
  expect_same_training(train(1, 1, 4, {}, "single4"), train(4, 4, 4, {}, "pp4"), "PP 4 (1F1B)");
}

// Interleaved 1F1B, v = 2 model chunks per stage (one layer per virtual stage): PP 2 holds layers
// 0 + 2 and 1 + 3; PP 4 on 8 layers holds 0 + 4, 1 + 5, 2 + 6, 3 + 7 (the activations go round the
// ring twice). 4 micro-batches per step, a multiple of pp as the schedule needs.
TEST(PipelineParallelEquivalence, Pp2InterleavedEqualsSingleProcess) {
  expect_same_training(train(1, 1, 4, {}, "single-v4"),
                       train(2, 2, 4, {"--num-layers-per-virtual-pipeline-stage", "1"}, "pp2-v2"),
                       "PP 2 interleaved (v 2)");
}

TEST(PipelineParallelEquivalence, Pp4InterleavedEqualsSingleProcess) {
  expect_same_training(train(1, 1, 8, {}, "single-v8"),
                       train(4, 4, 8, {"--num-layers-per-virtual-pipeline-stage", "1"}, "pp4-v2"),
                       "PP 4 interleaved (v 2)");
}

TEST(PipelineParallelEquivalence, Tp2TimesPp2EqualsSingleProcess) {
  expect_same_training(train(1, 1, 2, {}, "single-tp"),
                       train(4, 2, 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, "tp2pp2"),
                       "TP 2 x PP 2 + SP");
}

TEST(PipelineParallelEquivalence, UnevenSplitEqualsSingleProcess) {
  // 4 layers as 1 + 3 over PP 2, clipping on (the norm must sum every stage, the tied embedding
  // once, or the clipped updates differ).
  expect_same_training(train(1, 1, 4, {"--clip-grad", "0.05"}, "single-uneven"),
                       train(2, 2, 4, {"--clip-grad", "0.05", "--decoder-first-pipeline-num-layers", "1"},
                             "pp2-uneven"),
                       "PP 2, layers 1 + 3, clipped");
}

TEST(PipelineParallelDryRun, ShowsTheStageAssignment) {
  auto r = train(4, 4, 8, {"--dry-run", "--decoder-last-pipeline-num-layers", "2"}, "dry");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 8 layers over 4 stages with 2 on the last: 2 + 2 + 2 + 2.
  for (const char* s : {"stage 0: layers 0..1 (2) + embedding", "stage 1: layers 2..3 (2)",
                        "stage 3: layers 6..7 (2) + final norm + tied output copy",
                        // Memory per stage: 1F1B keeps pp - k micro-batches in flight on stage k.
                        "per-rank estimates by pipeline stage", "(4 micro-batches in flight)",
                        "(1 micro-batch in flight)"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
}

TEST(PipelineParallelDryRun, ShowsTheModelChunksOfTheInterleavedSchedule) {
  auto r = train(4, 4, 8, {"--dry-run", "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "16"},
                 "dry-v2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Virtual stage c * 4 + k on stage k. Activations in flight with m = 8: Megatron's warm-up
  // forwards 2 (pp - k - 1) + (v - 1) pp, plus one: 11 on stage 0, 5 on stage 3.
  for (const char* s : {"stage 0: layers 0..0 + 4..4 (2 in 2 model chunks) + embedding",
                        "stage 3: layers 3..3 + 7..7 (2 in 2 model chunks) + final norm",
                        "(11 model-chunk micro-batches in flight)", "(5 model-chunk micro-batches in flight)"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
}

// --pipeline-trace: every stage writes its Chrome trace and rank 0 prints the measured bubble.
TEST(PipelineParallelTrace, WritesEveryStageAndPrintsTheBubble) {
  auto dir = lf::testing::make_temp_dir("pp-trace");
  auto r = train(2, 2, 2, {"--pipeline-trace", dir + "/trace"}, "trace");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pipeline bubble: "), std::string::npos) << r.output;
  for (const char* stage : {"0", "1"}) {
    std::ifstream in(dir + "/trace.stage" + stage + ".json");
    const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(json.find("\"traceEvents\""), std::string::npos) << stage;
    EXPECT_NE(json.find("\"name\": \"F3\""), std::string::npos) << stage;  // 4 micro-batches per step
    EXPECT_NE(json.find("\"name\": \"step 9\""), std::string::npos) << stage;  // 10 steps
  }
}

TEST(PipelineParallelTrace, WithoutPipelineIsAConfigurationError) {
  auto r = run_command({bin("loongforge-train"), "--config-file", lf::testing::source_dir() + "/configs/demo.yaml",
                        "--pipeline-trace", "/tmp/never", "--dry-run"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.pipeline_trace is set but parallel.pipeline_model_parallel_size is 1"),
            std::string::npos)
      << r.output;
}

// Layout clashes are configuration errors found before any process group exists, so --dry-run
// reports them too, naming both values.
TEST(PipelineParallelErrors, LayersNotDivisibleNameTheValues) {
  for (bool dry : {true, false}) {
    std::vector<std::string> a;
    if (dry) a.push_back("--dry-run");
    auto r = train(2, 2, 3, a, dry ? "odd-dry" : "odd");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("model.foundation.num_layers 3 is not divisible by "
                            "parallel.pipeline_model_parallel_size 2"),
              std::string::npos)
        << r.output;
  }
  auto r = train(2, 2, 4, {"--dry-run", "--decoder-first-pipeline-num-layers", "5"}, "first5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("decoder_first_pipeline_num_layers 5"), std::string::npos) << r.output;
  // Virtual stages: 6 layers cannot make chunks of 2 on each of 2 stages evenly (needs 4 | 6).
  r = train(2, 2, 6, {"--dry-run", "--num-layers-per-virtual-pipeline-stage", "2"}, "virt6");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model.foundation.num_layers 6 is not divisible by parallel.pipeline_model_parallel_size "
                          "2 x parallel.num_layers_per_virtual_pipeline_stage 2 = 4"),
            std::string::npos)
      << r.output;
  // The interleaved schedule needs the micro-batch count (global 2 / micro 2 = 1) a multiple of pp.
  r = train(2, 2, 4, {"--dry-run", "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "2"},
            "virt-mb");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("needs the number of micro-batches (1) to be a multiple of "
                          "parallel.pipeline_model_parallel_size 2"),
            std::string::npos)
      << r.output;
}

}  // namespace

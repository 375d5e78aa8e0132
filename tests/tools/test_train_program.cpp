// loongforge-train as a user runs it: configuration errors, --dry-run under loongforge-run, the
// metrics file, and data-parallel training equal to the single-process run.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include "multiprocess.h"
#include "program_testing.h"

namespace {
using lf::testing::run_command;

using lf::testing::bin;
std::string config(const std::string& name) { return lf::testing::source_dir() + "/configs/" + name; }

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::vector<std::string> train_args(std::vector<std::string> extra) {
  std::vector<std::string> a = {bin("loongforge-train"), "--config-file", config("demo.yaml")};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// iteration -> loss, from a --metrics-file.
std::vector<double> losses(const std::string& metrics) {
  std::ifstream in(metrics);
  std::vector<double> out;
  std::string line;
  std::regex loss_re("\"loss\": ([-0-9.eE+]+)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, loss_re)) out.push_back(std::stod(m[1]));
  }
  return out;
}

TEST(TrainProgram, MisspelledKeyNamesFileLineAndNearestKey) {
  auto dir = lf::testing::make_temp_dir("cfg");
  write(dir + "/job.yaml",
        "defaults:\n  - " + config("demo.yaml") + "\n  - _self_\n"
        "parallel:\n  tensor_model_paralel_size: 2\n");
  auto r = run_command({bin("loongforge-train"), "--config-file", dir + "/job.yaml", "--dry-run"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("job.yaml:5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tensor_model_parallel_size"), std::string::npos) << r.output;
}

TEST(TrainProgram, UnknownFlagSuggestsNearest) {
  auto r = run_command(train_args({"--tensor-model-parallel-sise", "2", "--dry-run"}));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tensor-model-parallel-size"), std::string::npos) << r.output;
}

TEST(TrainProgram, HelpListsMegatronFlags) {
  auto r = run_command({bin("loongforge-train"), "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--tensor-model-parallel-size", "--micro-batch-size", "--lr-decay-style",
                           "--use-distributed-optimizer", "--data-path", "--metrics-file"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
}

TEST(TrainProgram, DryRunUnderLauncherPrintsEveryGroup) {
  auto r = run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", "4", bin("loongforge-train"),
                        "--config-file", config("demo.yaml"), "--tensor-model-parallel-size", "2",
                        "--pipeline-model-parallel-size", "2", "--dry-run", "--show-origin"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"world 4 = tp 2 x cp 1 x dp 1 x pp 2", "tp         2 groups: [0, 1] [2, 3]",
                           "pp         2 groups: [0, 2] [1, 3]", "embedding  2 groups: [0, 2] [1, 3]",
                           "tensor_model_parallel_size: 2  # flag --tensor-model-parallel-size 2",
                           "per-rank estimates"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  // Only rank 0 prints the resolved configuration.
  size_t first = r.output.find("# resolved configuration");
  EXPECT_EQ(r.output.find("# resolved configuration", first + 1), std::string::npos);
}

TEST(TrainProgram, LayoutThatDoesNotDivideTheWorldIsAnError) {
  auto r = run_command({bin("loongforge-run"), "--standalone", "--nproc-per-node", "2", bin("loongforge-train"),
                        "--config-file", config("demo.yaml"), "--tensor-model-parallel-size", "3",
                        "--dry-run"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("3"), std::string::npos) << r.output;
}

TEST(TrainProgram, MissingDatasetNamesThePath) {
  auto r = run_command(train_args({"--data-path", "/nonexistent/corpus_text_document",
                                   "data.mock_data=false", "--train-iters", "1",
                                   "--lr-warmup-iters", "0"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("/nonexistent/corpus_text_document"), std::string::npos) << r.output;
}

// The demo model on mock data, 8 steps of a global batch of 8. Tolerance: fp32 sums of the same
// numbers in a different order (DP all-reduce or accumulation vs one batch) differ by ~1e-7
// relative per step; Adam's normalisation keeps that from growing much over 8 steps, so 1e-5
// relative on every step's loss is tight enough to catch a wrong average or a lost micro-batch.
class DataParallelEquivalence : public ::testing::Test {
 protected:
  std::vector<double> run(int procs, int micro_batch, const std::string& tag) {
    auto dir = lf::testing::make_temp_dir("dp-" + tag);
    std::vector<std::string> argv;
    if (procs > 1)
      argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
    auto t = train_args({"--train-iters", "8", "--global-batch-size", "8", "--micro-batch-size",
                         std::to_string(micro_batch), "--metrics-file", dir + "/m.jsonl",
                         "--eval-iters", "0", "--lr-warmup-iters", "0", "--data-cache-path", dir});
    argv.insert(argv.end(), t.begin(), t.end());
    auto r = run_command(argv, {{"OMP_NUM_THREADS", "1"}});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return losses(dir + "/m.jsonl");
  }
};

TEST_F(DataParallelEquivalence, Dp2AndAccumulationEqualSingleProcess) {
  auto one_batch = run(1, 8, "single");
  auto accumulated = run(1, 2, "accum");  // 4 micro-batches of 2
  auto dp2 = run(2, 2, "dp2");            // 2 ranks x 2 micro-batches of 2
  ASSERT_EQ(one_batch.size(), 8u);
  ASSERT_EQ(accumulated.size(), 8u);
  ASSERT_EQ(dp2.size(), 8u);
  EXPECT_LT(one_batch.back(), one_batch.front());  // it learns
  for (size_t i = 0; i < one_batch.size(); ++i) {
    EXPECT_NEAR(accumulated[i], one_batch[i], 1e-5 * std::abs(one_batch[i])) << "step " << i + 1;
    EXPECT_NEAR(dp2[i], one_batch[i], 1e-5 * std::abs(one_batch[i])) << "step " << i + 1;
  }
}

TEST(TrainProgram, MetricsFileHasTheDocumentedKeys) {
  auto dir = lf::testing::make_temp_dir("metrics");
  auto r = run_command(train_args({"--train-iters", "2", "--lr-warmup-iters", "0", "--log-interval", "1", "--metrics-file",
                                   dir + "/m.jsonl", "--eval-iters", "0"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir + "/m.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    for (const char* key : {"\"iteration\": ", "\"loss\": ", "\"grad_norm\": ", "\"lr\": ",
                            "\"tokens_per_sec\": ", "\"peak_memory_mib\": "})
      EXPECT_NE(line.find(key), std::string::npos) << key << " in " << line;
  }
  EXPECT_EQ(n, 2);
  EXPECT_NE(r.output.find(" MiB | ETA "), std::string::npos) << r.output;  // progress line
}

double last_peak_mib(const std::string& metrics) {
  std::ifstream in(metrics);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  std::smatch m;
  std::regex re("\"peak_memory_mib\": ([0-9.eE+]+)");
  EXPECT_TRUE(std::regex_search(last, m, re)) << last;
  return m.empty() ? 0 : std::stod(m[1]);
}

// Recomputation trades compute for memory without changing the math: the same losses bit for
// bit (printed with 10 digits), and a lower peak of live tensor bytes (CPU allocator). Four
// layers, 4 x 128 tokens: activations dominate the parameters and Adam states.
TEST(TrainProgram, RecomputeKeepsLossesAndLowersPeakMemory) {
  auto dir = lf::testing::make_temp_dir("recompute");
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> a = {"--train-iters", "3", "--lr-warmup-iters", "0", "--log-interval", "1",
                                  "--micro-batch-size", "4", "--global-batch-size", "4", "--eval-iters", "0",
                                  "--deterministic-mode", "--metrics-file", dir + "/" + name + ".jsonl",
                                  "model.foundation.num_layers=4"};
    a.insert(a.end(), extra.begin(), extra.end());
    auto r = run_command(train_args(a));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return std::make_pair(losses(dir + "/" + name + ".jsonl"), last_peak_mib(dir + "/" + name + ".jsonl"));
  };
  const auto none = run("none", {});
  const auto full = run("full", {"--recompute-granularity", "full", "--recompute-method", "uniform",
                                 "--recompute-num-layers", "1"});
  const auto selective = run("selective", {"--recompute-granularity", "selective"});
  ASSERT_EQ(none.first.size(), 3u);
  EXPECT_EQ(full.first, none.first);
  EXPECT_EQ(selective.first, none.first);
  EXPECT_LT(full.second, 0.8 * none.second) << "full " << full.second << " MiB vs " << none.second;
  EXPECT_LT(selective.second, none.second) << "selective " << selective.second << " MiB vs " << none.second;
  std::printf("peak memory MiB: none %.2f, full %.2f, selective %.2f\n", none.second, full.second,
              selective.second);
}
}  // namespace

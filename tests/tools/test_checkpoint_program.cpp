// Checkpoints end to end with loongforge-train / loongforge-run / loongforge-convert (CPU,
// --deterministic-mode, the demo model at sequence length 32):
//  - exact resume: 20 iterations straight == 10 + resume + 10, bit for bit (every logged metric,
//    every final parameter), single process (stopped by SIGTERM), TP = 2, DP = 2 + ZeRO-1;
//  - resharding: TP 2 -> TP 1 x DP 2 (ZeRO-1) and back, online and via `loongforge-convert
//    reshard`, optimizer state included;
//  - `loongforge-run --max-restarts 1` with rank 1 killed mid-run ends with the parameters of an
//    uninterrupted run;
//  - --async-save writes the same files as a synchronous save; keep-last-k; --finetune,
//    --no-load-optim, missing and corrupt checkpoints.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>

#include "multiprocess.h"
#include "program_testing.h"

namespace {
namespace fs = std::filesystem;
using lf::testing::bin;
using lf::testing::read_file;
using lf::testing::read_params;

struct Run {
  int exit_code = -1;
  std::string output;
  std::vector<std::string> metrics;  // "iteration=1 loss=... grad_norm=... lr=... consumed_samples=..." 
  std::vector<double> losses;
  std::string params;                // the raw fp32 parameter dump (bit-for-bit comparisons)
  std::string params_path;
};

// One loongforge-train job (procs > 1: under loongforge-run --standalone) of the 20-iteration
// schedule; `dir` holds its metrics file and parameter dump, its parent the data cache shared by
// the test's runs (the mock index for sequence length 32 is ~150 MB).
Run train(int procs, const std::string& dir, std::vector<std::string> extra,
          std::vector<std::pair<std::string, std::string>> env = {}, std::vector<std::string> run_args = {}) {
  fs::create_directories(dir);
  std::vector<std::string> argv;
  if (procs > 1) {
    argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
    argv.insert(argv.end(), run_args.begin(), run_args.end());
  }
  // Fault injection exists only in the test build of the program (tests/tools/fault_train.cpp).
  bool faults = false;
  for (const auto& [k, v] : env) faults = faults || k.starts_with("LOONGFORGE_TEST_");
  std::vector<std::string> t = {
      bin(faults ? "loongforge-train-faults" : "loongforge-train"), "--config-file",
      lf::testing::source_dir() + "/configs/demo.yaml",
      "--train-iters", "20", "--global-batch-size", "8", "--micro-batch-size", "2",
      "--seq-length", "32", "--metrics-file", dir + "/m.jsonl", "--eval-iters", "0",
      "--lr-warmup-iters", "2", "--data-cache-path", fs::path(dir).parent_path().string() + "/cache",
      "--deterministic-mode"};
  argv.insert(argv.end(), t.begin(), t.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  env.push_back({"OMP_NUM_THREADS", "1"});
  env.push_back({"LOONGFORGE_DUMP_PARAMS", dir + "/p.safetensors"});
  auto r = lf::testing::run_command(argv, env, std::chrono::seconds(300));
  Run out;
  out.exit_code = r.exit_code;
  out.output = r.output;
  std::ifstream in(dir + "/m.jsonl");
  std::string line;
  // The numerics of each line (timing and memory fields vary between runs).
  std::regex loss_re("\"loss\": ([-0-9.eE+]+)"),
      keep_re("\"(iteration|loss|grad_norm|lr|consumed_samples)\": ([^,}]+)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, loss_re)) out.losses.push_back(std::stod(m[1]));
    std::string canon;
    for (std::sregex_iterator it(line.begin(), line.end(), keep_re), end; it != end; ++it)
      canon += (*it)[1].str() + "=" + (*it)[2].str() + " ";
    out.metrics.push_back(canon);
  }
  out.params_path = dir + "/p.safetensors";
  if (fs::exists(out.params_path)) out.params = read_file(out.params_path);
  return out;
}

void expect_identical(const Run& straight, const Run& resumed, const char* what) {
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ASSERT_EQ(straight.metrics.size(), 20u) << straight.output;
  ASSERT_EQ(resumed.metrics.size(), 20u) << resumed.output;  // 10 before the stop + 10 after
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(resumed.metrics[i], straight.metrics[i]) << what << ", line " << i;
  ASSERT_FALSE(straight.params.empty());
  EXPECT_TRUE(resumed.params == straight.params) << what << ": final parameters differ (max abs "
      << lf::testing::max_abs_diff(read_params(straight.params_path), read_params(resumed.params_path)) << ")";
}

// A test's scratch directory, removed at the end unless the test failed (kept for post-mortems).
struct Scratch {
  std::string path;
  ~Scratch() {
    if (!::testing::Test::HasFailure()) fs::remove_all(path);
  }
  friend std::string operator+(const Scratch& s, const std::string& tail) { return s.path + tail; }
};

Scratch tmp(const std::string& tag) { return Scratch{lf::testing::make_temp_dir("ckpt-prog-" + tag)}; }

const std::vector<std::string> kTp2 = {"--tensor-model-parallel-size", "2"};
const std::vector<std::string> kDp2Zero1 = {"--use-distributed-optimizer"};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- exact resume --------------------------------------------------------------------------

TEST(ExactResume, SingleProcessStoppedBySigterm) {
  auto d = tmp("single");
  auto straight = train(1, d + "/straight", {});
  // SIGTERM after iteration 10: the step finishes, a checkpoint is saved, exit code 0.
  auto first = train(1, d + "/resumed", {"--save", d + "/ck"}, {{"LOONGFORGE_TEST_SIGTERM_AT", "0:10"}});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("SIGTERM: saving at iteration 10"), std::string::npos) << first.output;
  EXPECT_EQ(first.metrics.size(), 10u);
  EXPECT_EQ(read_file(d + "/ck/latest_checkpointed_iteration.txt"), "10\n");
  auto second = train(1, d + "/resumed", {"--save", d + "/ck", "--load", d + "/ck"});
  EXPECT_NE(second.output.find("loaded checkpoint"), std::string::npos) << second.output;
  expect_identical(straight, second, "single process, 10 + SIGTERM + resume + 10");
}

TEST(ExactResume, TensorParallel2) {
  auto d = tmp("tp2");
  auto straight = train(2, d + "/straight", kTp2);
  auto first = train(2, d + "/resumed", kTp2 + std::vector<std::string>{"--save", d + "/ck", "--exit-interval", "10"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // TP shards: both ranks' model files, replicated norms stored once (by TP rank 0).
  EXPECT_TRUE(fs::exists(d + "/ck/iter_0000010/model_tp1_pp0.safetensors"));
  auto second = train(2, d + "/resumed", kTp2 + std::vector<std::string>{"--load", d + "/ck"});
  expect_identical(straight, second, "TP 2");
}

// PP 2 (1F1B), tied embeddings: the last stage's copy of the embedding is stored once (by the
// first stage) and both copies come back, with their optimizer state.
TEST(ExactResume, PipelineParallel2) {
  const std::vector<std::string> kPp2 = {"--pipeline-model-parallel-size", "2"};
  auto d = tmp("pp2");
  auto straight = train(2, d + "/straight", kPp2);
  auto first = train(2, d + "/resumed", kPp2 + std::vector<std::string>{"--save", d + "/ck", "--exit-interval", "10"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(fs::exists(d + "/ck/iter_0000010/model_tp0_pp1.safetensors"));
  auto second = train(2, d + "/resumed", kPp2 + std::vector<std::string>{"--load", d + "/ck"});
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_EQ(straight.metrics.size(), 20u) << straight.output;
  ASSERT_EQ(second.metrics.size(), 20u) << second.output;
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(second.metrics[i], straight.metrics[i]) << "PP 2, line " << i;
  for (const char* stage : {".pp0", ".pp1"}) {  // each stage dumps its own parameters
    const std::string a = read_file(d + "/straight/p.safetensors" + stage), b = read_file(d + "/resumed/p.safetensors" + stage);
    ASSERT_FALSE(a.empty()) << stage;
    EXPECT_TRUE(a == b) << "PP 2: final parameters of stage " << stage << " differ";
  }
}

// Interleaved 1F1B (4 layers, v = 2: stage 0 holds layers 0 + 2, stage 1 layers 1 + 3): each
// stage's model file holds non-contiguous layers; resume is exact, and the checkpoint also loads
// into one process (by name), which continues the same training (within the PP equivalence
// tolerance, docs/parallelism.md: the layouts sum in a different order).
TEST(ExactResume, InterleavedPipelineAndIntoOneProcess) {
  const std::vector<std::string> kV2 = {"--pipeline-model-parallel-size", "2", "model.foundation.num_layers=4",
                                        "--num-layers-per-virtual-pipeline-stage", "1"};
  auto d = tmp("pp2-v2");
  auto straight = train(2, d + "/straight", kV2);
  auto first = train(2, d + "/resumed", kV2 + std::vector<std::string>{"--save", d + "/ck", "--exit-interval", "10"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = train(2, d + "/resumed", kV2 + std::vector<std::string>{"--load", d + "/ck"});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_EQ(straight.metrics.size(), 20u) << straight.output;
  ASSERT_EQ(second.metrics.size(), 20u) << second.output;
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(second.metrics[i], straight.metrics[i]) << "interleaved PP 2, line " << i;
  auto single = train(1, d + "/single", {"model.foundation.num_layers=4", "--load", d + "/ck"});
  ASSERT_EQ(single.exit_code, 0) << single.output;
  ASSERT_EQ(single.losses.size(), 10u) << single.output;  // iterations 11..20
  for (size_t i = 0; i < 10; ++i)
    EXPECT_NEAR(single.losses[i], straight.losses[10 + i], 1e-5 * std::abs(straight.losses[10 + i])) << i;
}

TEST(ExactResume, DataParallel2WithZero1AsyncSaveAndKeepLast) {
  auto d = tmp("dp2");
  auto straight = train(2, d + "/straight", kDp2Zero1);
  auto first = train(2, d + "/resumed", kDp2Zero1 + std::vector<std::string>{
      "--save", d + "/ck", "--save-interval", "5", "--ckpt-keep-last", "1", "--exit-interval", "10",
      "--async-save"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // ZeRO-1: each DP rank wrote its own optimizer shard; keep-last 1 removed iteration 5.
  EXPECT_TRUE(fs::exists(d + "/ck/iter_0000010/optim_tp0_pp0_dp1.safetensors"));
  EXPECT_FALSE(fs::exists(d + "/ck/iter_0000005"));
  auto second = train(2, d + "/resumed", kDp2Zero1 + std::vector<std::string>{"--load", d + "/ck"});
  expect_identical(straight, second, "DP 2 + ZeRO-1");
}

TEST(ExactResume, Bf16SingleProcess) {
  // bf16 weights are rounded from fp32 masters: the checkpoint keeps both, so the resumed
  // masters are exact (not re-derived from the rounded weights).
  auto d = tmp("bf16");
  auto straight = train(1, d + "/straight", {"--bf16"});
  auto first = train(1, d + "/resumed", {"--bf16", "--save", d + "/ck", "--exit-interval", "10"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = train(1, d + "/resumed", {"--bf16", "--load", d + "/ck"});
  expect_identical(straight, second, "bf16");
}

TEST(ExactResume, DropoutNeedsTheSavedRngStates) {
  // Hidden dropout at TP 2 draws from the backend generator and the per-rank dropout streams:
  // resuming is exact only because every rank's RNG states come back (--no-load-rng differs).
  auto d = tmp("dropout");
  const auto args = kTp2 + std::vector<std::string>{"--hidden-dropout", "0.2"};
  auto straight = train(2, d + "/straight", args);
  auto first = train(2, d + "/resumed", args + std::vector<std::string>{"--save", d + "/ck", "--exit-interval", "10"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(fs::exists(d + "/ck/iter_0000010/rng_rank1.safetensors"));
  auto second = train(2, d + "/resumed", args + std::vector<std::string>{"--load", d + "/ck"});
  expect_identical(straight, second, "TP 2 with dropout");
  auto no_rng = train(2, d + "/no_rng", args + std::vector<std::string>{"--load", d + "/ck", "--no-load-rng"});
  ASSERT_EQ(no_rng.exit_code, 0) << no_rng.output;
  EXPECT_FALSE(no_rng.params == straight.params);
}

// ---- resharding ----------------------------------------------------------------------------

// Tolerance of the resharded continuation: the loaded parameters and optimizer state are exact,
// but TP 2 and DP 2 sum matmul partials and gradients in different orders (fp32 rounding, ~1e-7
// relative per op), so the losses of the next steps agree to ~1e-7 of ~5.0, not bit for bit. A
// wrong shard, a lost optimizer moment or a wrong data position moves them by > 1e-3.
constexpr double kReshardLossAbs = 1e-6;

void expect_continues(const Run& straight, const Run& resumed, const char* what) {
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ASSERT_EQ(straight.losses.size(), 20u);
  ASSERT_EQ(resumed.losses.size(), 2u) << resumed.output;  // iterations 11 and 12
  double worst = 0;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(resumed.losses[i], straight.losses[10 + i], kReshardLossAbs) << what << ", iteration " << 11 + i;
    worst = std::max(worst, std::abs(resumed.losses[i] - straight.losses[10 + i]));
  }
  EXPECT_NE(resumed.output.find("| optimizer state"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.metrics.front().rfind("iteration=11 ", 0), 0u) << resumed.metrics.front();
  std::cout << what << ": loss difference at iterations 11-12 <= " << worst << "\n";
}

TEST(Resharding, Tp2ToDp2AndBackWithOptimizerState) {
  auto d = tmp("reshard");
  // Uninterrupted runs that also leave a checkpoint at iteration 10.
  auto tp2 = train(2, d + "/tp2", kTp2 + std::vector<std::string>{"--save", d + "/tp2/ck", "--save-interval", "10"});
  auto dp2 = train(2, d + "/dp2", kDp2Zero1 + std::vector<std::string>{"--save", d + "/dp2/ck", "--save-interval", "10"});
  const std::vector<std::string> two_steps = {"--exit-interval", "12"};
  auto to_dp2 = train(2, d + "/to_dp2", kDp2Zero1 + two_steps + std::vector<std::string>{"--load", d + "/tp2/ck/iter_0000010"});
  expect_continues(tp2, to_dp2, "TP 2 -> DP 2 (ZeRO-1)");
  auto to_tp2 = train(2, d + "/to_tp2", kTp2 + two_steps + std::vector<std::string>{"--load", d + "/dp2/ck/iter_0000010"});
  expect_continues(dp2, to_tp2, "DP 2 (ZeRO-1) -> TP 2");
  // Offline: loongforge-convert reshard writes TP 1 x DP 2 files; loading them continues exactly
  // like loading the TP 2 checkpoint directly.
  auto conv = lf::testing::run_command({bin("loongforge-convert"), "reshard", "--load", d + "/tp2/ck/iter_0000010",
                                        "--save", d + "/converted", "--tp", "1", "--dp", "2"});
  ASSERT_EQ(conv.exit_code, 0) << conv.output;
  EXPECT_TRUE(fs::exists(d + "/converted/iter_0000010/optim_tp0_pp0_dp1.safetensors"));
  EXPECT_FALSE(fs::exists(d + "/converted/iter_0000010/model_tp1_pp0.safetensors"));
  auto from_conv = train(2, d + "/from_conv", kDp2Zero1 + two_steps + std::vector<std::string>{"--load", d + "/converted"});
  ASSERT_EQ(from_conv.exit_code, 0) << from_conv.output;
  EXPECT_EQ(from_conv.metrics, to_dp2.metrics);
  EXPECT_TRUE(from_conv.params == to_dp2.params);
}

// ---- restarts ------------------------------------------------------------------------------

TEST(Restart, WorkerKilledMidRunResumesFromTheLastCheckpoint) {
  auto d = tmp("restart");
  auto straight = train(2, d + "/straight", {});
  // Rank 1 is killed after iteration 7 (first attempt only); the launcher restarts the group,
  // which resumes from iteration 5 and finishes.
  auto r = train(2, d + "/restarted", {"--save", d + "/ck", "--load", d + "/ck", "--save-interval", "5"},
                 {{"LOONGFORGE_TEST_KILL_AT", "1:7"}}, {"--max-restarts", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("loaded checkpoint"), std::string::npos) << r.output;
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  EXPECT_TRUE(r.params == straight.params) << "max abs difference "
      << lf::testing::max_abs_diff(read_params(straight.params_path), read_params(r.params_path));
  // The restarted run logged 6 and 7 twice (before the kill and after the resume from 5).
  ASSERT_EQ(r.metrics.size(), 22u);
  EXPECT_EQ(r.metrics.back(), straight.metrics.back());
}

TEST(Preemption, SigtermOnOneRankStopsAllRanksAfterASave) {
  // Only rank 1 receives SIGTERM (after iteration 6); the ranks agree on it at the end of the
  // step, save iteration 6 together and exit 0.
  auto d = tmp("sigterm");
  auto r = train(2, d + "/run", kDp2Zero1 + std::vector<std::string>{"--save", d + "/ck"},
                 {{"LOONGFORGE_TEST_SIGTERM_AT", "1:6"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.metrics.size(), 6u);
  EXPECT_EQ(read_file(d + "/ck/latest_checkpointed_iteration.txt"), "6\n");
  EXPECT_TRUE(fs::exists(d + "/ck/iter_0000006/optim_tp0_pp0_dp1.safetensors"));
}

TEST(Restart, CrashesDuringSavesAreInvisibleAfterTheRestart) {
  // DP 2 + ZeRO-1, a checkpoint every 3 iterations. Each rank counts its save steps (rank 0: 3
  // files, manifest, rename, tracker = 6 per save; rank 1: 2 files) and the first to reach step
  // k dies (SIGKILL): k = 2: rank 0 in its first save, before any commit; 9: after the manifest
  // of the second save; 10: after its rename, before the tracker; 11: after the tracker. The
  // restarted job must end exactly as an uninterrupted one.
  auto d = tmp("crash-save");
  auto straight = train(2, d + "/straight", kDp2Zero1);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  for (const char* k : {"2", "9", "10", "11"}) {
    const std::string dir = d + "/k" + k;
    auto r = train(2, dir, kDp2Zero1 + std::vector<std::string>{"--save", dir + "/ck", "--load", dir + "/ck",
                                                                 "--save-interval", "3"},
                   {{"LOONGFORGE_TEST_CKPT_CRASH_AT", k}}, {"--max-restarts", "1"});
    ASSERT_EQ(r.exit_code, 0) << "k " << k << "\n" << r.output;
    EXPECT_NE(r.output.find("test crash at checkpoint point"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("restart 1 of 1"), std::string::npos) << r.output;
    EXPECT_TRUE(r.params == straight.params) << "k " << k;
    EXPECT_EQ(r.metrics.back(), straight.metrics.back()) << "k " << k;
  }
}

// ---- async saves, load semantics and errors ------------------------------------------------

TEST(AsyncSave, WritesTheSameFilesAsASynchronousSave) {
  auto d = tmp("async");
  const std::vector<std::string> a = {"--save-interval", "5", "--exit-interval", "10"};
  auto sync = train(1, d + "/sync", a + std::vector<std::string>{"--save", d + "/sync/ck"});
  auto async = train(1, d + "/async", a + std::vector<std::string>{"--save", d + "/async/ck", "--async-save"});
  ASSERT_EQ(sync.exit_code, 0) << sync.output;
  ASSERT_EQ(async.exit_code, 0) << async.output;
  EXPECT_EQ(sync.metrics, async.metrics);
  int compared = 0;
  for (const char* it : {"iter_0000005", "iter_0000010"})
    for (const auto& e : fs::directory_iterator(d + "/sync/ck/" + it)) {
      const std::string name = e.path().filename().string();
      if (name == "config.yaml" || name == "manifest.json") continue;  // the config names the flags
      EXPECT_EQ(read_file(e.path().string()), read_file(d + "/async/ck/" + it + "/" + name)) << it << "/" << name;
      ++compared;
    }
  EXPECT_EQ(compared, 8);  // model, optim, rng, state x 2
  EXPECT_EQ(read_file(d + "/async/ck/latest_checkpointed_iteration.txt"), "10\n");
}

TEST(LoadSemantics, FinetuneNoLoadOptimAndMissingCheckpoints) {
  auto d = tmp("semantics");
  auto base = train(1, d + "/base", {"--save", d + "/ck", "--exit-interval", "10"});
  ASSERT_EQ(base.exit_code, 0) << base.output;
  // The checkpoint's config.yaml (every key written out, defaults included) runs again as a job file.
  auto rerun = lf::testing::run_command({lf::testing::bin("loongforge-train"), "--config-file",
                                         d + "/ck/iter_0000010/config.yaml", "--dry-run"});
  EXPECT_EQ(rerun.exit_code, 0) << rerun.output;
  auto straight = train(1, d + "/straight", {"--exit-interval", "12"});
  // --no-load-optim: the iteration and weights continue (same loss at 11), fresh Adam moments
  // change iteration 12. As in Megatron the LR scheduler's state goes with the optimizer's, so
  // the schedule starts over (warmup from lr_warmup_init: 0 at iteration 11).
  auto no_optim = train(1, d + "/no_optim", {"--load", d + "/ck", "--no-load-optim", "--exit-interval", "12"});
  ASSERT_EQ(no_optim.exit_code, 0) << no_optim.output;
  ASSERT_EQ(no_optim.losses.size(), 2u);
  auto without_lr = [](const std::string& m) { return std::regex_replace(m, std::regex("lr=[^ ]+ "), ""); };
  EXPECT_EQ(without_lr(no_optim.metrics[0]), without_lr(straight.metrics[10]));
  EXPECT_NE(no_optim.metrics[0].find(" lr=0 "), std::string::npos) << no_optim.metrics[0];
  EXPECT_GT(std::abs(no_optim.losses[1] - straight.losses[11]), 1e-5);
  // --finetune: weights only, iteration 1 again (warmup LR), fresh data position.
  auto ft = train(1, d + "/finetune", {"--load", d + "/ck", "--finetune", "--exit-interval", "1"});
  ASSERT_EQ(ft.exit_code, 0) << ft.output;
  ASSERT_EQ(ft.metrics.size(), 1u);
  EXPECT_EQ(ft.metrics[0].rfind("iteration=1 ", 0), 0u) << ft.metrics[0];
  EXPECT_LT(ft.losses[0], base.losses[0] - 0.1);  // trained weights
  // A directory without a checkpoint: a fresh start with a warning, or an error on request.
  auto fresh = train(1, d + "/fresh", {"--load", d + "/nothing", "--exit-interval", "1"});
  ASSERT_EQ(fresh.exit_code, 0) << fresh.output;
  EXPECT_NE(fresh.output.find("holds no checkpoint; training starts from scratch"), std::string::npos);
  EXPECT_EQ(fresh.metrics[0], base.metrics[0]);
  auto strict = train(1, d + "/strict", {"--load", d + "/nothing", "--exit-on-missing-checkpoint"});
  EXPECT_NE(strict.exit_code, 0);
  EXPECT_NE(strict.output.find("--exit-on-missing-checkpoint"), std::string::npos) << strict.output;
  // A damaged shard: an error naming the file, not a crash.
  const std::string shard = d + "/ck/iter_0000010/optim_tp0_pp0_dp0.safetensors";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  auto broken = train(1, d + "/broken", {"--load", d + "/ck"});
  EXPECT_EQ(broken.exit_code, 1) << broken.output;
  EXPECT_NE(broken.output.find("optim_tp0_pp0_dp0.safetensors"), std::string::npos) << broken.output;
}

}  // namespace

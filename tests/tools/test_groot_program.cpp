// The groot composite through loongforge-train on mock VLA batches: DP 2 with ZeRO-1 equals the
// single process (fp32, 10 steps, dropout off; per-step loss relative 1e-5, final parameters
// max-abs 1e-5, as every equivalence test in pp_training.h: the same ops in another summation
// order); with GR00T's dropouts on, a checkpoint resumes exactly (the dropout and noise streams are
// keyed by the step) and the dropouts change the run; frozen components stay fixed; bf16 trains;
// layouts and settings it cannot take are configuration errors naming the key. loongforge-convert
// hf2lf on GR00T N1.7 directories (tests/models/groot_oracle.py): the checkpoint holds every
// tensor under LoongForge's names, equal to the model loaded from the directory, and its
// config.yaml rebuilds the same model; lf2hf on it is an error saying so.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "../models/cached_oracle.h"
#include "loongforge/backend/registry.h"
#include "loongforge/models/composites/groot.h"
#include "loongforge/models/groot_lerobot.h"
#include "loongforge/train/checkpoint.h"
#include "pp_training.h"

namespace {
using lf::testing::bin;
using lf::testing::TrainRun;

const std::string kConfig = lf::testing::source_dir() + "/configs/examples/groot_tiny.yaml";
const std::vector<std::string> kNoDropout = {"model.dit_dropout=0", "model.vl_dropout=0", "model.state_dropout_prob=0"};
// A global batch of 8 at a high learning rate: the flow-matching loss of random times and noise
// is noisy, and the equivalence check asks the 10 steps to lower it.
const std::vector<std::string> kBatch = {"--global-batch-size", "8", "--lr", "1e-2"};

TrainRun run(int procs, std::vector<std::string> extra, const std::string& tag, bool dropout = false) {
  if (!dropout) extra.insert(extra.end(), kNoDropout.begin(), kNoDropout.end());
  extra.insert(extra.end(), kBatch.begin(), kBatch.end());
  return lf::testing::train_example(kConfig, procs, extra, "groot-" + tag);
}

const TrainRun& single() {
  static const TrainRun r = run(1, {}, "one");
  return r;
}

const TrainRun& with_dropout() {
  static const TrainRun r = run(1, {}, "dropout", true);
  return r;
}

// At lr 1e-2 (kBatch), ten times the other equivalence tests', Adam turns the same order-of-summation
// differences into ten times the weight differences: parameters within 1e-4 (a lost micro-batch
// moves them by ~lr = 1e-2).
TEST(GrootTraining, DataParallelEqualsOneProcess) {
  lf::testing::Tolerances tol;
  tol.param_abs = 1e-4;
  lf::testing::expect_same_training(single(), run(2, {"--use-distributed-optimizer"}, "dp2"), "groot: dp 2, ZeRO-1",
                                    tol);
}

TEST(GrootTraining, DropoutChangesTheRun) {
  ASSERT_EQ(single().exit_code, 0) << single().output;
  ASSERT_EQ(with_dropout().exit_code, 0) << with_dropout().output;
  ASSERT_EQ(with_dropout().losses.size(), 10u);
  double most = 0;
  for (size_t i = 0; i < 10; ++i) most = std::max(most, std::abs(with_dropout().losses[i] - single().losses[i]));
  EXPECT_GT(most, 1e-3);
}

// Stop at step 5 with a checkpoint, resume: steps 6..10 equal the straight run, dropout included.
TEST(GrootTraining, ResumeIsExact) {
  const std::string dir = lf::testing::make_temp_dir("groot-resume");
  auto first = run(1, {"--save", dir + "/ck", "--exit-interval", "5"}, "resume_a", true);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = run(1, {"--load", dir + "/ck"}, "resume_b", true);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_EQ(second.losses.size(), 5u) << second.output;
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(second.losses[i], with_dropout().losses[5 + i], 1e-6 * with_dropout().losses[5 + i]) << i;
  EXPECT_LE(lf::testing::max_abs_diff(with_dropout().params, second.params), 1e-6);
}

// bf16 weights and activations (the flow-matching target, the velocity and the loss in fp32):
// each step's loss within 5% of fp32's.
TEST(GrootTraining, Bf16Trains) {
  auto bf16 = run(1, {"--bf16"}, "bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  ASSERT_EQ(bf16.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_NEAR(bf16.losses[i], single().losses[i], 0.05 * single().losses[i]) << i;
}

// GR00T's tune_visual / tune_llm false: the tower and the decoder unchanged between the
// checkpoints of steps 1 and 10, the action head trains.
TEST(GrootTraining, FrozenComponentsStayFixed) {
  const std::string dir = lf::testing::make_temp_dir("groot-freeze");
  auto r = run(1, {"model.vision_encoder.freeze=true", "model.foundation.freeze=true", "--save", dir + "/ck",
                   "--save-interval", "1"},
               "freeze");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto a = lf::train::read_model_checkpoint(dir + "/ck", 1), b = lf::train::read_model_checkpoint(dir + "/ck", 10);
  std::map<std::string, at::Tensor> before(a.tensors.begin(), a.tensors.end());
  int moved = 0, fixed = 0;
  for (const auto& [name, t] : b.tensors) {
    const bool head = name.starts_with("action_head.");
    const bool same = at::equal(t, before.at(name));
    if (!head) {
      EXPECT_TRUE(same) << name;
      ++fixed;
    } else if (!same) {
      ++moved;
    }
  }
  EXPECT_GT(fixed, 10);
  EXPECT_GT(moved, 10);
}

// Unfrozen (the tiny preset's default), the gradient reaches the backbone through its features:
// the tower's and the kept decoder layers' weights move; what GR00T never reads (the final norm)
// stays as it was.
TEST(GrootTraining, TheUnfrozenBackboneTrains) {
  const std::string dir = lf::testing::make_temp_dir("groot-unfrozen");
  auto r = run(1, {"--save", dir + "/ck", "--save-interval", "1"}, "unfrozen");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto a = lf::train::read_model_checkpoint(dir + "/ck", 1), b = lf::train::read_model_checkpoint(dir + "/ck", 10);
  std::map<std::string, at::Tensor> before(a.tensors.begin(), a.tensors.end());
  int tower = 0, layers = 0, unread = 0;
  for (const auto& [name, t] : b.tensors) {
    const bool same = at::equal(t, before.at(name));
    if (name.starts_with("vision_encoder.") && !same) ++tower;
    if (name.starts_with("decoder.layers.") && !same) ++layers;
    if (name.starts_with("decoder.final_layernorm")) {
      EXPECT_TRUE(same) << name;
      ++unread;
    }
  }
  EXPECT_GT(tower, 5);
  EXPECT_GT(layers, 5);
  EXPECT_EQ(unread, 1);
}

TEST(GrootTraining, LayoutsAndSettingsItCannotTakeAreConfigurationErrors) {
  auto expect = [](std::vector<std::string> args, int procs, const std::string& key) {
    std::vector<std::string> argv;
    if (procs > 1) argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
    argv.insert(argv.end(), {bin("loongforge-train"), "--config-file", kConfig, "--dry-run"});
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = lf::testing::run_command(argv);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(key), std::string::npos) << key << "\n" << r.output;
  };
  expect({"--tensor-model-parallel-size", "2"}, 2, "parallel.tensor_model_parallel_size");
  expect({"--pipeline-model-parallel-size", "2"}, 2, "parallel.pipeline_model_parallel_size");
  expect({"--expert-model-parallel-size", "2"}, 2, "parallel.expert_model_parallel_size");
  expect({"--recompute-granularity", "full"}, 1, "training.recompute_granularity");
  expect({"model.dit_output_dim=40"}, 1, "model.dit_output_dim");
  expect({"model.dit_attention_head_dim=8"}, 1, "model.input_embedding_dim");
  expect({"model.dit_num_attention_heads=1", "model.dit_attention_head_dim=33", "model.input_embedding_dim=33"}, 1,
         "must be even");
  expect({"model.select_layer=4"}, 1, "model.select_layer");
  expect({"model.vl_attention_head_dim=16"}, 1, "model.vl_num_attention_heads");
  expect({"model.image_size=12"}, 1, "model.image_size");
  expect({"model.action_dim=5"}, 1, "model.action_dim");
  // A --data-path that is no store: an error naming it.
  auto r = lf::testing::run_command({bin("loongforge-train"), "--config-file", kConfig, "--train-iters", "5",
                                     "data.mock_data=false", "--data-path", "/nonexistent-groot-store"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("/nonexistent-groot-store"), std::string::npos) << r.output;
}

std::string oracle_dir() {
  static const std::string dir = lf::testing::cached_oracle(lf::testing::source_dir() + "/tests/models/groot_oracle.py",
                                                            "groot_oracle", "done", lf::testing::lerobot_python());
  return dir;
}

TEST(GrootPrograms, Hf2LfWritesTheModelUnderOurNames) {
  if (oracle_dir().empty()) GTEST_SKIP() << "no LeRobot environment (.venv-lerobot)";
  namespace lr = lf::models::lerobot;
  const std::string src = oracle_dir() + "/alternate", out = lf::testing::make_temp_dir("groot-hf2lf");
  auto r = lf::testing::run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", src + "/model",
                                     "--backbone-config", src + "/backbone", "--out", out + "/ck"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ck = lf::train::read_model_checkpoint(out + "/ck");
  const auto setup = lr::groot_setup_from_model_section(ck.config_yaml, "config.yaml");
  ASSERT_TRUE(setup.has_value()) << ck.config_yaml;
  const auto want = lr::read_groot_setup(src + "/model", src + "/backbone");
  EXPECT_EQ(lr::groot_model_section_yaml(*setup), lr::groot_model_section_yaml(want));
  lf::models::Groot direct(want.backbone, want.config, lf::backend::cpu_backend(), 1, at::kFloat, nullptr);
  direct.load_full(lr::read_groot_weights(src + "/model", at::kFloat), src);
  std::map<std::string, at::Tensor> written(ck.tensors.begin(), ck.tensors.end());
  size_t n = 0;
  for (const auto& g : direct.parameter_groups())
    for (const auto& p : g.params) {
      ASSERT_TRUE(written.count(p.name)) << p.name;
      EXPECT_TRUE(at::equal(written.at(p.name), p.tensor)) << p.name;
      ++n;
    }
  EXPECT_EQ(n, written.size());
  // The way back is not built: an error, not a wrong directory.
  auto back = lf::testing::run_command({bin("loongforge-convert"), "lf2hf", "--load", out + "/ck", "--out", out + "/hf"});
  EXPECT_NE(back.exit_code, 0);
  EXPECT_NE(back.output.find("is a groot policy: exporting it to GR00T's layout is not built yet"), std::string::npos)
      << back.output;
  // --backbone-config on another kind of directory is refused, not ignored.
  auto wrong = lf::testing::run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", src + "/backbone",
                                         "--backbone-config", src + "/backbone", "--out", out + "/x"});
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("--backbone-config"), std::string::npos) << wrong.output;
}

}  // namespace

// A groot policy on the reach task through the programs: loongforge-train trains the tiny groot on a
// reach demo store (images as Qwen3-VL patches, the prompt as text, its state decoded from the
// prompt's bins; DP 2 with ZeRO-1 equals one process on it: fp32, 10 steps, dropout off, loss
// relative 1e-5, parameters 1e-5, as every equivalence test), loongforge-eval runs the checkpoint
// in closed loop (--policy groot --load --data-path) and loongforge-serve-policy serves it (the same
// episodes through the server as in process); a store that does not fit the model is an error
// naming the key to change.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../tools/pp_training.h"
#include "serve_testing.h"

namespace {
using lf::testing::bin;
using lf::testing::run_command;

const std::string kConfig = lf::testing::source_dir() + "/configs/examples/groot_tiny.yaml";
const std::vector<std::string> kTrain = {"data.mock_data=false", "model.dit_dropout=0", "model.vl_dropout=0",
                                         "model.state_dropout_prob=0", "--global-batch-size", "8", "--lr", "1e-2"};

const std::string& store() {
  static const std::string dir = [] {
    const std::string d = lf::testing::make_temp_dir("groot-reach-store") + "/store";
    auto r = run_command({bin("loongforge-data"), "make-demo-reach", "--out", d, "--episodes", "6", "--seed", "3",
                          "--image-size", "16", "--chunk", "8"},
                         {}, std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return d;
  }();
  return dir;
}

lf::testing::TrainRun train(int procs, std::vector<std::string> extra, const std::string& tag) {
  extra.insert(extra.begin(), kTrain.begin(), kTrain.end());
  extra.insert(extra.begin(), {"--data-path", store()});
  return lf::testing::train_example(kConfig, procs, extra, "groot-reach-" + tag);
}

// The flow-matching loss of random times and noise on the small store does not show 10 steps of
// progress (it starts near the targets' variance); the comparison of losses, gradient norms and
// parameters is the test (GrootTraining.DataParallelEqualsOneProcess checks that it learns).
TEST(GrootReachProgram, DataParallelOnTheStoreEqualsOneProcess) {
  lf::testing::Tolerances tol;
  tol.expect_learning = false;
  tol.param_abs = 1e-4;  // lr 1e-2: as GrootTraining.DataParallelEqualsOneProcess
  lf::testing::expect_same_training(train(1, {}, "one"), train(2, {"--use-distributed-optimizer"}, "dp2"),
                                    "groot on the reach store: dp 2, ZeRO-1", tol);
}

TEST(GrootReachProgram, EvalAndServeTheTrainedPolicy) {
  const std::string dir = lf::testing::make_temp_dir("groot-reach-eval");
  auto t = train(1, {"--save", dir + "/ck"}, "ck");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  auto eval = [&](std::vector<std::string> args) {
    args.insert(args.begin(), bin("loongforge-eval"));
    return run_command(args, {}, std::chrono::seconds(240));
  };
  const std::vector<std::string> common = {"--episodes", "2", "--seed", "500", "--image-size", "16",
                                           "--replan-steps", "4", "--max-steps", "12"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  auto r = eval(with({"--policy", "groot", "--load", dir + "/ck", "--data-path", store(), "--report",
                      dir + "/local.json"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto local = nlohmann::json::parse(lf::testing::read_file(dir + "/local.json"));
  EXPECT_EQ(local["per_episode"].size(), 2u);
  // A rerun draws the same noise (seed and call counter): the same episodes.
  r = eval(with({"--policy", "groot", "--load", dir + "/ck", "--data-path", store(), "--report", dir + "/again.json"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(lf::testing::read_file(dir + "/again.json"))["per_episode"], local["per_episode"]);

  // The same policy behind loongforge-serve-policy (its noise from the same seed): the same episodes.
  const std::string log = dir + "/serve.log";
  const auto served = lf::testing::serve_policy("--policy groot --load " + dir + "/ck --data-path " + store() +
                                                " --seed 500", log);
  ASSERT_FALSE(served.uri.empty()) << lf::testing::read_file(log);
  r = eval(with({"--server", served.uri, "--report", dir + "/served.json"}));
  served.stop();
  ASSERT_EQ(r.exit_code, 0) << r.output << lf::testing::read_file(log);
  EXPECT_EQ(nlohmann::json::parse(lf::testing::read_file(dir + "/served.json"))["per_episode"], local["per_episode"]);

  // Mistakes: --chunk (the scripted policies'), no checkpoint, a pi05 checkpoint's flag on a groot
  // one is fine but a store the policy was not trained on is not.
  r = eval(with({"--policy", "groot", "--load", dir + "/ck", "--data-path", store(), "--chunk", "5"}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("model.action_horizon"), std::string::npos) << r.output;
  // --server evaluates the server's policy: the local policy's flags are refused, not dropped.
  r = eval(with({"--server", "ws://127.0.0.1:9", "--load", dir + "/ck"}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("drop --policy, --chunk, --load and --data-path"), std::string::npos) << r.output;
  r = eval(with({"--policy", "groot"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("needs --load CHECKPOINT and --data-path STORE"), std::string::npos) << r.output;
  const std::string other = dir + "/store32";
  auto m = run_command({bin("loongforge-data"), "make-demo-reach", "--out", other, "--episodes", "1", "--image-size",
                        "32", "--chunk", "8"});
  ASSERT_EQ(m.exit_code, 0) << m.output;
  r = eval(with({"--policy", "groot", "--load", dir + "/ck", "--data-path", other}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("was not trained on the store"), std::string::npos) << r.output;
  r = eval(with({"--policy", "pi05", "--load", dir + "/ck", "--data-path", store()}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("is not a pi05 checkpoint"), std::string::npos) << r.output;
  // A store whose prompts carry located answers (make-demo-reach --located) is pi05's alone: groot
  // neither serves nor trains on it.
  const std::string located = dir + "/located";
  m = run_command({bin("loongforge-data"), "make-demo-reach", "--out", located, "--episodes", "2", "--image-size", "16",
                   "--chunk", "8", "--located"});
  ASSERT_EQ(m.exit_code, 0) << m.output;
  r = eval(with({"--policy", "groot", "--load", dir + "/ck", "--data-path", located}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("only a pi05 policy decodes"), std::string::npos) << r.output;
  std::vector<std::string> args = kTrain;
  args.insert(args.end(), {"--data-path", located, "--train-iters", "3"});
  const auto t2 = lf::testing::train_example(kConfig, 1, args, "groot-reach-located");
  EXPECT_NE(t2.exit_code, 0);
  EXPECT_NE(t2.output.find("prompt_ar_mask"), std::string::npos) << t2.output;
}

TEST(GrootReachProgram, AStoreThatDoesNotFitTheModelIsNamed) {
  auto r = train(1, {"model.action_horizon=5"}, "chunk");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model.action_horizon 8"), std::string::npos) << r.output;
  r = train(1, {"model.image_size=32"}, "size");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model.image_size 16"), std::string::npos) << r.output;
  r = train(1, {"model.action_dim=2"}, "dims");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("set model.action_dim 3"), std::string::npos) << r.output;
}

// The demo's config (configs/examples/groot_reach.yaml) is valid: its plan builds (the shapes of the
// backbone, the DiT, the store's 64 x 64 images at patch 8).
TEST(GrootReachProgram, TheDemoConfigPlans) {
  auto r = run_command({bin("loongforge-train"), "--config-file",
                        lf::testing::source_dir() + "/configs/examples/groot_reach.yaml", "--data-path", store(),
                        "--dry-run"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("AlternateVLDiT"), std::string::npos) << r.output;
}

}  // namespace

// A pi05 policy on the reach task through the programs: loongforge-data make-demo-reach writes the
// expert's episodes, loongforge-train trains a pi05 on the store (DP 2 with ZeRO-1 equals one
// process on it: fp32, 10 steps, loss relative 1e-5, parameters 1e-5, as every equivalence test),
// loongforge-eval runs the checkpoint in closed loop (--policy pi05 --load --data-path) and
// loongforge-serve-policy serves it (the same episodes through the server as in process); a store
// that does not fit the model is an error naming the key to change.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../support/oracle_cache.h"
#include "../tools/pp_training.h"
#include "serve_testing.h"

namespace {
namespace fs = std::filesystem;
using lf::testing::bin;
using lf::testing::run_command;

const std::string kConfig = lf::testing::source_dir() + "/configs/examples/pi05_reach.yaml";
// The demo's model shrunk: the test is about the path, not the policy's skill.
const std::vector<std::string> kSmall = {
    "model.vision_encoder.image_size=32", "model.vision_encoder.num_hidden_layers=1", "model.foundation.depth=1", "model.action_expert.depth=1",
    "model.foundation.width=32", "model.action_expert.width=32", "model.num_inference_steps=3",
    "--micro-batch-size", "16", "--global-batch-size", "32", "--lr", "3e-3", "--lr-warmup-iters", "1"};

const std::string& store() {
  static const std::string dir = [] {
    const std::string d = lf::testing::make_temp_dir("pi05-reach-store") + "/store";
    auto r = run_command({bin("loongforge-data"), "make-demo-reach", "--out", d, "--episodes", "6", "--seed", "3",
                          "--image-size", "32", "--chunk", "10"},
                         {}, std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return d;
  }();
  return dir;
}

lf::testing::TrainRun train(int procs, std::vector<std::string> extra, const std::string& tag) {
  // The test's own overrides last: they win over kSmall's.
  extra.insert(extra.begin(), kSmall.begin(), kSmall.end());
  extra.insert(extra.begin(), {"--data-path", store()});
  return lf::testing::train_example(kConfig, procs, extra, "pi05-reach-" + tag);
}

TEST(Pi05ReachProgram, DataParallelOnTheStoreEqualsOneProcess) {
  lf::testing::expect_same_training(train(1, {}, "one"), train(2, {"--use-distributed-optimizer"}, "dp2"),
                                    "pi05 on the reach store: dp 2, ZeRO-1");
}

TEST(Pi05ReachProgram, EvalAndServeTheTrainedPolicy) {
  const std::string dir = lf::testing::make_temp_dir("pi05-reach-eval");
  auto t = train(1, {"--save", dir + "/ck"}, "ck");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  auto eval = [&](std::vector<std::string> args) {
    args.insert(args.begin(), bin("loongforge-eval"));
    return run_command(args, {}, std::chrono::seconds(240));
  };
  const std::vector<std::string> common = {"--episodes", "2", "--seed", "500", "--image-size", "32",
                                           "--replan-steps", "5", "--max-steps", "20"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  auto r = eval(with({"--policy", "pi05", "--load", dir + "/ck", "--data-path", store(), "--report", dir + "/local.json"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto local = nlohmann::json::parse(lf::testing::read_file(dir + "/local.json"));
  EXPECT_EQ(local["per_episode"].size(), 2u);
  EXPECT_EQ(local["per_episode"][0]["steps"], 20);  // ten steps of training do not solve the task

  // The same policy behind loongforge-serve-policy (its noise from the same seed): the same episodes.
  const std::string log = dir + "/serve.log";
  const auto served = lf::testing::serve_policy("--policy pi05 --load " + dir + "/ck --data-path " + store() +
                                                " --seed 500", log);
  ASSERT_FALSE(served.uri.empty()) << lf::testing::read_file(log);
  r = eval(with({"--server", served.uri, "--report", dir + "/served.json"}));
  served.stop();
  ASSERT_EQ(r.exit_code, 0) << r.output << lf::testing::read_file(log);
  EXPECT_EQ(nlohmann::json::parse(lf::testing::read_file(dir + "/served.json"))["per_episode"], local["per_episode"]);

  // Mistakes: --chunk (the scripted policies'), no checkpoint, a store the policy was not trained on.
  r = eval(with({"--policy", "pi05", "--load", dir + "/ck", "--data-path", store(), "--chunk", "5"}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--chunk sets the scripted policies' chunk"), std::string::npos) << r.output;
  auto s = run_command({bin("loongforge-serve-policy"), "--policy", "pi05", "--load", dir + "/ck", "--data-path",
                        store(), "--chunk", "5"});
  EXPECT_EQ(s.exit_code, 2);
  EXPECT_NE(s.output.find("--chunk sets the scripted policies' chunk"), std::string::npos) << s.output;
  r = eval(with({"--policy", "pi05"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("needs --load CHECKPOINT and --data-path STORE"), std::string::npos) << r.output;
  const std::string other = dir + "/store16";
  auto m = run_command({bin("loongforge-data"), "make-demo-reach", "--out", other, "--episodes", "1", "--image-size",
                        "16"});
  ASSERT_EQ(m.exit_code, 0) << m.output;
  r = eval(with({"--policy", "pi05", "--load", dir + "/ck", "--data-path", other}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("was not trained on the store"), std::string::npos) << r.output;
}

TEST(Pi05ReachProgram, AStoreThatDoesNotFitTheModelIsNamed) {
  auto r = train(1, {"model.chunk_size=5"}, "chunk");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model.chunk_size 10"), std::string::npos) << r.output;
  r = train(1, {"model.vision_encoder.image_size=16"}, "size");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model.vision_encoder.image_size 32"), std::string::npos) << r.output;
}

// A LeRobot dataset lerobot recorded (tests/vla/pi05_lerobot_inputs_oracle.py: two 32x48 AV1
// cameras, state [3], action [2], 28 frames; a PaliGemma-style tokenizer) trains a pi05 directly
// (the batches are vla/lerobot_inputs.h's, tested against LeRobot's preprocessor): DP 2 with
// ZeRO-1 equals one process, and the mistakes a user meets are named.
std::string lerobot_oracle() {
  static const std::string d = lf::testing::cached_oracle(
      lf::testing::source_dir() + "/tests/vla/pi05_lerobot_inputs_oracle.py", "pi05_lerobot_inputs", "done",
      lf::testing::lerobot_python());
  return d;
}

const std::vector<std::string> kLeRobotModel = {
    "model.vision_encoder.image_size=32", "model.vision_encoder.patch_size=8", "model.chunk_size=4",
    "model.action_dim=2", "model.max_action_dim=6", "model.tokenizer_max_length=48",
    "model.foundation.vocab_size=512", "--seq-length", "84", "--micro-batch-size", "4", "--global-batch-size", "8",
    "--lr-warmup-iters", "1"};

lf::testing::TrainRun train_lerobot(int procs, std::vector<std::string> extra, const std::string& tag) {
  extra.insert(extra.begin(), kLeRobotModel.begin(), kLeRobotModel.end());
  extra.insert(extra.begin(), {"data.mock_data=false", "--data-path", lerobot_oracle() + "/v30", "--tokenizer-model",
                               lerobot_oracle() + "/tokenizer", "--split", "90,10,0"});
  return lf::testing::train_example(lf::testing::source_dir() + "/configs/examples/pi05_tiny.yaml", procs, extra,
                                    "pi05-lerobot-" + tag);
}

TEST(Pi05LeRobotProgram, DataParallelOnALeRobotDatasetEqualsOneProcess) {
  if (lerobot_oracle().empty()) GTEST_SKIP() << "no LeRobot environment (.venv-lerobot)";
  auto one = train_lerobot(1, {}, "one");
  EXPECT_NE(one.output.find("LeRobot dataset " + lerobot_oracle() + "/v30 (v3.0): 28 frames of 3 episodes"),
            std::string::npos)
      << one.output;
  lf::testing::Tolerances tol;
  tol.expect_learning = false;  // flow matching's random times and noise over 10 steps
  lf::testing::expect_same_training(one, train_lerobot(2, {"--use-distributed-optimizer"}, "dp2"),
                                    "pi05 on a LeRobot dataset: dp 2, ZeRO-1", tol);
}

TEST(Pi05LeRobotProgram, MistakesAreNamed) {
  if (lerobot_oracle().empty()) GTEST_SKIP() << "no LeRobot environment (.venv-lerobot)";
  auto no_tok = lf::testing::train_example(
      lf::testing::source_dir() + "/configs/examples/pi05_tiny.yaml", 1,
      {"data.mock_data=false", "--data-path", lerobot_oracle() + "/v30", "model.vision_encoder.image_size=32",
       "model.chunk_size=4",
       "model.action_dim=2"},
      "pi05-lerobot-notok");
  EXPECT_NE(no_tok.exit_code, 0);
  EXPECT_NE(no_tok.output.find("data.tokenizer_model is not set"), std::string::npos) << no_tok.output;
  auto dims = train_lerobot(1, {"model.action_dim=3"}, "dims");
  EXPECT_NE(dims.exit_code, 0);
  EXPECT_NE(dims.output.find("set model.action_dim 2"), std::string::npos) << dims.output;
  auto groot = lf::testing::train_example(
      lf::testing::source_dir() + "/configs/examples/groot_tiny.yaml", 1,
      {"data.mock_data=false", "--data-path", lerobot_oracle() + "/v30", "--tokenizer-model",
       lerobot_oracle() + "/tokenizer"},
      "groot-lerobot");
  EXPECT_NE(groot.exit_code, 0);
  EXPECT_NE(groot.output.find("reads LeRobot datasets for pi05 policies (a groot policy needs its own processor"),
            std::string::npos)
      << groot.output;
}

}  // namespace

// The pi05 composite through the programs as users run them. loongforge-train on mock VLA batches:
// TP 2 (one key/value head: replicated keys/values) and DP 2 with ZeRO-1 each equal the single
// process (fp32, 10 steps; per-step loss relative 1e-5, final parameters max-abs 1e-5, as every
// equivalence test in pp_training.h: the same ops in another summation order); a checkpoint
// resumes exactly; frozen components stay fixed; layouts it cannot take are configuration errors.
// loongforge-convert hf2lf / lf2hf on LeRobot's pi05 directories (the export loads in LeRobot with
// every key, equal to the original), and loongforge-generate --policy-inputs equal to LeRobot's
// loss and sampled actions (tests/models/pi05_oracle.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>

#include "../models/cached_oracle.h"
#include "loongforge/train/checkpoint.h"
#include "pp_training.h"

namespace {
namespace fs = std::filesystem;
using lf::testing::bin;
using lf::testing::TrainRun;

const std::string kConfig = lf::testing::source_dir() + "/configs/examples/pi05_tiny.yaml";

TrainRun run(int procs, const std::vector<std::string>& extra, const std::string& tag) {
  return lf::testing::train_example(kConfig, procs, extra, "pi05-" + tag);
}

const TrainRun& single() {
  static const TrainRun r = run(1, {}, "one");
  return r;
}

TEST(Pi05Training, TensorParallelEqualsOneProcess) {
  lf::testing::expect_same_training(single(), run(2, {"--tensor-model-parallel-size", "2"}, "tp2"), "pi05: tp 2");
}

TEST(Pi05Training, DataParallelEqualsOneProcess) {
  lf::testing::expect_same_training(single(), run(2, {"--use-distributed-optimizer"}, "dp2"), "pi05: dp 2, ZeRO-1");
}

// bf16 (the model's weights and activations; the adaRMS modulation, the flow-matching target and the
// output projection in fp32): each step's loss within 5% of fp32's.
TEST(Pi05Training, Bf16Trains) {
  auto bf16 = run(1, {"--bf16"}, "bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  ASSERT_EQ(bf16.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_NEAR(bf16.losses[i], single().losses[i], 0.05 * single().losses[i]) << i;
}

// Stop at step 5 with a checkpoint, resume: steps 6..10 equal the straight run (the step counter of
// the noise and time stream is in the checkpoint).
TEST(Pi05Training, ResumeIsExact) {
  const std::string dir = lf::testing::make_temp_dir("pi05-resume");
  auto first = run(1, {"--save", dir + "/ck", "--exit-interval", "5"}, "resume_a");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = run(1, {"--load", dir + "/ck"}, "resume_b");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  ASSERT_EQ(second.losses.size(), 5u) << second.output;
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(second.losses[i], single().losses[5 + i], 1e-6 * single().losses[5 + i]) << i;
  EXPECT_LE(lf::testing::max_abs_diff(single().params, second.params), 1e-6);
}

// Saved at TP 2, resumed in one process: the per-rank RNG states are not loaded at another layout,
// and the noise and timestep streams continue from the checkpoint's iteration (they restarted at
// step 1: losses 50% off). Steps 6..10 equal the straight run within the equivalence tolerances.
TEST(Pi05Training, ResumeAtAnotherLayoutContinuesTheNoiseStreams) {
  lf::testing::expect_resume_at_another_layout(kConfig, single(), 2, {"--tensor-model-parallel-size", "2"},
                                               "pi05-resume-layout");
}

// LeRobot's train_expert_only: the vision tower and the PaliGemma LM frozen (unchanged between the
// checkpoints of steps 1 and 10), the expert trains.
TEST(Pi05Training, FrozenComponentsStayFixed) {
  const std::string dir = lf::testing::make_temp_dir("pi05-freeze");
  auto r = run(1, {"model.vision_encoder.freeze=true", "model.foundation.freeze=true", "--save", dir + "/ck",
                   "--save-interval", "1"},
               "freeze");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto a = lf::train::read_model_checkpoint(dir + "/ck", 1), b = lf::train::read_model_checkpoint(dir + "/ck", 10);
  std::map<std::string, at::Tensor> before(a.tensors.begin(), a.tensors.end());
  int moved = 0, fixed = 0;
  for (const auto& [name, t] : b.tensors) {
    const bool frozen = name.starts_with("paligemma_with_expert.paligemma.");
    const bool same = at::equal(t, before.at(name));
    if (frozen) {
      EXPECT_TRUE(same) << name;
      ++fixed;
    } else if (!same) {
      ++moved;
    }
  }
  EXPECT_GT(fixed, 10);
  EXPECT_GT(moved, 10);
  // freeze_vision_encoder: the SigLIP tower only; the projector trains with the LM.
  auto v = run(1, {"model.vision_encoder.freeze=true", "--save", dir + "/v", "--save-interval", "1"}, "freeze_vision");
  ASSERT_EQ(v.exit_code, 0) << v.output;
  auto v1 = lf::train::read_model_checkpoint(dir + "/v", 1), v10 = lf::train::read_model_checkpoint(dir + "/v", 10);
  std::map<std::string, at::Tensor> first(v1.tensors.begin(), v1.tensors.end());
  int tower = 0, projector = 0;
  for (const auto& [name, t] : v10.tensors) {
    if (name.find(".vision_tower.") != std::string::npos) {
      EXPECT_TRUE(at::equal(t, first.at(name))) << name;
      ++tower;
    }
    if (name.find(".multi_modal_projector.linear.weight") != std::string::npos) {
      EXPECT_FALSE(at::equal(t, first.at(name))) << name;
      ++projector;
    }
  }
  EXPECT_GT(tower, 10);
  EXPECT_EQ(projector, 1);
}

TEST(Pi05Training, LayoutsItCannotTakeAreConfigurationErrors) {
  auto expect = [](std::vector<std::string> args, int procs, const std::string& key) {
    std::vector<std::string> argv;
    if (procs > 1) argv = {bin("loongforge-run"), "--standalone", "--nproc-per-node", std::to_string(procs)};
    argv.insert(argv.end(), {bin("loongforge-train"), "--config-file", kConfig, "--dry-run"});
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = lf::testing::run_command(argv);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(key), std::string::npos) << key << "\n" << r.output;
  };
  expect({"--pipeline-model-parallel-size", "2"}, 2, "parallel.pipeline_model_parallel_size");
  expect({"--expert-model-parallel-size", "2"}, 2, "parallel.expert_model_parallel_size");
  expect({"--moe-token-dispatcher-type", "alltoall"}, 1, "parallel.moe_token_dispatcher_type");
  expect({"--overlap-moe-expert-parallel-comm"}, 1, "parallel.overlap_moe_expert_parallel_comm");
  expect({"--decoder-first-pipeline-num-layers", "1"}, 1, "parallel.decoder_first_pipeline_num_layers");
  expect({"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 2, "parallel.sequence_parallel");
  expect({"--tensor-model-parallel-size", "3"}, 3, "model.foundation.num_heads");
  expect({"++model.vision_encoder.tensor_model_parallel_size=2"}, 1, "model.vision_encoder.tensor_model_parallel_size");
  expect({"model.action_expert.num_heads=4"}, 1, "model.action_expert.num_heads");
  expect({"model.action_expert.depth=3"}, 1, "model.action_expert.depth");
  expect({"model.action_dim=9"}, 1, "model.action_dim");
  expect({"--recompute-granularity", "full"}, 1, "training.recompute_granularity");
}

std::string oracle_dir() {
  static const std::string dir = lf::testing::cached_oracle(lf::testing::source_dir() + "/tests/models/pi05_oracle.py",
                                                            "pi05_oracle", "done", lf::testing::lerobot_python());
  return dir;
}

double max_diff(const std::string& file, const std::string& name, const at::Tensor& want) {
  auto t = lf::testing::read_safetensors(file);
  EXPECT_TRUE(t.count(name)) << file;
  if (!t.count(name)) return 1e9;
  EXPECT_EQ(t.at(name).sizes(), want.sizes());
  return (t.at(name) - want).abs().max().item<double>();
}

// hf2lf at TP 2 and back: LeRobot loads the export with every key, equal to the original; generate
// --policy-inputs gives LeRobot's loss and actions from the LeRobot directory and the checkpoint.
TEST(Pi05Programs, ConvertAndGenerateMatchLeRobot) {
  if (oracle_dir().empty()) GTEST_SKIP() << "no LeRobot environment (.venv-lerobot)";
  const std::string dir = lf::testing::make_temp_dir("pi05-convert");
  for (const char* name : {"two_cameras", "wide"}) {
    const std::string src = oracle_dir() + "/" + name;
    const std::string ck = dir + "/" + name + "_ck", back = dir + "/" + name + "_back";
    auto c = lf::testing::run_command({bin("loongforge-convert"), "hf2lf", "--hf-dir", src + "/policy", "--out", ck,
                                       "--tp", "2"},
                                      {}, std::chrono::seconds(120));
    ASSERT_EQ(c.exit_code, 0) << c.output;
    auto e = lf::testing::run_command({bin("loongforge-convert"), "lf2hf", "--load", ck, "--out", back, "--dtype", "fp32"},
                                      {}, std::chrono::seconds(120));
    ASSERT_EQ(e.exit_code, 0) << e.output;
    auto check = lf::testing::run_command({lf::testing::lerobot_python(),
                                           lf::testing::source_dir() + "/tests/tools/pi05_lerobot_check.py",
                                           src + "/policy", back},
                                          {}, std::chrono::seconds(240));
    ASSERT_EQ(check.exit_code, 0) << check.output;
    EXPECT_NE(check.output.find("max difference 0\n"), std::string::npos) << check.output;
    auto want = lf::testing::read_safetensors(src + "/expected.safetensors");
    for (const std::string& load : {src + "/policy", ck}) {
      std::filesystem::remove(dir + "/loss.safetensors");  // each run writes its own
      std::filesystem::remove(dir + "/actions.safetensors");
      auto g = lf::testing::run_command({bin("loongforge-generate"), "--load", load, "--policy-inputs",
                                         src + "/inputs.safetensors", "--dump-loss", dir + "/loss.safetensors",
                                         "--dump-actions", dir + "/actions.safetensors"},
                                        {}, std::chrono::seconds(120));
      ASSERT_EQ(g.exit_code, 0) << g.output;
      EXPECT_LE(max_diff(dir + "/loss.safetensors", "loss", want.at("loss")), 1e-4) << name << " " << load;
      EXPECT_LE(max_diff(dir + "/actions.safetensors", "actions", want.at("actions")), 1e-4) << name << " " << load;
    }
    // --num-inference-steps overrides the policy's num_inference_steps (sample_actions' num_steps).
    std::filesystem::remove(dir + "/actions.safetensors");
    auto g = lf::testing::run_command({bin("loongforge-generate"), "--load", ck, "--policy-inputs",
                                       src + "/inputs.safetensors", "--dump-actions", dir + "/actions.safetensors",
                                       "--num-inference-steps", "2"},
                                      {}, std::chrono::seconds(120));
    ASSERT_EQ(g.exit_code, 0) << g.output;
    EXPECT_NE(g.output.find("(2 Euler steps)"), std::string::npos) << g.output;
    EXPECT_LE(max_diff(dir + "/actions.safetensors", "actions", want.at("actions_2_steps")), 1e-4) << name;
    EXPECT_GT((want.at("actions_2_steps") - want.at("actions")).abs().max().item<double>(), 1e-3) << name;
  }
}

// A trained checkpoint (no LeRobot config.json beside it) exports with LeRobot's defaults and loads.
TEST(Pi05Programs, TrainedCheckpointExportsToLeRobot) {
  if (oracle_dir().empty()) GTEST_SKIP() << "no LeRobot environment (.venv-lerobot)";
  const std::string dir = lf::testing::make_temp_dir("pi05-export");
  auto r = run(1, {"--train-iters", "3", "--save", dir + "/ck"}, "export");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto e = lf::testing::run_command({bin("loongforge-convert"), "lf2hf", "--load", dir + "/ck", "--out", dir + "/hf",
                                     "--dtype", "fp32"},
                                    {}, std::chrono::seconds(120));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  auto shard = lf::testing::run_command({bin("loongforge-convert"), "lf2hf", "--load", dir + "/ck", "--out",
                                         dir + "/hf2", "--max-shard-size", "1MB"},
                                        {}, std::chrono::seconds(120));
  EXPECT_NE(shard.exit_code, 0);
  EXPECT_NE(shard.output.find("--max-shard-size cannot split it"), std::string::npos) << shard.output;
  auto check = lf::testing::run_command({lf::testing::lerobot_python(),
                                         lf::testing::source_dir() + "/tests/tools/pi05_lerobot_check.py", dir + "/hf"},
                                        {}, std::chrono::seconds(240));
  ASSERT_EQ(check.exit_code, 0) << check.output;
}

TEST(Pi05Programs, GenerateMistakesAreNamed) {
  if (oracle_dir().empty()) GTEST_SKIP() << "no LeRobot environment (.venv-lerobot)";
  const std::string src = oracle_dir() + "/two_cameras";
  const std::string dir = lf::testing::make_temp_dir("pi05-generate-errors");
  auto gen = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {bin("loongforge-generate"), "--load", src + "/policy"});
    return lf::testing::run_command(args, {}, std::chrono::seconds(60));
  };
  auto a = gen({"--policy-inputs", src + "/inputs.safetensors"});
  EXPECT_NE(a.exit_code, 0);
  EXPECT_NE(a.output.find("--dump-loss"), std::string::npos) << a.output;
  auto b = gen({"--prompt", "hi"});
  EXPECT_NE(b.exit_code, 0);
  EXPECT_NE(b.output.find("--prompt does not apply to a pi05 policy"), std::string::npos) << b.output;
  auto f = gen({"--policy-inputs", src + "/inputs.safetensors", "--dump-actions", dir + "/a.safetensors", "--bf16"});
  EXPECT_NE(f.exit_code, 0);
  EXPECT_NE(f.output.find("--bf16 does not apply to a pi05 policy"), std::string::npos) << f.output;
  // Flags with defaults for other models are refused too, not ignored.
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--guidance-scale", "3"}, {"--temperature", "0.5"}, {"--seed", "3"}}) {
    std::vector<std::string> args = {"--policy-inputs", src + "/inputs.safetensors", "--dump-actions",
                                     dir + "/a.safetensors"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = gen(args);
    EXPECT_NE(r.exit_code, 0) << flags[0];
    EXPECT_NE(r.output.find(flags[0] + " does not apply to a pi05 policy"), std::string::npos) << r.output;
  }
  auto s = gen({"--policy-inputs", src + "/inputs.safetensors", "--dump-loss", dir + "/l.safetensors",
                "--num-inference-steps", "2"});
  EXPECT_NE(s.exit_code, 0);
  EXPECT_NE(s.output.find("--num-inference-steps sets the Euler steps of --dump-actions"), std::string::npos)
      << s.output;
  auto c = gen({"--policy-inputs", src + "/expected.safetensors", "--dump-loss", dir + "/l.safetensors"});
  EXPECT_NE(c.exit_code, 0);
  EXPECT_NE(c.output.find("unknown tensor '"), std::string::npos) << c.output;
  auto d = gen({"--policy-inputs", dir + "/missing.safetensors", "--dump-actions", dir + "/a.safetensors"});
  EXPECT_NE(d.exit_code, 0);
  EXPECT_NE(d.output.find("no such file"), std::string::npos) << d.output;
}

}  // namespace

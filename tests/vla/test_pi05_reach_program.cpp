// A pi05 policy on the reach task through the programs: loongforge-data make-demo-reach writes the
// expert's episodes, loongforge-train trains a pi05 on the store (DP 2 with ZeRO-1 equals one
// process on it: fp32, 10 steps, loss relative 1e-5, parameters 1e-5, as every equivalence test),
// loongforge-eval runs the checkpoint in closed loop (--policy pi05 --load --data-path) and
// loongforge-serve-policy serves it (the same episodes through the server as in process); a store
// that does not fit the model is an error naming the key to change; the prefix LM co-trained on a
// store's position queries (TP 2 and DP 2 equal one process). A pi05 trained on a LeRobot
// dataset is served as its frames were trained on (Pi05LeRobotPolicy), through the OpenPI client too.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include "../support/oracle_cache.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/data/lerobot_dataset.h"
#include "loongforge/models/composites/pi05.h"
#include "loongforge/models/pi05_lerobot.h"
#include "loongforge/train/checkpoint.h"
#include "loongforge/vla/pi05_policy.h"
#include "loongforge/vla/reach_demo.h"
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

// The test's store: 6 episodes of 32x32 images, chunks of 10 (and `extra` make-demo-reach flags).
std::string make_store(const std::string& tag, const std::vector<std::string>& extra = {}) {
  const std::string d = lf::testing::make_temp_dir(tag) + "/store";
  std::vector<std::string> args{bin("loongforge-data"), "make-demo-reach", "--out", d, "--episodes", "6", "--seed",
                                "3", "--image-size", "32", "--chunk", "10"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_command(args, {}, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return d;
}

const std::string& store() {
  static const std::string dir = make_store("pi05-reach-store");
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

// Gradient-accumulation fusion (the default: every linear layer's backward writes its weight
// gradient into the trainer's buffer, the second micro-batch adding with the GEMM) against the
// gradients through autograd: the same training (fp32, 10 steps, 2 micro-batches a step).
TEST(Pi05ReachProgram, GradientAccumulationFusionEqualsAutograd) {
  lf::testing::expect_same_training(train(1, {}, "fused"), train(1, {"--no-gradient-accumulation-fusion"}, "unfused"),
                                    "pi05 on the reach store: linear weight gradients into the buffer vs autograd");
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
  EXPECT_FALSE(local.contains("located"));           // its prompts have no located answers

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

// Co-training of the prefix LM on the store's position queries (make-demo-reach
// --position-queries, model.prefix_lm_loss_weight > 0): its cross entropy is logged beside the
// flow-matching loss in training and validation, TP 2 and DP 2 with ZeRO-1 equal one process, and a
// store without the labels is an error naming the key and the flag.
const std::string& queries_store() {
  static const std::string dir = make_store("pi05-reach-queries", {"--position-queries"});
  return dir;
}

lf::testing::TrainRun train_queries(int procs, std::vector<std::string> extra, const std::string& tag) {
  extra.insert(extra.begin(), kSmall.begin(), kSmall.end());
  extra.insert(extra.begin(), {"--data-path", queries_store(), "model.prefix_lm_loss_weight=0.5", "--eval-interval",
                               "5", "--eval-iters", "1"});
  return lf::testing::train_example(kConfig, procs, extra, "pi05-reach-queries-" + tag);
}

TEST(Pi05ReachProgram, PrefixLmCoTrainingOnPositionQueries) {
  const auto one = train_queries(1, {}, "one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_TRUE(std::regex_search(one.output, std::regex(R"(flow matching loss [0-9.]+ \| prefix lm loss [0-9.]+)")))
      << one.output;
  EXPECT_TRUE(std::regex_search(one.output, std::regex(R"(validation at iteration 5 \| flow matching loss [0-9.]+ \| prefix lm loss [0-9.]+)")))
      << one.output;
  lf::testing::expect_same_training(one, train_queries(2, {"--tensor-model-parallel-size", "2"}, "tp2"),
                                    "pi05 with the prefix LM loss: tp 2");
  lf::testing::expect_same_training(one, train_queries(2, {"--use-distributed-optimizer"}, "dp2"),
                                    "pi05 with the prefix LM loss: dp 2, ZeRO-1");
  // The tied head's weight gradient written into the buffer, the lookup's added: as autograd.
  lf::testing::expect_same_training(one, train_queries(1, {"--no-gradient-accumulation-fusion"}, "unfused"),
                                    "pi05 with the prefix LM loss: fused vs autograd weight gradients");
  // bf16 weights and activations (the head in bf16, the cross entropy in fp32): the fp32 losses
  // within bf16's rounding over 10 steps.
  const auto bf16 = train_queries(1, {"--bf16"}, "bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  ASSERT_EQ(bf16.losses.size(), one.losses.size());
  for (size_t i = 0; i < one.losses.size(); ++i) EXPECT_NEAR(bf16.losses[i], one.losses[i], 0.05 * one.losses[i]) << i;
  // The weight without labels in the store.
  auto r = train(1, {"model.prefix_lm_loss_weight=0.5"}, "no-labels");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no field 'prompt_labels'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--position-queries"), std::string::npos) << r.output;
}

// The demo's recipe: a store with position and scene queries (32-token prompts) trains a pi05 with
// the prefix LM loss, fan_in initialisation and the sin-cos position embedding (a different first
// loss than the default initialisation on the same batches); sincos2d on a width that is not a
// multiple of 4 is a configuration error naming the key.
TEST(Pi05ReachProgram, SceneQueriesAndTheInitialisationKeysTrain) {
  static const std::string scene = make_store("pi05-reach-scene", {"--position-queries", "--scene-queries"});
  auto run = [&](std::vector<std::string> extra, const std::string& tag) {
    extra.insert(extra.begin(), kSmall.begin(), kSmall.end());
    extra.insert(extra.begin(), {"--data-path", scene, "model.prefix_lm_loss_weight=0.5", "--train-iters", "3"});
    return lf::testing::train_example(kConfig, 1, extra, "pi05-reach-scene-" + tag);
  };
  const auto plain = run({}, "plain");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("prompts of 32 tokens with position and scene queries"), std::string::npos)
      << plain.output;
  ASSERT_FALSE(plain.losses.empty());
  // Each key on its own reaches the model (a different first loss: runs repeat exactly, and the
  // sin-cos code alone moves it by ~5e-4 relative under the small N(0, 0.02) weights), and both together.
  for (const auto& keys : std::vector<std::vector<std::string>>{
           {"model.init_method=fan_in"},
           {"model.vision_encoder.position_embedding_init=sincos2d"},
           {"model.init_method=fan_in", "model.vision_encoder.position_embedding_init=sincos2d"}}) {
    const auto init = run(keys, "init" + std::to_string(keys.size()) + keys[0].substr(6, 4));
    ASSERT_EQ(init.exit_code, 0) << init.output;
    ASSERT_FALSE(init.losses.empty());
    EXPECT_GT(std::abs(init.losses[0] - plain.losses[0]), 1e-5 * plain.losses[0]) << keys.back();
  }
  const auto bad = run({"model.vision_encoder.position_embedding_init=sincos2d", "model.vision_encoder.hidden_size=18",
                        "model.vision_encoder.num_attention_heads=2"},
                       "bad");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("model.vision_encoder.position_embedding_init"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("not a multiple of 4"), std::string::npos) << bad.output;
}

// make-demo-reach --located (pi0.5's hierarchical inference): the prefix LM is trained on the named
// objects' queries while the expert reads the true answers behind them (prompt_ar_mask); TP 2
// equals one process on it; the trained policy first decodes the answers (the likeliest bin at
// each query) and then samples its actions after them, in process and through loongforge-eval; a
// checkpoint without the prefix LM head cannot decode them (named).
TEST(Pi05ReachProgram, LocatedAnswersAreTrainedOnAndDecodedBeforeActing) {
  static const std::string located = make_store("pi05-reach-located", {"--located"});
  const std::string dir = lf::testing::make_temp_dir("pi05-reach-located-ck");
  auto run = [&](int procs, std::vector<std::string> extra, const std::string& tag) {
    extra.insert(extra.begin(), kSmall.begin(), kSmall.end());
    extra.insert(extra.begin(), {"--data-path", located});
    return lf::testing::train_example(kConfig, procs, extra, "pi05-reach-located-" + tag);
  };
  const auto one = run(1, {"model.prefix_lm_loss_weight=0.5", "--save", dir + "/ck"}, "one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("prompts of 24 tokens with located queries"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("located answers after them (prompt_ar_mask)"), std::string::npos) << one.output;
  lf::testing::expect_same_training(one, run(2, {"model.prefix_lm_loss_weight=0.5", "--tensor-model-parallel-size", "2"}, "tp2"),
                                    "pi05 on located answers: tp 2");

  // The policy's chunk for an observation, and the same computed here from the checkpoint.
  lf::vla::ReachOptions o;
  o.image_size = 32;
  lf::vla::ReachEnv env(o);
  const auto obs = env.reset(500);
  lf::vla::Pi05ReachPolicy policy(dir + "/ck", located, 9);
  const at::Tensor got = policy.infer(obs);
  auto full = lf::train::read_model_checkpoint(dir + "/ck");
  const auto setup = lf::models::lerobot::pi05_setup_from_model_section(full.config_yaml, "ck");
  ASSERT_TRUE(setup.has_value());
  lf::models::Pi05 model(setup->vision, setup->vlm, setup->expert, setup->policy, lf::backend::cpu_backend(), 0,
                         at::kFloat, nullptr);
  model.load_full(std::map<std::string, at::Tensor>(full.tensors.begin(), full.tensors.end()), "ck");
  const auto meta = lf::vla::read_reach_demo_meta(located);
  auto [tokens, mask] = meta.prompt.encode(obs.prompt, obs.at("observation/state"));
  lf::models::Pi05Inputs in;
  in.images = (obs.at("observation/image").permute({2, 0, 1}).to(at::kFloat) / 127.5 - 1.0).view({1, 1, 3, 32, 32});
  in.img_masks = at::ones({1, 1}, at::kBool);
  in.tokens = tokens.unsqueeze(0);
  in.masks = mask.unsqueeze(0);
  in.ar_mask = meta.prompt.ar_mask(tokens).unsqueeze(0);
  const auto logits = model.prompt_logits(in)[0];
  const auto words = meta.prompt.vocab();
  const int64_t s0 = std::find(words.begin(), words.end(), "s0") - words.begin();
  const auto slots = meta.prompt.located_slots(tokens);
  std::array<double, 4> answers{};
  for (size_t i = 0; i < 4; ++i)
    answers[i] = (static_cast<double>(logits[slots[i]].narrow(0, s0, 32).argmax().item<int64_t>()) + 0.5) / 32.0;
  meta.prompt.set_answers(tokens, answers);
  in.tokens = tokens.unsqueeze(0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9ull * 1000003ull);
  const auto noise = at::normal(0.0, 1.0, {1, 10, setup->policy.max_action_dim}, gen, at::kFloat);
  at::Tensor want;
  {
    at::NoGradGuard no_grad;
    want = lf::vla::unnormalize_reach_actions(model.sample_actions(in, noise)[0].narrow(1, 0, 3), meta.max_speed);
  }
  EXPECT_TRUE(at::allclose(got, want, 1e-6, 1e-7)) << got << want;

  // Through loongforge-eval, which reports how often the decoded positions were near the truth.
  auto r = run_command({bin("loongforge-eval"), "--policy", "pi05", "--load", dir + "/ck", "--data-path", located,
                        "--episodes", "1", "--seed", "500", "--image-size", "32", "--max-steps", "10",
                        "--replan-steps", "5", "--report", dir + "/eval.json"},
                       {}, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("located by the policy (within 0.05 of the truth): the instructed block in "), std::string::npos)
      << r.output;
  const auto report = nlohmann::json::parse(lf::testing::read_file(dir + "/eval.json"));
  EXPECT_EQ(report["located"]["calls"], 2);  // 10 steps, replanning every 5
  EXPECT_LE(report["located"]["instructed_block_near"].get<int64_t>(), 2);
  // Without the prefix LM head there is nothing to decode the answers with.
  const auto headless = run(1, {"--save", dir + "/headless"}, "headless");
  ASSERT_EQ(headless.exit_code, 0) << headless.output;
  try {
    lf::vla::Pi05ReachPolicy bad(dir + "/headless", located, 9);
    FAIL() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.prefix_lm_loss_weight"), std::string::npos) << e.what();
  }
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

// A frame's images as a client sends them: the first camera [H, W, 3] under observation/<last part of
// its key> (LIBERO's naming), the others [3, H, W] under their dataset key.
lf::vla::Observation frame_observation(const lf::data::LeRobotItem& item, const std::vector<std::string>& cameras) {
  lf::vla::Observation obs;
  for (size_t k = 0; k < cameras.size(); ++k) {
    const auto& img = item.tensors.at(cameras[k]);  // uint8 [C, H, W]
    if (k == 0)
      obs.arrays["observation/" + cameras[k].substr(cameras[k].rfind('.') + 1)] = img.permute({1, 2, 0}).contiguous();
    else
      obs.arrays[cameras[k]] = img;
  }
  obs.arrays["observation/state"] = item.tensors.at("observation.state");
  obs.prompt = item.task;
  return obs;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const lf::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Pi05LeRobotProgram, ServedAsItsFramesAreTrainedOn) {
  if (lerobot_oracle().empty()) GTEST_SKIP() << "no LeRobot environment (.venv-lerobot)";
  const std::string dir = lf::testing::make_temp_dir("pi05-lerobot-serve");
  const std::string data = lerobot_oracle() + "/v30";
  auto t = train_lerobot(1, {"--save", dir + "/ck"}, "serve");
  ASSERT_EQ(t.exit_code, 0) << t.output;

  // In process: an observation made of frame i (its camera images, state and task) gives the chunk
  // the model samples from the training batch of frame i, in the dataset's units: the quantile
  // normalisation undone as y -> q01 + (y + 1) / 2 (q99 - q01). The tokenizer is the one the
  // checkpoint's config.yaml names.
  lf::vla::Pi05LeRobotPolicy policy(dir + "/ck", data, "", 7);
  const auto& model = policy.model();
  const auto& c = model.config();
  const lf::data::LeRobotDataset ds(data);
  const auto& st = ds.stats("action");
  const auto q01 = st.at("q01").to(at::kFloat), q99 = st.at("q99").to(at::kFloat);
  for (int64_t i : {0, 13, 27}) {
    const auto noise = at::randn({1, c.chunk_size, c.max_action_dim}, at::kFloat);
    const auto got = policy.actions(frame_observation(ds.get(i), policy.inputs().cameras()), noise);
    at::Tensor normalized;
    {
      at::NoGradGuard g;
      normalized = model.sample_actions(model.inputs_of(policy.inputs().batch({i})), noise)[0].narrow(1, 0, c.action_dim);
    }
    const auto want = q01 + (normalized + 1.0) / 2.0 * (q99 - q01);
    ASSERT_EQ(got.sizes(), want.sizes()) << "frame " << i;
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-5) << "frame " << i;
  }
  EXPECT_EQ(policy.metadata()["cameras"], nlohmann::json(std::vector<std::string>{"observation.images.front",
                                                                                   "observation.images.wrist"}));
  EXPECT_EQ(policy.metadata()["state_dim"], 3);

  // What a client gets wrong is named.
  const auto item = ds.get(5);
  auto obs = frame_observation(item, policy.inputs().cameras());
  auto bad = obs;
  bad.arrays.erase("observation.images.wrist");
  EXPECT_NE(error_of([&] { policy.infer(bad); }).find("no image for the dataset's camera observation.images.wrist"),
            std::string::npos);
  bad = obs;
  bad.arrays["images/wrist"] = bad.arrays.at("observation.images.wrist");
  bad.arrays.erase("observation.images.wrist");
  bad.arrays["cams/wrist"] = bad.arrays.at("images/wrist");
  EXPECT_NE(error_of([&] { policy.infer(bad); }).find("matches several arrays (cams/wrist, images/wrist)"),
            std::string::npos);
  bad = obs;
  bad.arrays["observation.images.wrist"] = bad.arrays.at("observation.images.wrist").to(at::kFloat);  // 0..255
  EXPECT_NE(error_of([&] { policy.infer(bad); }).find("float images must be in [0, 1]"), std::string::npos);
  bad = obs;
  bad.arrays["observation/state"] = at::zeros({4});
  EXPECT_NE(error_of([&] { policy.infer(bad); }).find("the state must be 3 floats"), std::string::npos);
  bad = obs;
  bad.prompt = "";
  EXPECT_NE(error_of([&] { policy.infer(bad); }).find("has no prompt"), std::string::npos);
  // Float images in [0, 1] are the uint8 ones / 255.
  auto as_float = obs;
  for (auto& [name, a] : as_float.arrays)
    if (a.scalar_type() == at::kByte) a = a.to(at::kFloat) / 255.0;
  const auto noise = at::randn({1, c.chunk_size, c.max_action_dim}, at::kFloat);
  EXPECT_LE((policy.actions(as_float, noise) - policy.actions(obs, noise)).abs().max().item<double>(), 1e-5);
  EXPECT_NE(error_of([&] { lf::vla::Pi05LeRobotPolicy(dir + "/ck", data, dir + "/no-tokenizer", 7); })
                .find("the tokenizer " + dir + "/no-tokenizer it was trained with is missing"),
            std::string::npos);

  // The server's flags: a reach store with --tokenizer-model, a scripted policy with one, a groot on a LeRobot
  // dataset.
  auto s = run_command({bin("loongforge-serve-policy"), "--policy", "pi05", "--load", dir + "/ck", "--data-path",
                        store(), "--tokenizer-model", lerobot_oracle() + "/tokenizer"});
  EXPECT_EQ(s.exit_code, 1);
  EXPECT_NE(s.output.find("--tokenizer-model is for a pi05 policy trained on a LeRobot dataset"), std::string::npos)
      << s.output;
  s = run_command({bin("loongforge-serve-policy"), "--policy", "expert", "--tokenizer-model", lerobot_oracle() + "/tokenizer"});
  EXPECT_EQ(s.exit_code, 1);
  EXPECT_NE(s.output.find("the expert policy is scripted and reads no tokenizer"), std::string::npos) << s.output;
  s = run_command({bin("loongforge-serve-policy"), "--policy", "groot", "--load", dir + "/ck", "--data-path", data});
  EXPECT_EQ(s.exit_code, 1);
  EXPECT_NE(s.output.find("is a LeRobot dataset; groot policies train and run on reach demo stores"), std::string::npos)
      << s.output;
  // Served (--seed 7): OpenPI's client sends cameras as LIBERO does; the chunk is the one the
  // policy gives in process for the same observation (its first call with seed 7).
  const std::string python = lf::testing::openpi_client_python();
  if (!fs::exists(python)) GTEST_SKIP() << "no " << python << " (tools/install-deps makes it)";
  const std::string log = dir + "/serve.log";
  const auto served = lf::testing::serve_policy("--policy pi05 --load " + dir + "/ck --data-path " + data +
                                                " --tokenizer-model " + lerobot_oracle() + "/tokenizer --seed 7", log);
  ASSERT_FALSE(served.uri.empty()) << lf::testing::read_file(log);
  {
    const std::string port = served.uri.substr(served.uri.rfind(':') + 1);
    auto r = run_command({python, lf::testing::source_dir() + "/tests/vla/openpi_client_check.py", "127.0.0.1", port,
                          "pi05_lerobot", std::to_string(c.chunk_size)},
                         {}, std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.output << lf::testing::read_file(log);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, std::regex("ACTIONS ([^\n]*)"))) << r.output;
    std::istringstream values(m[1].str());
    std::vector<float> served_actions;
    for (double v; values >> v;) served_actions.push_back(static_cast<float>(v));
    EXPECT_NE(r.output.find("pi05 policy: no image for the dataset's camera observation.images.wrist; the observation "
                            "has: observation/front, observation/state"),
              std::string::npos)
        << r.output;
    lf::vla::Observation pattern;
    for (int64_t k = 0; k < 2; ++k) {
      auto y = at::arange(24).view({24, 1, 1}), x = at::arange(40).view({1, 40, 1}), ch = at::arange(3).view({1, 1, 3});
      pattern.arrays[k == 0 ? "observation/front" : "observation/wrist"] =
          ((7 * y + 3 * x + 11 * ch + 5 * k) % 256).to(at::kByte);
    }
    pattern.arrays["observation/state"] = (at::arange(3, at::kFloat) - 1.0) * 0.25;
    pattern.prompt = "pick up the cube";
    lf::vla::Pi05LeRobotPolicy fresh(dir + "/ck", data, "", 7);
    const auto want = fresh.infer(pattern).contiguous();
    ASSERT_EQ(static_cast<int64_t>(served_actions.size()), want.numel()) << r.output;
    const auto got = at::tensor(served_actions).view(want.sizes());
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-6) << got << want;
  }
  served.stop();

}

}  // namespace

// A pi05 policy's training inputs from a LeRobot dataset (vla/lerobot_inputs.h) against LeRobot 0.6
// itself (tests/vla/pi05_lerobot_inputs_oracle.py, .venv-lerobot): a v3.0 dataset lerobot recorded
// (two AV1 cameras of 32x48), through LeRobot's pi05 preprocessor (dataset stats, a PaliGemma-style
// tokenizer, tokenizer_max_length 48) and PI05Policy's own image / action preparation. Every frame:
// images (resize_with_pad to 32x32, [-1, 1]), prompt tokens and masks, and normalised action
// chunks. Frames decode identically (the reader's test), the bilinear resize is ATen's kernel on
// both sides and the normalisation the same float32 arithmetic, so all four compare within 1e-6.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "../models/cached_oracle.h"
#include "../support/error_message.h"
#include "../support/multiprocess.h"
#include "../support/oracle_cache.h"
#include "loongforge/core/error.h"
#include "loongforge/vla/lerobot_inputs.h"

namespace {

std::string oracle_dir() {
  static const std::string d = lf::testing::cached_oracle(
      lf::testing::source_dir() + "/tests/vla/pi05_lerobot_inputs_oracle.py", "pi05_lerobot_inputs", "done",
      lf::testing::lerobot_python());
  return d;
}

lf::vla::Pi05LeRobotOptions options(const std::string& o) {
  lf::vla::Pi05LeRobotOptions opt;
  opt.tokenizer = o + "/tokenizer";
  opt.image_size = 32;
  opt.chunk = 4;
  opt.action_dim = 2;
  opt.max_action_dim = 6;
  opt.prompt_length = 48;
  return opt;
}

TEST(LeRobotPi05Inputs, EveryFrameEqualsLeRobotsPreprocessor) {
  const std::string o = oracle_dir();
  if (o.empty()) GTEST_SKIP() << "LeRobot oracle unavailable (.venv-lerobot missing)";
  lf::vla::Pi05LeRobotInputs inputs(o + "/v30", options(o));
  auto want = lf::testing::read_safetensors(o + "/expected.safetensors");
  ASSERT_EQ(inputs.size(), want.at("tokens").size(0));
  EXPECT_EQ(inputs.cameras(), (std::vector<std::string>{"observation.images.front", "observation.images.wrist"}));
  std::vector<int64_t> all(static_cast<size_t>(inputs.size()));
  for (int64_t i = 0; i < inputs.size(); ++i) all[static_cast<size_t>(i)] = i;
  const auto batch = inputs.batch(all);
  ASSERT_EQ(batch.at("images").sizes(), want.at("images").sizes());
  EXPECT_LE((batch.at("images") - want.at("images")).abs().max().item<double>(), 1e-6);
  EXPECT_TRUE(at::equal(batch.at("prompt_tokens"), want.at("tokens"))) << batch.at("prompt_tokens")[4] << "\n"
                                                                       << want.at("tokens")[4];
  EXPECT_TRUE(at::equal(batch.at("prompt_masks"), want.at("masks").to(at::kBool)));
  ASSERT_EQ(batch.at("actions").sizes(), want.at("actions").sizes());
  EXPECT_LE((batch.at("actions") - want.at("actions")).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(batch.at("image_masks").sizes(), (std::vector<int64_t>{inputs.size(), 2}));
  // The prompts as LeRobot built them (decoded from its tokens, <bos> first).
  std::ifstream in(o + "/prompts.json");
  const auto prompts = nlohmann::json::parse(in);
  for (int64_t i : {0, 4, 5, 27}) EXPECT_EQ("<bos>" + inputs.prompt(i), prompts.at(i).get<std::string>()) << i;
  // A short prompt length truncates (the mask all true), as the tokenizer's truncation does.
  auto short_opt = options(o);
  short_opt.prompt_length = 5;
  const auto cut = lf::vla::Pi05LeRobotInputs(o + "/v30", short_opt).batch({4});
  EXPECT_TRUE(at::equal(cut.at("prompt_tokens")[0], want.at("tokens")[4].narrow(0, 0, 5)));
  EXPECT_TRUE(cut.at("prompt_masks").all().item<bool>());
}

TEST(LeRobotPi05Inputs, MistakesAreNamed) {
  const std::string o = oracle_dir();
  if (o.empty()) GTEST_SKIP() << "LeRobot oracle unavailable (.venv-lerobot missing)";
  auto opt = options(o);
  opt.action_dim = 3;
  auto e = lf::testing::error_message([&] { lf::vla::Pi05LeRobotInputs(o + "/v30", opt); });
  EXPECT_NE(e.find("its actions have 2 dims; the model's action_dim is 3"), std::string::npos) << e;
  EXPECT_NE(e.find("set model.action_dim 2"), std::string::npos) << e;
  opt = options(o);
  opt.vocab_size = 100;
  e = lf::testing::error_message([&] { lf::vla::Pi05LeRobotInputs(o + "/v30", opt); });
  EXPECT_NE(e.find("the model's vocabulary has 100"), std::string::npos) << e;
  opt = options(o);
  opt.prompt_length = 0;  // below the template's <bos>
  e = lf::testing::error_message([&] { lf::vla::Pi05LeRobotInputs(o + "/v30", opt); });
  EXPECT_NE(e.find("the prompt length (model.tokenizer_max_length) 0 must be at least 1 and hold the 1 special"),
            std::string::npos)
      << e;
  // A tokenizer directory without tokenizer_config.json (no pad token).
  const std::string bare = lf::testing::make_temp_dir("pi05-lerobot-tokenizer");
  std::filesystem::copy_file(o + "/tokenizer/tokenizer.json", bare + "/tokenizer.json");
  opt = options(o);
  opt.tokenizer = bare;
  e = lf::testing::error_message([&] { lf::vla::Pi05LeRobotInputs(o + "/v30", opt); });
  EXPECT_NE(e.find(bare + "/tokenizer_config.json is missing"), std::string::npos) << e;
}

TEST(LeRobotPi05Inputs, ResizeWithPadKeepsTheAspectAndCentres) {
  // 2 x 4 of ones into 4 x 4: resized to 2 x 4, one zero row above and below.
  auto out = lf::vla::resize_with_pad(at::ones({3, 2, 4}), 4, 4);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{3, 4, 4}));
  EXPECT_EQ(out.sum().item<double>(), 3 * 8);
  EXPECT_EQ(out[0][0].sum().item<double>(), 0);
  EXPECT_EQ(out[0][1].sum().item<double>(), 4);
  EXPECT_EQ(out[0][3].sum().item<double>(), 0);
}

}  // namespace

// The state's bins as LeRobot's np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1 gives them
// (numpy's values for these fp32 inputs): both infinities, NaN, the edges and either side of them,
// values whose x + 1 rounds.
TEST(LeRobotPi05Inputs, StateBinsAreNumpysDigitize) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {-inf, -1.5f, -1.0f, -1.0f + 1.0f / 128 - 1e-7f, -1.0f + 1.0f / 128, 0.0f, 1e-30f,
                                -1e-30f, 0.5f, 1.0f - 1.0f / 128, 1.0f - 1e-7f, 1.0f, 3.0f, inf,
                                std::numeric_limits<float>::quiet_NaN()};
  EXPECT_EQ(lf::vla::state_bins(at::tensor(x)), "-1 -1 0 0 1 128 128 127 192 255 255 255 255 255 255");
}

// The `groot` composite against LeRobot 0.6's GR00T N1.7 (lerobot.policies.groot.groot_n1_7,
// tests/models/groot_oracle.py run in the LeRobot venv; Python as an oracle only): tiny random
// models as GR00TN17.save_pretrained writes them (a tiny Qwen3-VL backbone config beside them)
// give GR00TN17.forward's loss and per-element loss and GR00TN17.get_action's Euler-sampled actions
// on a fixed batch with fixed noise and time within 1e-4 fp32 (max abs), for AlternateVLDiT with
// a VL self-attention layer and for the plain DiT. Malformed inputs and directories are errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "error_message.h"
#include "cached_oracle.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/media/qwen_vision_input.h"
#include "loongforge/models/composites/groot.h"
#include "loongforge/models/groot_lerobot.h"

namespace {
namespace fs = std::filesystem;
namespace lr = lf::models::lerobot;
using lf::models::Groot;
using lf::models::GrootInputs;

// fp32, the same ops in another order (the backbone's attention, the DiT's SDPA, bmm per embodiment).
constexpr double kTolerance = 1e-4;

std::string oracle_dir() {
  static const std::string dir = lf::testing::cached_oracle(lf::testing::source_dir() + "/tests/models/groot_oracle.py",
                                                            "groot_oracle", "done", lf::testing::lerobot_python());
  return dir;
}

#define REQUIRE_ORACLE()                                                                  \
  if (oracle_dir().empty()) GTEST_SKIP() << "no LeRobot environment (.venv-lerobot)"; \
  ASSERT_TRUE(fs::exists(oracle_dir() + "/done"))

std::unique_ptr<Groot> load(const std::string& dir, uint64_t seed = 7) {
  // The case's model_name points at the oracle's own (temporary) directory: pass the backbone.
  const auto s = lr::read_groot_setup(dir + "/model", dir + "/backbone");
  auto m = std::make_unique<Groot>(s.backbone, s.config, lf::backend::cpu_backend(), seed, at::kFloat, nullptr);
  m->load_full(lr::read_groot_weights(dir + "/model", at::kFloat), dir + "/model");
  m->set_training(false);
  return m;
}

GrootInputs inputs(const std::map<std::string, at::Tensor>& t) {
  return {t.at("input_ids"), t.at("attention_mask"), t.at("pixel_values"), t.at("image_grid_thw"), t.at("state"),
          t.at("embodiment_id")};
}


TEST(Groot, LossAndSampledActionsMatchLeRobot) {
  REQUIRE_ORACLE();
  for (const char* name : {"alternate", "plain"}) {
    const std::string dir = oracle_dir() + "/" + name;
    auto m = load(dir);
    auto in = lf::testing::read_safetensors(dir + "/inputs.safetensors");
    auto want = lf::testing::read_safetensors(dir + "/expected.safetensors");
    at::NoGradGuard no_grad;
    auto l = m->losses(inputs(in), in.at("action"), in.at("action_mask"), in.at("noise"), in.at("time"));
    ASSERT_EQ(l.sizes(), want.at("action_loss").sizes()) << name;
    const double loss = (l.sum() / (in.at("action_mask").sum() + 1e-6)).item<double>();
    auto actions = m->sample_actions(inputs(in), in.at("sample_noise"));
    ASSERT_EQ(actions.sizes(), want.at("actions").sizes()) << name;
    const double dl = (l - want.at("action_loss")).abs().max().item<double>();
    const double da = (actions - want.at("actions")).abs().max().item<double>();
    std::printf("[groot parity] %s: loss %.6f vs %.6f, max |action_loss - LeRobot| = %.3g, max |actions - LeRobot| = "
                "%.3g\n",
                name, loss, want.at("loss").item<double>(), dl, da);
    EXPECT_GT(want.at("actions").abs().max().item<double>(), 0.1) << name;
    EXPECT_LE(dl, kTolerance) << name;
    EXPECT_LE(da, kTolerance) << name;
    EXPECT_NEAR(loss, want.at("loss").item<double>(), kTolerance) << name;
  }
}

// Sampling never drops (GR00T samples in eval mode): a model left in training mode samples what
// it does in eval mode; its training loss does drop (it differs from the eval-mode loss).
TEST(Groot, SamplingRunsWithoutDropout) {
  REQUIRE_ORACLE();
  const std::string dir = oracle_dir() + "/alternate";
  auto m = load(dir);
  auto in = lf::testing::read_safetensors(dir + "/inputs.safetensors");
  at::NoGradGuard no_grad;
  auto eval_actions = m->sample_actions(inputs(in), in.at("sample_noise"));
  auto eval_loss = m->losses(inputs(in), in.at("action"), in.at("action_mask"), in.at("noise"), in.at("time"));
  m->set_training(true);
  EXPECT_TRUE(at::equal(m->sample_actions(inputs(in), in.at("sample_noise")), eval_actions));
  auto train_loss = m->losses(inputs(in), in.at("action"), in.at("action_mask"), in.at("noise"), in.at("time"));
  EXPECT_GT((train_loss - eval_loss).abs().max().item<double>(), 1e-4);
}

// A VLA store's sample as GR00T's inputs: the [-1, 1] image as the Qwen3-VL processor's rows of
// its uint8 image (mean = std = 0.5), one placeholder per merged patch before the prompt, the state
// zero-padded, embodiment 0; a prompt id at a placeholder id is an error.
TEST(Groot, VlaStoreSamplesBecomeGrootInputs) {
  REQUIRE_ORACLE();
  auto m = load(oracle_dir() + "/alternate");
  const auto& c = m->config();
  const auto& v = m->backbone().vision_encoder().config();
  auto u8 = at::randint(0, 256, {1, 1, 3, c.image_size, c.image_size}, at::kByte);
  auto in = m->vla_inputs(u8.to(at::kFloat) / 127.5 - 1.0, at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong).view({1, 3}),
                          at::tensor(std::vector<float>{0.25f, 0.75f}, at::kFloat).view({1, 1, 2}));
  lf::media::QwenVisionPreprocess pre;
  pre.patch_size = v.patch_size;
  pre.temporal_patch_size = v.temporal_patch_size;
  pre.merge_size = v.spatial_merge_size;
  pre.image_mean = {0.5, 0.5, 0.5};
  pre.image_std = {0.5, 0.5, 0.5};
  lf::media::Image img;
  img.height = img.width = c.image_size;
  auto hwc = u8[0][0].permute({1, 2, 0}).contiguous();
  img.rgb.assign(hwc.data_ptr<uint8_t>(), hwc.data_ptr<uint8_t>() + hwc.numel());
  auto want = lf::media::qwen_patches_of_resized({&img}, pre);
  ASSERT_EQ(in.pixel_values.sizes(), want.pixel_values.sizes());
  EXPECT_LE((in.pixel_values - want.pixel_values).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(in.image_grid_thw[0][1].item<int64_t>(), want.grid[1]);
  const int64_t n = lf::media::qwen_placeholder_count(want.grid, pre.merge_size);
  ASSERT_EQ(in.input_ids.sizes(), (std::vector<int64_t>{1, n + 3}));
  EXPECT_TRUE(in.input_ids[0].narrow(0, 0, n).eq(50).all().item<bool>());  // the oracle's image_token_id
  EXPECT_TRUE(at::equal(in.input_ids[0].narrow(0, n, 3), at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong)));
  ASSERT_EQ(in.state.sizes(), (std::vector<int64_t>{1, 1, c.max_state_dim}));
  EXPECT_FLOAT_EQ(in.state[0][0][1].item<float>(), 0.75f);
  EXPECT_EQ(in.state.narrow(2, 2, c.max_state_dim - 2).abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(in.embodiment_id.item<int64_t>(), 0);
  EXPECT_NE(lf::testing::error_message([&] {
              m->vla_inputs(u8.to(at::kFloat) / 127.5 - 1.0, at::tensor(std::vector<int64_t>{1, 50}, at::kLong).view({1, 2}),
                            at::zeros({1, 1, 2}));
            }).find("image_token_id"),
            std::string::npos);
}

TEST(Groot, TheEmbodimentSelectsItsOwnWeights) {
  REQUIRE_ORACLE();
  const std::string dir = oracle_dir() + "/alternate";
  auto m = load(dir);
  auto in = lf::testing::read_safetensors(dir + "/inputs.safetensors");
  at::NoGradGuard no_grad;
  auto a = m->sample_actions(inputs(in), in.at("sample_noise"));
  auto other = inputs(in);
  other.embodiment_id = (other.embodiment_id + 1) % m->config().max_num_embodiments;
  auto b = m->sample_actions(other, in.at("sample_noise"));
  EXPECT_GT((a - b).abs().max().item<double>(), 1e-3);
}

TEST(Groot, InputMistakesAreErrors) {
  REQUIRE_ORACLE();
  const std::string dir = oracle_dir() + "/alternate";
  auto m = load(dir);
  auto in = lf::testing::read_safetensors(dir + "/inputs.safetensors");
  auto padded = inputs(in);
  padded.attention_mask = padded.attention_mask.clone();
  padded.attention_mask.index_put_({0, -1}, 0);
  EXPECT_NE(lf::testing::error_message([&] { m->sample_actions(padded, in.at("sample_noise")); }).find("padded prompts"),
            std::string::npos);
  auto far = inputs(in);
  far.embodiment_id = at::full_like(far.embodiment_id, 99);
  EXPECT_NE(lf::testing::error_message([&] { m->sample_actions(far, in.at("sample_noise")); }).find("embodiment_id"), std::string::npos);
  auto short_chunk = inputs(in);
  EXPECT_NE(lf::testing::error_message([&] {
              m->losses(short_chunk, in.at("action").narrow(1, 0, 2), in.at("action_mask"), in.at("noise"),
                        in.at("time"));
            }).find("actions must be"),
            std::string::npos);
}

TEST(Groot, DirectoryMistakesNameTheFileAndKey) {
  REQUIRE_ORACLE();
  const std::string dir = oracle_dir() + "/alternate";
  const fs::path tmp = fs::temp_directory_path() / ("lf_groot_bad_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  std::ifstream src(dir + "/model/config.json");
  std::string text((std::istreambuf_iterator<char>(src)), {});
  // A model_name that is neither a directory nor the known backbone.
  {
    std::ofstream(tmp / "config.json") << text;
    auto e = lf::testing::error_message([&] { lr::read_groot_setup(tmp.string()); });
    EXPECT_NE(e.find("model_name"), std::string::npos) << e;
  }
  // A DiT whose output the decoder cannot read.
  {
    auto pos = text.find("\"output_dim\": 24");
    ASSERT_NE(pos, std::string::npos);
    std::string bad = text;
    bad.replace(pos, 16, "\"output_dim\": 22");
    std::ofstream(tmp / "config.json") << bad;
    auto e = lf::testing::error_message([&] { lr::read_groot_setup(tmp.string(), dir + "/backbone"); });
    EXPECT_NE(e.find("dit_output_dim"), std::string::npos) << e;
  }
  // A missing tensor.
  {
    const auto s = lr::read_groot_setup(dir + "/model", dir + "/backbone");
    Groot m(s.backbone, s.config, lf::backend::cpu_backend(), 1, at::kFloat, nullptr);
    auto w = lr::read_groot_weights(dir + "/model", at::kFloat);
    w.erase("action_head.action_decoder.layer2.W");
    auto e = lf::testing::error_message([&] { m.load_full(w, "the directory"); });
    EXPECT_NE(e.find("action_head.action_decoder.layer2.W"), std::string::npos) << e;
  }
  fs::remove_all(tmp);
}

}  // namespace

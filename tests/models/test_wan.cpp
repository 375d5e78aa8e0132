// The `wan` foundation and the `flow_matching` composite against diffusers (tests/models/
// wan_oracle.py, Python as an oracle only): tiny random WanTransformer3DModel checkpoints as
// save_pretrained writes them load by name (models/wan_diffusers.h) and give diffusers' fp32
// prediction within 1e-4 (max abs): text-to-video, image-to-video (image cross-attention) and per-
// token timesteps (Wan 2.2 TI2V), at TP 1 and TP 2. One flow-matching training step's per-sample
// losses equal the Python reference (DiffSynth's recipe) given the same noise and timestep indices,
// with and without first-frame conditioning (relative 1e-5). The sigma schedule and the timestep
// boundaries; malformed directories are errors naming the file and tensor.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../parallel/tp_testing.h"
#include "cached_oracle.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/composites/flow_matching.h"
#include "loongforge/models/wan_diffusers.h"
#include "multiprocess.h"
#include "recording_sink.h"

namespace {
namespace fs = std::filesystem;
using lf::models::FlowMatching;
using lf::models::FlowMatchingConfig;
using lf::models::WanInputs;
namespace df = lf::models::diffusers;

constexpr double kTolerance = 1e-4;  // fp32, the same ops in another order (diffusers' conv vs our matmul)

std::string oracle_dir() {
  static const std::string dir =
      lf::testing::cached_oracle(lf::testing::source_dir() + "/tests/models/wan_oracle.py", "wan_oracle", "done");
  return dir;
}

#define REQUIRE_ORACLE()                                                    \
  if (oracle_dir().empty()) GTEST_SKIP() << "no Python environment (.venv)"; \
  ASSERT_TRUE(fs::exists(oracle_dir() + "/done"))

std::unique_ptr<FlowMatching> load(const std::string& dir, const lf::dist::ParallelContext* ctx = nullptr,
                                   FlowMatchingConfig own = {}) {
  auto c = df::read_wan_config(dir);
  auto m = std::make_unique<FlowMatching>(c, own, lf::backend::cpu_backend(), 7, at::kFloat, ctx);
  df::load_into(m->parameters(), df::read_wan_weights(dir, at::kFloat), dir);
  return m;
}

double prediction_difference(const FlowMatching& m, const std::string& dir) {
  auto io = lf::testing::read_safetensors(dir + "/io.safetensors");
  WanInputs in;
  in.latents = io.at("hidden_states");
  in.timestep = io.at("timestep");
  in.text = io.at("encoder_hidden_states");
  if (io.count("encoder_hidden_states_image")) in.image = io.at("encoder_hidden_states_image");
  at::NoGradGuard no_grad;
  auto pred = m.dit().forward(in);
  EXPECT_EQ(pred.sizes(), io.at("prediction").sizes());
  return (pred - io.at("prediction")).abs().max().item<double>();
}

TEST(Wan, PredictionMatchesDiffusers) {
  REQUIRE_ORACLE();
  for (const char* name : {"t2v", "i2v", "ti2v"}) {
    auto m = load(oracle_dir() + "/" + name);
    const double diff = prediction_difference(*m, oracle_dir() + "/" + name);
    std::printf("[wan parity] %s TP=1: max |prediction - diffusers| = %.3g\n", name, diff);
    EXPECT_LE(diff, kTolerance) << name;
  }
}

LF_WORKER_CASE(wan_parity_tp2) {
  const std::string dir = lf::testing::worker_args().at(0);
  auto ctx = lf::testing::make_context(2);
  for (const char* name : {"t2v", "i2v", "ti2v"}) {
    auto m = load(dir + "/" + name, ctx.get());
    // Each rank holds half of every attention's heads and of the MLP's columns.
    for (const auto& p : m->parameters())
      if (p.name == "blocks.0.attn1.to_q.weight") EXPECT_EQ(p.tensor.size(0), 48 / 2);
    const double diff = prediction_difference(*m, dir + "/" + name);
    std::printf("[wan parity] %s TP=2 rank %d: max |prediction - diffusers| = %.3g\n", name, lf::testing::worker_rank(),
                diff);
    EXPECT_LE(diff, kTolerance) << name;
  }
}

TEST(Wan, PredictionMatchesDiffusersAtTp2) {
  REQUIRE_ORACLE();
  auto results = lf::testing::run_workers("wan_parity_tp2", {.world_size = 2, .args = {oracle_dir()}});
  lf::testing::expect_all_ok(results);
}

// One training step's per-sample losses (the trainer sums them and divides by the samples).
void expect_loss_matches(const std::string& dir, const std::string& file, bool first_frame) {
  FlowMatchingConfig own;
  own.first_frame_conditioning = first_frame;
  auto m = load(dir, nullptr, own);
  auto r = lf::testing::read_safetensors(dir + "/" + file);
  WanInputs clean;
  clean.latents = r.at("latents");
  clean.text = r.at("encoder_hidden_states");
  at::NoGradGuard no_grad;
  auto losses = m->sample_losses(clean, r.at("noise"), r.at("ids"));
  const auto& want = r.at("losses");
  const double rel = ((losses - want).abs() / want.abs()).max().item<double>();
  std::printf("[wan loss] %s: ours (%.7g, %.7g), Python (%.7g, %.7g), max relative difference %.3g\n", file.c_str(),
              losses[0].item<double>(), losses[1].item<double>(), want[0].item<double>(), want[1].item<double>(), rel);
  EXPECT_LE(rel, 1e-5) << losses << "\n" << want;
}

// Gradient-accumulation fusion's wiring in the DiT: with the trainer's gradient sink (here a
// recording one) every 2-D weight (attention, FFN, timestep / text embedders, proj_out) writes its
// gradient into its slot and autograd gets none; the norms, the modulation tables and the patch
// embedding (used through a reshape, not the parameter itself) keep autograd's path. Slots plus
// .grad equal the step without a sink (1e-5 relative).
TEST(Wan, GradientSinkTakesTheLinearWeightGradients) {
  lf::models::WanConfig c;
  c.num_attention_heads = 2;
  c.attention_head_dim = 8;
  c.in_channels = 4;
  c.text_dim = 16;
  c.freq_dim = 16;
  c.ffn_dim = 32;
  c.num_layers = 2;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  WanInputs in;
  in.latents = at::randn({2, 4, 2, 4, 4}, gen);
  in.timestep = at::tensor(std::vector<float>{3.0f, 700.0f});
  in.text = at::randn({2, 5, 16}, gen);
  const auto step = [&](const FlowMatching& m) {
    const auto pred = m.dit().forward(in);
    (pred * at::linspace(-1, 1, pred.numel()).view(pred.sizes())).sum().backward();
  };
  FlowMatching ref(c, {}, lf::backend::cpu_backend(), 7, at::kFloat, nullptr);
  step(ref);
  FlowMatching m(c, {}, lf::backend::cpu_backend(), 7, at::kFloat, nullptr);
  lf::testing::RecordingSink sink;
  const auto linear = [](const lf::models::Parameter& p) {
    return p.tensor.dim() == 2 && p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, ".weight") == 0;
  };
  int linears = 0;
  for (const auto& p : m.parameters())
    if (linear(p)) {
      sink.slots[p.tensor.unsafeGetTensorImpl()] = at::zeros_like(p.tensor);
      ++linears;
    }
  EXPECT_GE(linears, 2 * 10);  // per block: q, k, v, out of two attentions, ffn in and out
  sink.run(m, [&] { step(m); });
  for (size_t i = 0; i < m.parameters().size(); ++i) {
    const auto& p = m.parameters()[i];
    if (linear(p)) {
      EXPECT_EQ(sink.asked[p.tensor.unsafeGetTensorImpl()], 1) << p.name;
      EXPECT_FALSE(p.tensor.grad().defined()) << p.name;
    }
    const auto& want = ref.parameters()[i].tensor.grad();
    ASSERT_TRUE(want.defined()) << p.name;
    EXPECT_LE(lf::testing::relative_max_difference(sink.total_grad(p.tensor), want), 1e-5) << p.name;
  }
}

TEST(FlowMatching, StepLossEqualsPythonReference) {
  REQUIRE_ORACLE();
  expect_loss_matches(oracle_dir() + "/t2v", "loss.safetensors", false);
  expect_loss_matches(oracle_dir() + "/ti2v", "loss_first_frame.safetensors", true);
}

TEST(FlowMatching, ScheduleIsWansShiftedSigmasWithItsWeighting) {
  FlowMatchingConfig c;
  lf::models::FlowMatchingSchedule s(c);
  ASSERT_EQ(s.sigmas.size(), 1000u);
  EXPECT_DOUBLE_EQ(s.sigmas[0], 1.0);
  EXPECT_NEAR(s.sigmas[500], 5 * 0.5 / (1 + 4 * 0.5), 1e-6);  // shift 5 at s = 0.5
  EXPECT_NEAR(s.timesteps[500], 1000 * s.sigmas[500], 1e-3);
  double mean = 0;
  for (double w : s.weights) mean += w / 1000.0;
  EXPECT_NEAR(mean, 1.0, 1e-5);  // normalised to mean 1
  EXPECT_EQ(s.first_id, 0);
  EXPECT_EQ(s.end_id, 1000);
  // Wan 2.2 A14B's experts: the high-noise one trains indices [0, 358), the low-noise one the rest.
  c.max_timestep_boundary = 0.358;
  lf::models::FlowMatchingSchedule high(c);
  EXPECT_EQ(high.end_id, 358);
  c.max_timestep_boundary = 1.0;
  c.min_timestep_boundary = 0.358;
  lf::models::FlowMatchingSchedule low(c);
  EXPECT_EQ(low.first_id, 358);
  EXPECT_GT(high.timesteps[357], low.timesteps[358]);
  c.loss_weighting = "none";
  lf::models::FlowMatchingSchedule flat(c);
  EXPECT_EQ(flat.weights[10], 1.0);
}

TEST(Wan, MalformedDirectoriesAreErrors) {
  REQUIRE_ORACLE();
  const std::string src = oracle_dir() + "/t2v";
  const std::string bad = lf::testing::make_temp_dir("wan-bad");
  auto expect_error = [&](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
    } catch (const lf::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Not a Wan transformer.
  fs::create_directories(bad + "/other");
  std::ofstream(bad + "/other/config.json") << R"({"_class_name": "UNet2DConditionModel"})";
  expect_error([&] { df::read_wan_config(bad + "/other"); }, "UNet2DConditionModel");
  EXPECT_FALSE(df::is_wan_dir(bad + "/other"));
  EXPECT_TRUE(df::is_wan_dir(src));
  // Weights of another size than config.json says.
  auto c = df::read_wan_config(src);
  c.ffn_dim = 64;
  FlowMatching m(c, {}, lf::backend::cpu_backend(), 7, at::kFloat, nullptr);
  expect_error([&] { df::load_into(m.parameters(), df::read_wan_weights(src), src); }, "blocks.0.ffn.net.0.proj.weight");
  // A missing tensor and an unknown one.
  auto w = df::read_wan_weights(src);
  auto c2 = df::read_wan_config(src);
  FlowMatching m2(c2, {}, lf::backend::cpu_backend(), 7, at::kFloat, nullptr);
  auto missing = w;
  missing.erase("proj_out.bias");
  expect_error([&] { df::load_into(m2.parameters(), missing, "dir"); }, "proj_out.bias");
  auto extra = w;
  extra["blocks.9.attn1.to_q.weight"] = at::zeros({1});
  expect_error([&] { df::load_into(m2.parameters(), extra, "dir"); }, "blocks.9.attn1.to_q.weight");
  // A config.json the model cannot be: image_dim without added_kv_proj_dim.
  fs::create_directories(bad + "/i2v");
  std::ifstream in(src + "/config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string null_image = "\"image_dim\": null";
  ASSERT_NE(text.find(null_image), std::string::npos) << text;
  text.replace(text.find(null_image), null_image.size(), "\"image_dim\": 8");
  std::ofstream(bad + "/i2v/config.json") << text;
  expect_error([&] { df::read_wan_config(bad + "/i2v"); }, "added_kv_proj_dim");
}

// Write and read back: the same tensors, config.json in diffusers' keys.
TEST(Wan, DiffusersDirectoryRoundTrip) {
  REQUIRE_ORACLE();
  const std::string src = oracle_dir() + "/i2v";
  auto c = df::read_wan_config(src);
  auto w = df::read_wan_weights(src, at::kFloat);
  std::vector<std::pair<std::string, at::Tensor>> full(w.begin(), w.end());
  const std::string out = lf::testing::make_temp_dir("wan-rt");
  df::write_wan(out, c, full, at::kFloat, /*max_shard_bytes=*/20000);  // several shards + index
  EXPECT_TRUE(fs::exists(out + "/diffusion_pytorch_model.safetensors.index.json"));
  auto back = df::read_wan_weights(out, at::kFloat);
  ASSERT_EQ(back.size(), w.size());
  for (const auto& [name, t] : w) EXPECT_TRUE(at::equal(back.at(name), t)) << name;
  auto c2 = df::read_wan_config(out);
  EXPECT_EQ(c2.image_dim, 20);
  EXPECT_EQ(c2.added_kv_proj_dim, 48);
  EXPECT_FALSE(c2.cross_attn_norm);
}

}  // namespace

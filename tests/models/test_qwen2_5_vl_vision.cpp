// The qwen2_5_vl_vision component against transformers (tests/models/vision_oracle.py, Python as an
// oracle only): a tiny random Qwen2_5_VisionTransformerPretrainedModel saved by transformers, its
// weights loaded by name (Qwen25VisionEncoder::load_hf_state), run on three images of different
// sizes from transformers' image processor and a 2x4x4 video grid in one call: our merged output
// equals transformers' fp32 output within 1e-4, at encoder TP 1 and TP 2, and so do the gradients
// (input and weights). Encoding each medium on its own gives the rows of encoding all at once.
// Malformed inputs and weights are lf::Errors; the fields load from YAML (these run without Python).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "../parallel/tp_testing.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/models/encoders/qwen2_5_vl_vision.h"
#include "loongforge/models/registry.h"
#include "cached_oracle.h"
#include "multiprocess.h"

namespace {
namespace fs = std::filesystem;
using lf::models::Qwen25VisionConfig;
using lf::models::Qwen25VisionEncoder;

std::string python() { return lf::testing::venv_python(); }
std::string oracle_script() { return lf::testing::source_dir() + "/tests/models/vision_oracle.py"; }

using lf::testing::read_text;

const std::string& oracle_dir() {
  static const std::string dir = lf::testing::cached_oracle(oracle_script(), "vision_oracle", "io.safetensors");
  return dir;
}

#define REQUIRE_ORACLE()                                                                   \
  if (oracle_dir().empty()) GTEST_SKIP() << "transformers is not installed in " << python(); \
  ASSERT_TRUE(fs::exists(oracle_dir() + "/io.safetensors"))

std::map<std::string, at::Tensor> read_all(const std::string& file) { return lf::testing::read_safetensors(file); }

// transformers' config.json fields -> ours (the same names).
Qwen25VisionConfig read_config(const std::string& file) {
  const auto j = nlohmann::json::parse(read_text(file));
  Qwen25VisionConfig c;
  c.depth = j.at("depth");
  c.hidden_size = j.at("hidden_size");
  c.intermediate_size = j.at("intermediate_size");
  c.num_heads = j.at("num_heads");
  c.in_channels = j.at("in_channels");
  c.patch_size = j.at("patch_size");
  c.spatial_merge_size = j.at("spatial_merge_size");
  c.temporal_patch_size = j.at("temporal_patch_size");
  c.window_size = j.at("window_size");
  c.fullatt_block_indexes = j.at("fullatt_block_indexes").get<std::vector<int64_t>>();
  c.out_hidden_size = j.at("out_hidden_size");
  c.hidden_act = j.at("hidden_act");
  return c;
}

std::unique_ptr<Qwen25VisionEncoder> make_encoder(const Qwen25VisionConfig& c, lf::parallel::TensorParallel tp = {}) {
  lf::models::ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(7), at::kFloat, c10::Device(c10::kCPU), tp);
  return std::make_unique<Qwen25VisionEncoder>(c, lf::backend::cpu_backend(), b, "image_encoder");
}

// The oracle's model with its weights loaded.
std::unique_ptr<Qwen25VisionEncoder> oracle_encoder(const std::string& dir, lf::parallel::TensorParallel tp = {}) {
  auto e = make_encoder(read_config(dir + "/config.json"), tp);
  e->load_hf_state(read_all(dir + "/weights.safetensors"));
  return e;
}

// max |ours - transformers'| on the oracle's inputs.
double oracle_difference(const Qwen25VisionEncoder& e, const std::string& dir) {
  auto io = read_all(dir + "/io.safetensors");
  at::NoGradGuard no_grad;
  auto got = e.forward(io.at("pixel_values"), io.at("grid_thw"));
  const auto& want = io.at("output");
  EXPECT_EQ(got.sizes(), want.sizes());
  EXPECT_GT(want.abs().max().item<double>(), 0.1);  // a real signal, not all zeros
  if (got.sizes() != want.sizes()) return 1e9;
  return lf::testing::max_abs_diff(got, want);
}

// fp32 end to end; the differences are the order of floating-point sums (fused RMSNorm, SDPA vs
// eager attention, the conv as one GEMM, TP partial sums): ~1e-6 on O(1) outputs. A wrong window
// order, RoPE axis, qkv layout or merge grouping is O(0.1).
constexpr double kTolerance = 1e-4;

TEST(Qwen25Vision, OutputMatchesTransformers) {
  REQUIRE_ORACLE();
  auto e = oracle_encoder(oracle_dir());
  const double diff = oracle_difference(*e, oracle_dir());
  std::printf("[vision parity] qwen2_5_vl_vision TP=1: max |output - transformers| = %.3g\n", diff);
  RecordProperty("tp1_max_abs_diff", std::to_string(diff));
  EXPECT_LE(diff, kTolerance);
}

// The backward: gradients of sum(output * probe) for the input and for weights at both ends of the
// tower (the patch embedding, block 0's norm and MLP, the merger) equal transformers' autograd.
TEST(Qwen25Vision, GradientsMatchTransformers) {
  REQUIRE_ORACLE();
  auto e = oracle_encoder(oracle_dir());
  auto io = read_all(oracle_dir() + "/io.safetensors");
  auto pixels = io.at("pixel_values").clone().requires_grad_(true);
  (e->forward(pixels, io.at("grid_thw")) * io.at("probe")).sum().backward();
  std::map<std::string, at::Tensor> got{{"grad_pixel_values", pixels.grad()}};
  for (const auto& p : e->parameters()) {
    if (p.name == "image_encoder.patch_embed.weight") got["grad_patch_embed"] = p.tensor.grad();
    if (p.name == "image_encoder.blocks.0.norm1.weight") got["grad_block0_norm1"] = p.tensor.grad();
    if (p.name == "image_encoder.blocks.0.mlp.linear_fc2.weight") got["grad_block0_down_proj"] = p.tensor.grad();
    if (p.name == "image_encoder.merger.mlp.linear_fc1.weight") got["grad_merger_fc1"] = p.tensor.grad();
  }
  ASSERT_EQ(got.size(), 5u);
  for (const auto& [name, g] : got) {
    const auto& want = io.at(name);
    ASSERT_TRUE(g.defined()) << name;
    ASSERT_EQ(g.sizes(), want.sizes()) << name;
    // Relative to the gradient's size (up to ~10 for the merger): fp32 sums in other orders.
    const double diff = lf::testing::max_abs_diff(g, want), scale = lf::testing::scale_of(want);
    std::printf("[vision parity] %s: max |ours - transformers| = %.3g (max |grad| %.3g)\n", name.c_str(), diff,
                want.abs().max().item<double>());
    EXPECT_LE(diff, kTolerance * scale) << name;
  }
}

LF_WORKER_CASE(vision_parity_tp2) {
  const std::string dir = lf::testing::worker_args().at(0);
  auto ctx = lf::testing::make_context(2);
  lf::parallel::TensorParallel tp;
  tp.tp = &ctx->tp();
  auto e = oracle_encoder(dir, tp);
  // Each rank holds half of every block's heads and MLP hidden width.
  EXPECT_EQ(e->parameters()[2].tensor.size(0), 3 * 64 / 2) << e->parameters()[2].name;
  const double diff = oracle_difference(*e, dir);
  std::printf("[vision parity] qwen2_5_vl_vision TP=2 rank %d: max |output - transformers| = %.3g\n",
              lf::testing::worker_rank(), diff);
  EXPECT_LE(diff, kTolerance);
}

TEST(Qwen25Vision, OutputMatchesTransformersAtTp2) {
  REQUIRE_ORACLE();
  auto results = lf::testing::run_workers("vision_parity_tp2", {.world_size = 2, .args = {oracle_dir()}});
  lf::testing::expect_all_ok(results);
  for (const auto& r : results)
    for (size_t at = r.output.find("[vision parity]"); at != std::string::npos; at = r.output.find("[vision parity]", at + 1))
      std::printf("%s\n", r.output.substr(at, r.output.find('\n', at) - at).c_str());
}

// The tiny config of the oracle, for the tests that need no Python.
Qwen25VisionConfig tiny_config() {
  Qwen25VisionConfig c;
  c.depth = 3;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_heads = 2;
  c.window_size = 56;
  c.fullatt_block_indexes = {1};
  c.out_hidden_size = 24;
  return c;
}

// Media of several sizes: images (1, 4, 6), (1, 8, 8), (1, 2, 14) and a video (2, 4, 4).
std::pair<at::Tensor, at::Tensor> tiny_inputs(const Qwen25VisionConfig& c) {
  auto grid = at::tensor({1, 4, 6, 1, 8, 8, 1, 2, 14, 2, 4, 4}, at::kLong).view({4, 3});
  const int64_t n = (grid.select(1, 0) * grid.select(1, 1) * grid.select(1, 2)).sum().item<int64_t>();
  auto g = at::make_generator<at::CPUGeneratorImpl>(3);
  return {at::randn({n, c.patch_dim()}, g), grid};
}

// Attention never crosses a frame, and every medium's windows are its own: each medium encoded
// alone gives exactly its rows of the batched output.
TEST(Qwen25Vision, OutputDoesNotDependOnBatching) {
  const auto c = tiny_config();
  auto e = make_encoder(c);
  // Random norm weights and biases too (they start at ones / zeros).
  {
    at::NoGradGuard no_grad;
    auto g = at::make_generator<at::CPUGeneratorImpl>(5);
    for (const auto& p : e->parameters()) p.tensor.copy_(p.tensor + 0.1 * at::randn(p.tensor.sizes(), g));
  }
  auto [pixels, grid] = tiny_inputs(c);
  at::NoGradGuard no_grad;
  auto all = e->forward(pixels, grid);
  ASSERT_EQ(all.size(0), pixels.size(0) / 4);
  ASSERT_EQ(all.size(1), c.out_hidden_size);
  int64_t row = 0;
  double worst = 0;
  for (int64_t i = 0; i < grid.size(0); ++i) {
    const int64_t n = grid[i].prod().item<int64_t>();
    auto alone = e->forward(pixels.narrow(0, row, n), grid.narrow(0, i, 1));
    worst = std::max(worst, lf::testing::max_abs_diff(alone, all.narrow(0, row / 4, n / 4)));
    row += n;
  }
  std::printf("[vision batching] max |alone - batched| = %.3g\n", worst);
  EXPECT_LE(worst, 1e-5);
  // Reordering the media reorders the output rows and nothing else.
  auto swapped_grid = at::cat({grid.narrow(0, 3, 1), grid.narrow(0, 0, 3)}, 0);
  const int64_t video = 2 * 4 * 4;
  auto swapped = e->forward(at::cat({pixels.narrow(0, pixels.size(0) - video, video),
                                     pixels.narrow(0, 0, pixels.size(0) - video)}),
                            swapped_grid);
  EXPECT_LE(lf::testing::max_abs_diff(swapped.narrow(0, video / 4, all.size(0) - video / 4),
                                      all.narrow(0, 0, all.size(0) - video / 4)),
            1e-5);
}

TEST(Qwen25Vision, MalformedInputsAndWeightsAreErrors) {
  const auto c = tiny_config();
  auto e = make_encoder(c);
  auto [pixels, grid] = tiny_inputs(c);
  // pixel_values rows of the wrong width, too few rows, a grid side not a multiple of the merge.
  EXPECT_THROW(e->forward(pixels.narrow(1, 0, 100), grid), lf::Error);
  EXPECT_THROW(e->forward(pixels.narrow(0, 0, 10), grid), lf::Error);
  EXPECT_THROW(e->forward(pixels.narrow(0, 0, 15), at::tensor({1, 3, 5}, at::kLong).view({1, 3})), lf::Error);
  // Weights: one missing, one of the wrong shape, one stray block.
  std::map<std::string, at::Tensor> hf;
  const int64_t h = c.hidden_size, f = c.intermediate_size, m = 4 * h;
  hf["visual.patch_embed.proj.weight"] = at::zeros({h, 3, 2, 14, 14});
  for (int i = 0; i < c.depth; ++i) {
    const std::string p = "visual.blocks." + std::to_string(i) + ".";
    for (const char* n : {"norm1.weight", "norm2.weight", "attn.proj.bias", "mlp.down_proj.bias"}) hf[p + n] = at::ones({h});
    hf[p + "attn.qkv.weight"] = at::zeros({3 * h, h});
    hf[p + "attn.qkv.bias"] = at::zeros({3 * h});
    hf[p + "attn.proj.weight"] = at::zeros({h, h});
    for (const char* n : {"mlp.gate_proj", "mlp.up_proj"}) {
      hf[p + n + ".weight"] = at::zeros({f, h});
      hf[p + n + ".bias"] = at::zeros({f});
    }
    hf[p + "mlp.down_proj.weight"] = at::zeros({h, f});
  }
  hf["visual.merger.ln_q.weight"] = at::ones({h});
  hf["visual.merger.mlp.0.weight"] = at::zeros({m, m});
  hf["visual.merger.mlp.0.bias"] = at::zeros({m});
  hf["visual.merger.mlp.2.weight"] = at::zeros({c.out_hidden_size, m});
  hf["visual.merger.mlp.2.bias"] = at::zeros({c.out_hidden_size});
  EXPECT_NO_THROW(e->load_hf_state(hf));
  auto missing = hf;
  missing.erase("visual.blocks.1.attn.qkv.bias");
  EXPECT_THROW(e->load_hf_state(missing), lf::Error);
  auto wrong = hf;
  wrong["visual.merger.mlp.2.weight"] = at::zeros({c.out_hidden_size + 1, m});
  EXPECT_THROW(e->load_hf_state(wrong), lf::Error);
  auto stray = hf;
  stray["visual.blocks.3.norm1.weight"] = at::ones({h});
  EXPECT_THROW(e->load_hf_state(stray), lf::Error);
  // A config the tower cannot run: head_dim not a multiple of 4.
  auto bad = c;
  bad.num_heads = 16;  // head_dim 2
  EXPECT_THROW(make_encoder(bad), lf::Error);
}

TEST(Qwen25Vision, RegisteredAsVisionEncoder) {
  const auto* t = lf::models::Registry::builtin().component("qwen2_5_vl_vision");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->kind, "vision_encoder");
  // Its fields from YAML, with HF's names; defaults filled in; a wrong activation reported by key.
  auto load = [&](const std::string& text, lf::config::ErrorList& errors) {
    return t->load(lf::config::parse_yaml_string(text, {}), "model.image_encoder", errors);
  };
  lf::config::ErrorList errors;
  auto cfg = load("depth: 4\nhidden_size: 64\nintermediate_size: 96\nnum_heads: 4\nwindow_size: 56\n"
                  "fullatt_block_indexes: [1, 3]\nout_hidden_size: 48\n",
                  errors);
  ASSERT_TRUE(errors.empty()) << errors.issues().front().message;
  const auto& f = dynamic_cast<const lf::models::ComponentConfigOf<Qwen25VisionConfig>&>(*cfg).fields;
  EXPECT_EQ(f.fullatt_block_indexes, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(f.patch_size, 14);
  EXPECT_EQ(f.temporal_patch_size, 2);
  EXPECT_EQ(f.hidden_act, "silu");
  lf::config::ErrorList bad;
  load("depth: 4\nhidden_size: 64\nintermediate_size: 96\nnum_heads: 4\nhidden_act: gelu\n", bad);
  ASSERT_FALSE(bad.empty());
  EXPECT_EQ(bad.issues().front().key, "model.image_encoder.hidden_act");
  EXPECT_EQ(tiny_config().num_parameters(), [] {
    int64_t n = 0;
    for (const auto& p : make_encoder(tiny_config())->parameters()) n += p.tensor.numel();
    return n;
  }());
}

}  // namespace

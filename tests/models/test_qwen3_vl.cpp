// Qwen3-VL against transformers (tests/models/qwen3_vl_oracle.py, Python as an oracle only): a tiny
// random Qwen3VLForConditionalGeneration saved by transformers. The qwen3_vl_vision tower alone
// (two images and a 2-frame video in one call): its merged and DeepStack outputs and their
// gradients equal transformers' at encoder TP 1 and TP 2. The qwen3_vl composite (state dict loaded
// by name): interleaved M-RoPE position ids equal get_rope_index's, full-vocabulary logits equal
// transformers' on one device and at foundation TP 2, for a batch of images, a sample with an image
// and a video, and text only; pipeline stages split after the DeepStack layers give the whole
// model's loss. Errors (placeholders, configs, DeepStack across stages, injections) run without Python.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "../parallel/tp_testing.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/models/composites/qwen3_vl.h"
#include "loongforge/models/encoders/qwen3_vl_vision.h"
#include "loongforge/models/hf_adapter.h"
#include "loongforge/models/hf_vlm.h"
#include "loongforge/models/registry.h"
#include "cached_oracle.h"
#include "error_message.h"
#include "hf_test_helpers.h"
#include "multiprocess.h"

namespace {
namespace fs = std::filesystem;
using lf::models::Qwen3VisionConfig;
using lf::models::Qwen3VisionEncoder;
using lf::models::Qwen3Vl;
using lf::models::Qwen3VlConfig;

std::string oracle_script() { return lf::testing::source_dir() + "/tests/models/qwen3_vl_oracle.py"; }

const std::string& oracle_dir() {
  static const std::string dir = lf::testing::cached_oracle(oracle_script(), "qwen3_vl_oracle", "io.safetensors");
  return dir;
}

#define REQUIRE_ORACLE()                                                                                       \
  if (oracle_dir().empty()) GTEST_SKIP() << "transformers is not installed in " << lf::testing::venv_python(); \
  ASSERT_TRUE(fs::exists(oracle_dir() + "/io.safetensors"))

std::map<std::string, at::Tensor> read_all(const std::string& file) { return lf::testing::read_safetensors(file); }

struct Configs {
  lf::models::DecoderConfig text;
  Qwen3VisionConfig vision;
  Qwen3VlConfig own;
};

// The oracle's config.json (transformers' field names) -> ours.
Configs read_configs(const std::string& file) {
  const auto j = nlohmann::json::parse(lf::testing::read_text(file));
  Configs c;
  const auto& t = j.at("text");
  c.text.num_layers = t.at("num_hidden_layers");
  c.text.hidden_size = t.at("hidden_size");
  c.text.ffn_hidden_size = t.at("intermediate_size");
  c.text.num_attention_heads = t.at("num_attention_heads");
  c.text.num_query_groups = t.at("num_key_value_heads");
  c.text.kv_channels = t.at("head_dim");
  c.text.vocab_size = t.at("vocab_size");
  c.text.max_position_embeddings = t.at("max_position_embeddings");
  c.text.norm_epsilon = t.at("rms_norm_eps");
  const auto& rope = t.at("rope_parameters");
  c.text.rotary_base = rope.at("rope_theta");
  c.text.mrope_section = rope.at("mrope_section").get<std::vector<int64_t>>();
  c.text.mrope_interleaved = rope.at("mrope_interleaved");
  c.text.qk_layernorm = true;
  c.text.untie_embeddings_and_output_weights = true;
  const auto& v = j.at("vision");
  c.vision.depth = v.at("depth");
  c.vision.hidden_size = v.at("hidden_size");
  c.vision.intermediate_size = v.at("intermediate_size");
  c.vision.num_heads = v.at("num_heads");
  c.vision.in_channels = v.at("in_channels");
  c.vision.patch_size = v.at("patch_size");
  c.vision.spatial_merge_size = v.at("spatial_merge_size");
  c.vision.temporal_patch_size = v.at("temporal_patch_size");
  c.vision.out_hidden_size = v.at("out_hidden_size");
  c.vision.num_position_embeddings = v.at("num_position_embeddings");
  c.vision.deepstack_visual_indexes = v.at("deepstack_visual_indexes").get<std::vector<int64_t>>();
  c.vision.hidden_act = v.at("hidden_act");
  c.own.image_token_id = j.at("image_token_id");
  c.own.video_token_id = j.at("video_token_id");
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const lf::Error& e) {
    return e.what();
  }
  return "";
}

// fp32 end to end: the differences are the order of floating-point sums; a wrong interpolation tap,
// RoPE axis, interleaving or DeepStack position is O(0.1).
constexpr double kVisionTolerance = 1e-5;
constexpr double kTolerance = 1e-4;

// --- the vision tower -------------------------------------------------------------------------

std::unique_ptr<Qwen3VisionEncoder> oracle_encoder(const std::string& dir, lf::parallel::TensorParallel tp = {}) {
  const auto c = read_configs(dir + "/config.json").vision;
  lf::models::ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(7), at::kFloat, c10::Device(c10::kCPU), tp);
  auto e = std::make_unique<Qwen3VisionEncoder>(c, lf::backend::cpu_backend(), b, "vision_encoder");
  std::map<std::string, at::Tensor> visual;
  for (const auto& [name, t] : read_all(dir + "/weights.safetensors"))
    if (name.rfind("model.visual.", 0) == 0) visual.emplace(name, t);
  e->load_hf_state(visual);
  return e;
}

// max |ours - transformers'| over the merged and DeepStack outputs.
double vision_difference(const Qwen3VisionEncoder& e, const std::string& dir) {
  auto io = read_all(dir + "/io.safetensors");
  at::NoGradGuard no_grad;
  const auto got = e.forward(io.at("vision_pixel_values"), io.at("vision_grid"));
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs{{got.merged, io.at("vision_merged")}};
  EXPECT_EQ(got.deepstack.size(), 2u);
  for (size_t k = 0; k < got.deepstack.size(); ++k)
    pairs.push_back({got.deepstack[k], io.at("vision_deepstack_" + std::to_string(k))});
  double worst = 0;
  for (const auto& [ours, want] : pairs) {
    EXPECT_EQ(ours.sizes(), want.sizes());
    EXPECT_GT(want.abs().max().item<double>(), 0.1);  // a real signal
    if (ours.sizes() != want.sizes()) return 1e9;
    worst = std::max(worst, lf::testing::max_abs_diff(ours, want));
  }
  return worst;
}

TEST(Qwen3Vision, OutputMatchesTransformers) {
  REQUIRE_ORACLE();
  auto e = oracle_encoder(oracle_dir());
  // num_parameters() counts what transformers holds.
  int64_t hf = 0, ours = 0;
  for (const auto& [name, t] : read_all(oracle_dir() + "/weights.safetensors"))
    if (name.rfind("model.visual.", 0) == 0) hf += t.numel();
  for (const auto& p : e->parameters()) ours += p.tensor.numel();
  EXPECT_EQ(ours, hf);
  EXPECT_EQ(e->config().num_parameters(), hf);
  const double diff = vision_difference(*e, oracle_dir());
  std::printf("[qwen3_vl parity] vision TP=1: max |merged, deepstack - transformers| = %.3g\n", diff);
  RecordProperty("vision_tp1_max_abs_diff", std::to_string(diff));
  EXPECT_LE(diff, kVisionTolerance);
}

// The backward through the tower (the position table's interpolation included).
TEST(Qwen3Vision, GradientsMatchTransformers) {
  REQUIRE_ORACLE();
  auto e = oracle_encoder(oracle_dir());
  auto io = read_all(oracle_dir() + "/io.safetensors");
  auto pixels = io.at("vision_pixel_values").clone().requires_grad_(true);
  const auto out = e->forward(pixels, io.at("vision_grid"));
  auto loss = (out.merged * io.at("vision_probe_merged")).sum();
  for (size_t k = 0; k < out.deepstack.size(); ++k)
    loss = loss + (out.deepstack[k] * io.at("vision_probe_deepstack_" + std::to_string(k))).sum();
  loss.backward();
  std::map<std::string, at::Tensor> got{{"grad_pixel_values", pixels.grad()}};
  for (const auto& p : e->parameters()) {
    if (p.name == "vision_encoder.patch_embed.weight") got["grad_patch_embed"] = p.tensor.grad();
    if (p.name == "vision_encoder.pos_embed.weight") got["grad_pos_embed"] = p.tensor.grad();
    if (p.name == "vision_encoder.blocks.0.mlp.linear_fc1.weight") got["grad_block0_fc1"] = p.tensor.grad();
  }
  ASSERT_EQ(got.size(), 4u);
  for (const auto& [name, g] : got) {
    const auto& want = io.at(name);
    ASSERT_TRUE(g.defined()) << name;
    ASSERT_EQ(g.sizes(), want.sizes()) << name;
    const double diff = lf::testing::max_abs_diff(g, want), scale = lf::testing::scale_of(want);
    std::printf("[qwen3_vl parity] vision %s: max |ours - transformers| = %.3g (max |grad| %.3g)\n", name.c_str(),
                diff, want.abs().max().item<double>());
    EXPECT_LE(diff, kVisionTolerance * scale) << name;
  }
}

LF_WORKER_CASE(qwen3_vision_tp2) {
  const std::string dir = lf::testing::worker_args().at(0);
  auto ctx = lf::testing::make_context(2);
  lf::parallel::TensorParallel tp;
  tp.tp = &ctx->tp();
  auto e = oracle_encoder(dir, tp);
  for (const auto& p : e->parameters()) {
    if (p.name == "vision_encoder.blocks.0.attention.linear_qkv.weight") {
      EXPECT_EQ(p.tensor.size(0), 3 * 64 / 2);
    }
  }
  const double diff = vision_difference(*e, dir);
  std::printf("[qwen3_vl parity] vision TP=2 rank %d: max |merged, deepstack - transformers| = %.3g\n",
              lf::testing::worker_rank(), diff);
  EXPECT_LE(diff, kVisionTolerance);
}

void print_parity_lines(const std::vector<lf::testing::RankResult>& results) {
  for (const auto& r : results)
    for (size_t at = r.output.find("[qwen3_vl parity]"); at != std::string::npos;
         at = r.output.find("[qwen3_vl parity]", at + 1))
      std::printf("%s\n", r.output.substr(at, r.output.find('\n', at) - at).c_str());
}

TEST(Qwen3Vision, OutputMatchesTransformersAtTp2) {
  REQUIRE_ORACLE();
  auto results = lf::testing::run_workers("qwen3_vision_tp2", {.world_size = 2, .args = {oracle_dir()}});
  lf::testing::expect_all_ok(results);
  print_parity_lines(results);
}

Qwen3VisionConfig tiny_vision() {
  Qwen3VisionConfig c;
  c.depth = 2;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_heads = 2;
  c.num_position_embeddings = 16;
  c.deepstack_visual_indexes = {0};
  c.out_hidden_size = 32;
  return c;
}

TEST(Qwen3Vision, MalformedConfigsAndInputsAreErrors) {
  auto make = [](Qwen3VisionConfig c) {
    lf::models::ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(1), at::kFloat, c10::Device(c10::kCPU), {});
    return Qwen3VisionEncoder(c, lf::backend::cpu_backend(), b, "v");
  };
  auto c = tiny_vision();
  c.num_position_embeddings = 20;
  EXPECT_NE(error_of([&] { make(c); }).find("num_position_embeddings 20 is not the square"), std::string::npos);
  c = tiny_vision();
  c.deepstack_visual_indexes = {1, 0};
  EXPECT_NE(error_of([&] { make(c); }).find("must be strictly increasing"), std::string::npos);
  c.deepstack_visual_indexes = {2};
  EXPECT_NE(error_of([&] { make(c); }).find("holds 2, outside the 2 blocks"), std::string::npos);
  auto e = make(tiny_vision());
  const auto grid = at::tensor({1, 4, 6}, at::kLong).view({1, 3});
  auto m = error_of([&] { e.forward(at::zeros({23, e.config().patch_dim()}), grid); });
  EXPECT_NE(m.find("grid_thw covers 24 patches but pixel_values has 23 rows"), std::string::npos) << m;
  m = error_of([&] { e.forward(at::zeros({24, 10}), grid); });
  EXPECT_NE(m.find("pixel_values must be [num_patches, 1536]"), std::string::npos) << m;
  m = error_of([&] { e.forward(at::zeros({15, e.config().patch_dim()}), at::tensor({1, 3, 5}, at::kLong).view({1, 3})); });
  EXPECT_NE(m.find("positive multiples of spatial_merge_size 2"), std::string::npos) << m;
  // Weights: a missing and a stray tensor name themselves.
  std::map<std::string, at::Tensor> none;
  m = error_of([&] { e.load_hf_state(none); });
  EXPECT_NE(m.find("model.visual.patch_embed.proj.weight is missing"), std::string::npos) << m;
}

// The bilinear taps of transformers' fast_pos_embed_interpolate (align_corners): a grid as large
// as the table takes its rows one to one; a 1 x 2 sub-grid's corners are the table's corners.
TEST(Qwen3Vision, PositionTapsOfTheLearnedTable) {
  auto [idx, w] = lf::models::qwen3_vision_position_taps(at::tensor({1, 4, 4}, at::kLong).view({1, 3}), 4, 2);
  ASSERT_EQ(idx.sizes(), (std::vector<int64_t>{16, 4}));
  // Token 0..3 are the first 2x2 unit: rows/cols (0,0) (0,1) (1,0) (1,1) -> table rows 0, 1, 4, 5.
  const auto top = (idx * (w > 0.5)).sum(1);
  EXPECT_TRUE(at::equal(top.narrow(0, 0, 4), at::tensor({0, 1, 4, 5}, at::kLong))) << top;
  EXPECT_TRUE(at::allclose(w.sum(1), at::ones({16})));
}

// --- the composite ----------------------------------------------------------------------------

std::unique_ptr<Qwen3Vl> oracle_model(const std::string& dir, const lf::dist::ParallelContext* ctx = nullptr,
                                      const lf::models::PipelineStage& stage = {}) {
  const auto c = read_configs(dir + "/config.json");
  auto m = std::make_unique<Qwen3Vl>(c.text, c.vision, c.own, lf::backend::cpu_backend(), 5, at::kFloat, ctx, false,
                                     stage);
  m->load_hf_state(read_all(dir + "/weights.safetensors"));
  return m;
}

// max |ours - transformers'|: ours [s, b, v], theirs [b, s, v].
double logits_difference(const at::Tensor& ours, const at::Tensor& theirs) {
  const auto want = theirs.transpose(0, 1);
  EXPECT_EQ(ours.sizes(), want.sizes());
  EXPECT_GT(want.abs().max().item<double>(), 0.05);
  if (ours.sizes() != want.sizes()) return 1e9;
  return lf::testing::max_abs_diff(ours, want);
}

TEST(Qwen3Vl, PositionIdsMatchTransformers) {
  REQUIRE_ORACLE();
  const auto c = read_configs(oracle_dir() + "/config.json");
  auto io = read_all(oracle_dir() + "/io.safetensors");
  auto got = lf::models::qwen3_vl_position_ids(io.at("input_ids"), io.at("image_grid_thw"), {}, c.own, 2);
  EXPECT_TRUE(at::equal(got, io.at("position_ids"))) << got << "\n" << io.at("position_ids");
  got = lf::models::qwen3_vl_position_ids(io.at("video_ids"), io.at("video_image_grid"), io.at("video_grid_thw"),
                                          c.own, 2);
  EXPECT_TRUE(at::equal(got, io.at("video_position_ids"))) << got << "\n" << io.at("video_position_ids");
}

TEST(Qwen3Vl, LogitsMatchTransformers) {
  REQUIRE_ORACLE();
  auto m = oracle_model(oracle_dir());
  auto io = read_all(oracle_dir() + "/io.safetensors");
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(m->position_ids(io.at("input_ids"), io.at("image_grid_thw")), io.at("position_ids")));
  const auto logits = m->logits(io.at("input_ids"), io.at("pixel_values"), io.at("image_grid_thw"));
  const double diff = logits_difference(logits, io.at("logits"));
  // DeepStack matters: transformers' logits without it are far from these.
  const double deepstack = logits_difference(logits, io.at("logits_without_deepstack"));
  std::printf("[qwen3_vl parity] images TP=1: max |logits - transformers| = %.3g (without DeepStack: %.3g)\n", diff,
              deepstack);
  RecordProperty("tp1_max_abs_diff", std::to_string(diff));
  EXPECT_LE(diff, kTolerance);
  EXPECT_GT(deepstack, 0.1);
}

// HF conversion: the directory transformers' save_pretrained writes reads as a qwen3_vl
// (config.json's text_config with interleaved M-RoPE, vision_config with DeepStack) whose tensors,
// loaded into the composite, give transformers' logits; written back (lf2hf) every tensor is bit for
// bit the original and config.json carries the same model; the online load (loongforge-train --load
// HF_DIR) gives the same logits.
TEST(Qwen3Vl, HfConversionKeepsTheLogitsAndRoundTripsBitExact) {
  REQUIRE_ORACLE();
  namespace hf = lf::models::hf;
  const std::string dir = oracle_dir() + "/hf";
  ASSERT_TRUE(hf::is_vlm_hf_dir(dir));
  const hf::VlmHfModel m = hf::read_vlm_hf(dir);
  EXPECT_EQ(m.config.type, "qwen3_vl");
  EXPECT_EQ(m.architecture, "Qwen3VLForConditionalGeneration");
  const auto want = read_configs(oracle_dir() + "/config.json");
  EXPECT_EQ(m.config.foundation.mrope_section, want.text.mrope_section);
  EXPECT_TRUE(m.config.foundation.mrope_interleaved);
  EXPECT_TRUE(m.config.foundation.qk_layernorm);
  EXPECT_EQ(m.config.vision3.deepstack_visual_indexes, want.vision.deepstack_visual_indexes);
  EXPECT_EQ(m.config.vision3.num_position_embeddings, want.vision.num_position_embeddings);
  EXPECT_EQ(m.config.own3.image_token_id, want.own.image_token_id);
  Qwen3Vl model(m.config.foundation, m.config.vision3, m.config.own3, lf::backend::cpu_backend(), 5, at::kFloat, nullptr,
                false, {});
  const std::map<std::string, at::Tensor> full(m.tensors.begin(), m.tensors.end());
  hf::load_full_vlm(model, full);
  auto io = read_all(oracle_dir() + "/io.safetensors");
  at::NoGradGuard no_grad;
  const double diff = logits_difference(model.logits(io.at("input_ids"), io.at("pixel_values"), io.at("image_grid_thw")),
                                        io.at("logits"));
  std::printf("[qwen3_vl conversion] hf2lf tensors: max |logits - transformers| = %.3g\n", diff);
  EXPECT_LE(diff, kTolerance);
  // lf2hf(hf2lf(x)): the same tensor names, bit for bit.
  const std::string out = lf::testing::make_temp_dir("qwen3vl-lf2hf");
  hf::WriteOptions fp32;
  fp32.dtype = at::kFloat;  // the oracle's dtype (lf2hf writes bf16 unless told)
  hf::write_vlm_hf(out, m.config, m.tensors, fp32);
  lf::testing::expect_same_safetensors(dir + "/model.safetensors", out + "/model.safetensors");
  // The written config.json reads as the same model.
  const hf::VlmConfig again = hf::read_vlm_hf_config(out);
  EXPECT_EQ(again.type, "qwen3_vl");
  EXPECT_TRUE(again.foundation.mrope_interleaved);
  EXPECT_TRUE(lf::models::hf::model_differences(again.foundation, m.config.foundation).empty());
  EXPECT_EQ(again.vision3.deepstack_visual_indexes, m.config.vision3.deepstack_visual_indexes);
  EXPECT_EQ(again.vision3.hidden_act, m.config.vision3.hidden_act);
  // The online load.
  Qwen3Vl online(m.config.foundation, m.config.vision3, m.config.own3, lf::backend::cpu_backend(), 9, at::kFloat,
                 nullptr, false, {});
  hf::load_vlm_hf_into(online, dir);
  EXPECT_LE(logits_difference(online.logits(io.at("input_ids"), io.at("pixel_values"), io.at("image_grid_thw")),
                              io.at("logits")),
            kTolerance);
  // A qwen2_5_vl configuration refuses the Qwen3-VL directory, naming both.
  const auto e = error_of([&] {
    lf::models::Qwen25VisionConfig tower{2, 32, 48, 2};
    tower.fullatt_block_indexes = {1};
    lf::models::Qwen25VlConfig ids;
    ids.image_token_id = 192, ids.video_token_id = 193;
    lf::models::Qwen25Vl wrong(m.config.foundation, tower, ids, lf::backend::cpu_backend(), 1, at::kFloat, nullptr,
                               false, {});
    hf::load_vlm_hf_into(wrong, dir);
  });
  EXPECT_NE(e.find("is a Qwen3VLForConditionalGeneration (qwen3_vl); the configured model is qwen2_5_vl"),
            std::string::npos)
      << e;
}

// An FP8 block-quantized VLM checkpoint (DeepSeek's format on the language model's projections:
// float8_e4m3fn weights, a float32 <name>_scale_inv per 16 x 32 block, ragged at the edges) loads
// online into an fp32 model with its weights dequantized in fp32: the same logits, bit for bit, as
// the fp32 directory of the dequantized weights (in bf16, the reader's default for conversions,
// they would differ).
TEST(Qwen3Vl, Fp8CheckpointDequantizesIntoTheModelsDtype) {
  REQUIRE_ORACLE();
  namespace hf = lf::models::hf;
  const std::string src = oracle_dir() + "/hf", fp8 = lf::testing::make_temp_dir("qwen3vl-fp8"),
                    plain = lf::testing::make_temp_dir("qwen3vl-fp8-dequantized");
  for (const auto& d : {fp8, plain}) fs::copy(src, d, fs::copy_options::overwrite_existing | fs::copy_options::recursive);
  auto tensors = read_all(src + "/model.safetensors");
  std::map<std::string, at::Tensor> quantized;
  for (auto& [name, w] : tensors) {
    if (name.find("language_model") == std::string::npos || name.find("_proj.weight") == std::string::npos) continue;
    const int64_t r = w.size(0), c = w.size(1), br = (r + 15) / 16, bc = (c + 31) / 32;
    const auto padded = at::constant_pad_nd(w.abs(), {0, bc * 32 - c, 0, br * 16 - r});
    const at::Tensor scale = padded.view({br, 16, bc, 32}).amax({1, 3}).clamp_min(1e-12) / 448.0;  // [br, bc]
    const at::Tensor full = scale.repeat_interleave(16, 0).repeat_interleave(32, 1).narrow(0, 0, r).narrow(1, 0, c);
    const at::Tensor q = (w / full).to(at::kFloat8_e4m3fn);
    quantized[name] = q;
    quantized[name + "_scale_inv"] = scale.contiguous();
    w = q.to(at::kFloat) * full;  // what the plain directory holds
  }
  ASSERT_GT(quantized.size(), 8u);
  lf::testing::write_fp8_or_f32(plain + "/model.safetensors", tensors);
  for (const auto& [name, t] : tensors)
    if (!quantized.count(name)) quantized[name] = t;
  lf::testing::write_fp8_or_f32(fp8 + "/model.safetensors", quantized);
  lf::testing::edit_config(fp8, [](nlohmann::json& j) {
    j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                {"weight_block_size", {16, 32}}};
  });

  const hf::VlmHfModel m = hf::read_vlm_hf(src);
  const auto load = [&](const std::string& dir) {
    auto model = std::make_unique<Qwen3Vl>(m.config.foundation, m.config.vision3, m.config.own3,
                                           lf::backend::cpu_backend(), 9, at::kFloat, nullptr, false,
                                           lf::models::PipelineStage{});
    hf::load_vlm_hf_into(*model, dir);
    return model;
  };
  auto io = read_all(oracle_dir() + "/io.safetensors");
  at::NoGradGuard no_grad;
  const auto logits = [&](const std::unique_ptr<Qwen3Vl>& model) {
    return model->logits(io.at("input_ids"), io.at("pixel_values"), io.at("image_grid_thw"));
  };
  const at::Tensor got = logits(load(fp8));
  EXPECT_TRUE(at::equal(got, logits(load(plain))));
  EXPECT_GT(logits_difference(got, io.at("logits")), 1e-3);  // the FP8 rounding is in them
}

TEST(Qwen3Vl, ImageAndVideoMatchTransformers) {
  REQUIRE_ORACLE();
  auto m = oracle_model(oracle_dir());
  auto io = read_all(oracle_dir() + "/io.safetensors");
  at::NoGradGuard no_grad;
  const double diff = logits_difference(m->logits(io.at("video_ids"), io.at("video_pixel_values"),
                                                  io.at("video_image_grid"), io.at("pixel_values_videos"),
                                                  io.at("video_grid_thw")),
                                        io.at("video_logits"));
  std::printf("[qwen3_vl parity] image + 2-frame video TP=1: max |logits - transformers| = %.3g\n", diff);
  EXPECT_LE(diff, kTolerance);
}

// A text-only batch: transformers' logits, and the plain qwen3 causal_lm (1D RoPE) with the same
// language-model weights gives the same.
TEST(Qwen3Vl, TextOnlyEqualsTransformersAndThePlainDecoder) {
  REQUIRE_ORACLE();
  auto m = oracle_model(oracle_dir());
  auto io = read_all(oracle_dir() + "/io.safetensors");
  at::NoGradGuard no_grad;
  const auto vlm = m->logits(io.at("text_ids"), {}, {});
  const double diff = logits_difference(vlm, io.at("text_logits"));
  std::printf("[qwen3_vl parity] text only: max |logits - transformers| = %.3g\n", diff);
  EXPECT_LE(diff, kTolerance);

  auto text = read_configs(oracle_dir() + "/config.json").text;
  text.mrope_section.clear();
  text.mrope_interleaved = false;
  lf::models::CausalLm plain(text, lf::backend::cpu_backend(), 9, at::kFloat);
  const auto mapping = lf::models::hf::mapping_for_architecture("Qwen3ForCausalLM", "qwen3");
  const auto full = lf::models::hf::decoder_from_hf_tensors(
      text, mapping, read_all(oracle_dir() + "/weights.safetensors"), "model.language_model.");
  plain.load_full_parameters({full.begin(), full.end()});
  const double same = lf::testing::max_abs_diff(plain.forward(io.at("text_ids")), vlm);
  std::printf("[qwen3_vl parity] text only vs the qwen3 causal_lm: max |difference| = %.3g\n", same);
  EXPECT_LE(same, 1e-5);
}

TEST(Qwen3Vl, MismatchedStateDictsAreErrors) {
  REQUIRE_ORACLE();
  auto m = oracle_model(oracle_dir());
  const auto weights = read_all(oracle_dir() + "/weights.safetensors");
  auto missing = weights;
  missing.erase("model.language_model.layers.1.self_attn.q_norm.weight");
  auto e = error_of([&] { m->load_hf_state(missing); });
  EXPECT_NE(e.find("model.language_model.layers.1.self_attn.q_norm.weight"), std::string::npos) << e;
  auto stray = weights;
  stray["model.visual.deepstack_merger_list.2.norm.weight"] = at::ones({256});
  e = error_of([&] { m->load_hf_state(stray); });
  EXPECT_NE(e.find("unexpected: model.visual.deepstack_merger_list.2.norm.weight"), std::string::npos) << e;
  stray = weights;
  stray["visual.x"] = at::ones({1});
  e = error_of([&] { m->load_hf_state(stray); });
  EXPECT_NE(e.find("'visual.x' is neither"), std::string::npos) << e;
  auto shaped = weights;
  shaped["model.visual.pos_embed.weight"] = at::zeros({49, 64});
  e = error_of([&] { m->load_hf_state(shaped); });
  EXPECT_NE(e.find("model.visual.pos_embed.weight is [49, 64]"), std::string::npos) << e;
}

lf::data::Batch image_batch(const std::map<std::string, at::Tensor>& io) {
  const auto& tokens = io.at("input_ids");
  const int64_t s = tokens.size(1);
  auto labels = at::cat({tokens.narrow(1, 1, s - 1), at::zeros({tokens.size(0), 1}, at::kLong)}, 1);
  auto mask = at::ones(tokens.sizes(), at::kFloat);
  mask.select(1, s - 1).fill_(0);
  lf::data::Batch batch;
  batch.set("tokens", tokens, 1);
  batch.set("labels", labels, 1);
  batch.set("loss_mask", mask, 1);
  batch.set("pixel_values", io.at("pixel_values"));
  batch.set("image_grid_thw", io.at("image_grid_thw"));
  return batch;
}

// The trainer's path: stage_forward computes the positions and the DeepStack injections itself; its
// evaluation loss is the cross entropy of logits(), and the training loss reaches every vision
// weight (the DeepStack mergers' through the decoder's first layers).
TEST(Qwen3Vl, StageForwardOnABatchOfImages) {
  REQUIRE_ORACLE();
  auto m = oracle_model(oracle_dir());
  auto io = read_all(oracle_dir() + "/io.safetensors");
  const auto batch = image_batch(io);
  double want = 0;
  {
    at::NoGradGuard no_grad;
    const auto logits = m->logits(io.at("input_ids"), io.at("pixel_values"), io.at("image_grid_thw"));
    const auto logp =
        at::log_softmax(logits.transpose(0, 1), -1).gather(-1, batch.at("labels").unsqueeze(-1)).squeeze(-1);
    want = -(logp * batch.at("loss_mask")).sum().item<double>();
  }
  const auto eval = m->forward_step(batch, lf::models::Pass::eval);
  ASSERT_EQ(eval.metrics.count("lm loss"), 1u);
  EXPECT_NEAR(eval.metrics.at("lm loss").sum, want, 1e-4 * std::abs(want));
  const auto train = m->forward_step(batch, lf::models::Pass::train);
  ASSERT_EQ(train.losses.size(), 1u);
  EXPECT_NEAR(train.losses[0].sum.item<double>(), want, 1e-4 * std::abs(want));
  train.losses[0].sum.backward();
  for (const auto& p : m->vision_parameters()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    EXPECT_GT(p.tensor.grad().abs().max().item<double>(), 0) << p.name;
  }
  auto with_positions = batch;
  with_positions.set("position_ids", at::zeros(batch.at("tokens").sizes(), at::kLong), 1);
  EXPECT_NE(error_of([&] { m->forward_step(with_positions, lf::models::Pass::eval); }).find("--reset-position-ids"),
            std::string::npos);
}

// Two pipeline stages in one process (the first holding the two DeepStack layers): the first
// stage's activations through the second give the whole model's loss. A first stage of one layer
// is refused.
TEST(Qwen3Vl, PipelineStagesHoldingTheDeepStackLayers) {
  REQUIRE_ORACLE();
  auto io = read_all(oracle_dir() + "/io.safetensors");
  const auto c = read_configs(oracle_dir() + "/config.json");
  const auto batch = image_batch(io);
  auto whole = oracle_model(oracle_dir());
  at::NoGradGuard no_grad;
  const double want = whole->forward_step(batch, lf::models::Pass::eval).metrics.at("lm loss").sum;
  auto first = oracle_model(oracle_dir(), nullptr, lf::models::pipeline_stage(c.text, 2, 0, 2));
  auto last = oracle_model(oracle_dir(), nullptr, lf::models::pipeline_stage(c.text, 2, 1, 2));
  const auto a = first->stage_forward(batch, {}, 0, lf::models::Pass::eval);
  const auto out = last->stage_forward(batch, a.activations, 0, lf::models::Pass::eval);
  const double got = out.metrics.at("lm loss").sum;
  std::printf("[qwen3_vl parity] PP 2 (layers 0-1 | 2): loss %.8g vs whole model %.8g\n", got, want);
  EXPECT_NEAR(got, want, 1e-5 * std::abs(want));
  const auto m = error_of([&] {
    Qwen3Vl(c.text, c.vision, c.own, lf::backend::cpu_backend(), 5, at::kFloat, nullptr, false,
            lf::models::pipeline_stage(c.text, 2, 0, 1));
  });
  EXPECT_NE(m.find("must all lie on the first pipeline stage's first model chunk"), std::string::npos) << m;
}

LF_WORKER_CASE(qwen3_vl_tp2) {
  const std::string dir = lf::testing::worker_args().at(0);
  auto ctx = lf::testing::make_context(2);
  auto m = oracle_model(dir, ctx.get());
  EXPECT_EQ(m->tp_size(), 2);
  auto io = read_all(dir + "/io.safetensors");
  at::NoGradGuard no_grad;
  double diff =
      logits_difference(m->logits(io.at("input_ids"), io.at("pixel_values"), io.at("image_grid_thw")), io.at("logits"));
  std::printf("[qwen3_vl parity] images foundation TP=2 rank %d: max |logits - transformers| = %.3g\n",
              lf::testing::worker_rank(), diff);
  EXPECT_LE(diff, kTolerance);
  diff = logits_difference(m->logits(io.at("video_ids"), io.at("video_pixel_values"), io.at("video_image_grid"),
                                     io.at("pixel_values_videos"), io.at("video_grid_thw")),
                           io.at("video_logits"));
  std::printf("[qwen3_vl parity] image + video foundation TP=2 rank %d: max |logits - transformers| = %.3g\n",
              lf::testing::worker_rank(), diff);
  EXPECT_LE(diff, kTolerance);
}

TEST(Qwen3Vl, LogitsMatchTransformersAtTp2) {
  REQUIRE_ORACLE();
  auto results = lf::testing::run_workers("qwen3_vl_tp2", {.world_size = 2, .args = {oracle_dir()}});
  lf::testing::expect_all_ok(results);
  print_parity_lines(results);
}

// Sequence parallelism at foundation TP 2 (each rank adds the DeepStack rows of its own sequence
// chunk): the image batch with one more text token (26, divisible by 2) gives the single-device
// model's logits and evaluation loss.
LF_WORKER_CASE(qwen3_vl_tp2_sp) {
  const std::string dir = lf::testing::worker_args().at(0);
  const auto c = read_configs(dir + "/config.json");
  auto ctx = lf::testing::make_context(2);
  auto sp = std::make_unique<Qwen3Vl>(c.text, c.vision, c.own, lf::backend::cpu_backend(), 5, at::kFloat, ctx.get(),
                                      true, lf::models::PipelineStage{});
  sp->load_hf_state(read_all(dir + "/weights.safetensors"));
  EXPECT_TRUE(sp->sequence_parallel());
  auto one = oracle_model(dir);
  auto io = read_all(dir + "/io.safetensors");
  io["input_ids"] = at::cat({io.at("input_ids"), at::full({2, 1}, 17, at::kLong)}, 1);
  at::NoGradGuard no_grad;
  const double diff = lf::testing::max_abs_diff(sp->logits(io.at("input_ids"), io.at("pixel_values"), io.at("image_grid_thw")),
                                                one->logits(io.at("input_ids"), io.at("pixel_values"), io.at("image_grid_thw")));
  const auto batch = image_batch(io);
  const double got = sp->forward_step(batch, lf::models::Pass::eval).metrics.at("lm loss").sum,
               want = one->forward_step(batch, lf::models::Pass::eval).metrics.at("lm loss").sum;
  std::printf("[qwen3_vl parity] images foundation TP=2 + SP rank %d: max |logits - single device| = %.3g, "
              "loss %.8g vs %.8g\n", lf::testing::worker_rank(), diff, got, want);
  EXPECT_LE(diff, 1e-5);
  EXPECT_NEAR(got, want, 1e-5 * std::abs(want));
}

TEST(Qwen3Vl, SequenceParallelMatchesOneDevice) {
  REQUIRE_ORACLE();
  auto results = lf::testing::run_workers("qwen3_vl_tp2_sp", {.world_size = 2, .args = {oracle_dir()}});
  lf::testing::expect_all_ok(results);
  print_parity_lines(results);
}

// --- without Python -----------------------------------------------------------------------------

// Hand-computed positions: text, an image of 4x6 patches (2x3 merged), text, a video of 2 frames of
// 4x4 patches, each frame its own run after a timestamp token, text.
TEST(Qwen3Vl, PositionIdsOfImagesAndVideoFrames) {
  Qwen3VlConfig ids;
  ids.image_token_id = 7;
  ids.video_token_id = 8;
  std::vector<int64_t> row{1, 2};
  for (int i = 0; i < 6; ++i) row.push_back(7);
  row.push_back(3);
  for (int i = 0; i < 4; ++i) row.push_back(8);
  row.push_back(4);
  for (int i = 0; i < 4; ++i) row.push_back(8);
  row.push_back(5);
  const auto tokens = at::tensor(row, at::kLong).unsqueeze(0);
  const auto image = at::tensor({1, 4, 6}, at::kLong).view({1, 3}), video = at::tensor({2, 4, 4}, at::kLong).view({1, 3});
  const auto got = lf::models::qwen3_vl_position_ids(tokens, image, video, ids, 2).select(1, 0);
  // Image at 2 (t 2, h 2 + {0, 1}, w 2 + {0, 1, 2}), text at 5, frame 0 at 6 (t 6), text at 8,
  // frame 1 at 9 (t 9, not 6 + 1: frames are separate grids), text at 11.
  const auto want = at::tensor({0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 6, 6, 6, 8, 9, 9, 9, 9, 11,
                                0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 6, 7, 7, 8, 9, 9, 10, 10, 11,
                                0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 6, 7, 8, 9, 10, 9, 10, 11}, at::kLong).view({3, 19});
  EXPECT_TRUE(at::equal(got, want)) << got;
  auto m = error_of([&] { lf::models::qwen3_vl_position_ids(tokens, image, {}, ids, 2); });
  EXPECT_NE(m.find("beyond the 0 frame(s) of video_grid_thw"), std::string::npos) << m;
  const auto three = at::tensor({1, 7, 7, 7, 2}, at::kLong).view({1, 5});
  m = error_of([&] { lf::models::qwen3_vl_position_ids(three, at::tensor({1, 4, 4}, at::kLong).view({1, 3}), {}, ids, 2); });
  EXPECT_NE(m.find("image 0 (grid 1x4x4, merge 2) needs 4 consecutive placeholder tokens, the sequence holds 3"),
            std::string::npos) << m;
}

lf::models::DecoderConfig tiny_text() {
  lf::models::DecoderConfig text;
  text.num_layers = 2;
  text.hidden_size = 32;
  text.ffn_hidden_size = 48;
  text.num_attention_heads = 4;
  text.num_query_groups = 2;
  text.vocab_size = 20;
  text.make_vocab_size_divisible_by = 4;
  text.max_position_embeddings = 32;
  text.qk_layernorm = true;
  return text;
}

TEST(Qwen3Vl, ConfigAndInputErrors) {
  Qwen3VlConfig ids;
  ids.image_token_id = 7;
  ids.video_token_id = 8;
  auto text = tiny_text();
  auto v = tiny_vision();
  auto build = [&] { Qwen3Vl(text, v, ids, lf::backend::cpu_backend(), 1, at::kFloat, nullptr, false, {}); };
  auto m = error_of(build);
  EXPECT_NE(m.find("mrope_interleaved: true"), std::string::npos) << m;
  text.mrope_section = {2, 1, 1};
  m = error_of(build);
  EXPECT_NE(m.find("mrope_interleaved: true"), std::string::npos) << m;
  text.mrope_interleaved = true;
  v.deepstack_visual_indexes = {0, 1};
  text.num_layers = 1;
  m = error_of(build);
  EXPECT_NE(m.find("2 DeepStack entries feed the decoder's first 2 layers, but it has 1"), std::string::npos) << m;
  text.num_layers = 2;
  Qwen3Vl model(text, v, ids, lf::backend::cpu_backend(), 1, at::kFloat, nullptr, false, {});
  const auto grid = at::tensor({1, 4, 4}, at::kLong).view({1, 3});
  const auto pixels = at::randn({16, v.patch_dim()});
  const auto five = at::tensor({1, 7, 7, 7, 7, 7, 2}, at::kLong).view({1, 7});
  m = error_of([&] { model.logits(five, pixels, grid); });
  EXPECT_NE(m.find("the tokens hold 5 image placeholders (model.image_token_id 7) but the vision tower makes 4 "
                   "embeddings from the 1 grid(s) of image_grid_thw"), std::string::npos) << m;
  const auto four = at::tensor({1, 7, 7, 7, 7, 2}, at::kLong).view({1, 6});
  EXPECT_EQ(model.logits(four, pixels, grid).sizes(), (std::vector<int64_t>{6, 1, 20}));
  m = error_of([&] { model.logits(four, {}, {}); });
  EXPECT_NE(m.find("the tokens hold 4 image placeholders (model.image_token_id 7) but the batch has no pixel_values"),
            std::string::npos) << m;
  const auto video = at::tensor({1, 8, 8, 8, 8, 2}, at::kLong).view({1, 6});
  m = error_of([&] { model.logits(video, {}, {}, at::randn({24, v.patch_dim()}), at::tensor({1, 4, 6}, at::kLong).view({1, 3})); });
  EXPECT_NE(m.find("the tokens hold 4 video placeholders (model.video_token_id 8) but the vision tower makes 6"),
            std::string::npos) << m;
  m = error_of([&] { lf::models::qwen3_vl_position_ids(video, {}, at::tensor({1, 4, 6}, at::kLong).view({1, 3}), ids, 2); });
  EXPECT_NE(m.find("video 0 frame 0 (grid 1x4x6, merge 2) needs 6 consecutive placeholder tokens, the sequence holds 4"),
            std::string::npos) << m;
  EXPECT_EQ(model.logits(video, {}, {}, pixels, grid).sizes(), (std::vector<int64_t>{6, 1, 20}));
}

// The decoder's injection hook: an injection after a layer the call does not run, or with a
// mismatched row count, is an error; an injection of zeros changes nothing.
TEST(Qwen3Vl, DecoderInjections) {
  auto text = tiny_text();
  lf::models::CausalLm lm(text, lf::backend::cpu_backend(), 3, at::kFloat);
  const auto tokens = at::tensor({1, 2, 3, 4, 5}, at::kLong).view({1, 5});
  at::NoGradGuard no_grad;
  const auto& dec = lm.foundation();
  const auto x = dec.embed(tokens, 0);
  lf::models::DecoderInputs in;
  in.seq = 5;
  const auto plain = dec.run_layers(x, in);
  const auto mask = at::tensor({0, 1, 1, 0, 1}, at::kLong).view({1, 5}).to(at::kBool);
  in.injections.push_back({0, mask, at::zeros({3, 32})});
  EXPECT_TRUE(at::equal(dec.run_layers(x, in), plain));
  // One row added after the last layer lands exactly there.
  in.injections = {{1, mask, at::ones({3, 32})}};
  const auto shifted = dec.run_layers(x, in) - plain;  // [s, b, h]
  EXPECT_TRUE(at::allclose(shifted.select(1, 0).sum(1), at::tensor({0.f, 32.f, 32.f, 0.f, 32.f})));
  in.injections = {{1, mask, at::ones({2, 32})}};
  auto m = error_of([&] { dec.run_layers(x, in); });
  EXPECT_NE(m.find("values must be [3 (the mask's positions), 32]"), std::string::npos) << m;
  in.injections = {{1, mask, at::ones({3, 32})}};
  m = error_of([&] { dec.run_layers(x, in, 0, 1); });
  EXPECT_NE(m.find("an injection after decoder layer 1 reached a call running layers 0..0"), std::string::npos) << m;
}

// The composite and both components load from a `model:` section; mrope_interleaved needs sections.
TEST(Qwen3Vl, LoadsFromYaml) {
  auto cfg = lf::models::load_model_config(lf::config::parse_yaml_string(
      "type: qwen3_vl\nimage_token_id: 192\nvideo_token_id: 193\n"
      "vision_encoder:\n  type: qwen3_vl_vision\n  depth: 2\n  hidden_size: 32\n  intermediate_size: 40\n"
      "  num_heads: 2\n  num_position_embeddings: 16\n  deepstack_visual_indexes: [0]\n"
      "foundation:\n  type: decoder\n  num_layers: 2\n  hidden_size: 64\n  ffn_hidden_size: 96\n"
      "  num_attention_heads: 4\n  num_query_groups: 2\n  kv_channels: 16\n  vocab_size: 200\n"
      "  max_position_embeddings: 256\n  qk_layernorm: true\n  mrope_section: [4, 2, 2]\n  mrope_interleaved: true\n",
      {}));
  EXPECT_EQ(cfg->own_fields<Qwen3VlConfig>().image_token_id, 192);
  const auto f = cfg->fields<lf::models::DecoderConfig>("foundation");
  EXPECT_TRUE(f.mrope_interleaved);
  const auto v = cfg->fields<Qwen3VisionConfig>("vision_encoder");
  EXPECT_EQ(v.deepstack_visual_indexes, (std::vector<int64_t>{0}));
  EXPECT_EQ(v.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(v.patch_size, 16);
  const auto bad = lf::testing::error_message([] {
    lf::models::load_model_config(lf::config::parse_yaml_string(
        "type: causal_lm\nfoundation:\n  type: decoder\n  num_layers: 2\n  hidden_size: 64\n  ffn_hidden_size: 96\n"
        "  num_attention_heads: 4\n  vocab_size: 200\n  max_position_embeddings: 256\n  mrope_interleaved: true\n",
        {}))->fields<lf::models::DecoderConfig>("foundation");
  });
  EXPECT_NE(bad.find("mrope_interleaved arranges the sections of M-RoPE, but mrope_section is empty"),
            std::string::npos) << bad;
  const auto* t = lf::models::Registry::builtin().composite("qwen3_vl");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->slots[0].default_type, "qwen3_vl_vision");
}

}  // namespace

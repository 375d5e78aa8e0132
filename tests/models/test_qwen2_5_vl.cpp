// The qwen2_5_vl composite against transformers (tests/models/vlm_oracle.py, Python as an oracle
// only): a tiny random Qwen2_5_VLForConditionalGeneration saved by transformers, its state dict
// loaded by name (Qwen25Vl::load_hf_state: model.visual.* into the vision tower, the language model
// through the qwen2 HF mapping), run on a batch of two samples, each with an image of its own size
// between text: the M-RoPE position ids equal get_rope_index's, the full-vocabulary logits equal
// transformers' fp32 logits within 1e-4 on one device and with the foundation at TP 2. A text-only
// batch gives transformers' logits and the plain qwen2 causal_lm's with the same weights. Position
// ids of videos, placeholder/grid mismatches and the registry entry run without Python.
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
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/models/composites/qwen2_5_vl.h"
#include "loongforge/models/hf_adapter.h"
#include "loongforge/models/registry.h"
#include "error_message.h"
#include "cached_oracle.h"
#include "multiprocess.h"

namespace {
namespace fs = std::filesystem;
using lf::models::Qwen25Vl;
using lf::models::Qwen25VlConfig;
using lf::models::Qwen25VisionConfig;

std::string python() { return lf::testing::venv_python(); }
std::string oracle_script() { return lf::testing::source_dir() + "/tests/models/vlm_oracle.py"; }

using lf::testing::read_text;

const std::string& oracle_dir() {
  static const std::string dir = lf::testing::cached_oracle(oracle_script(), "vlm_oracle", "io.safetensors");
  return dir;
}

#define REQUIRE_ORACLE()                                                                   \
  if (oracle_dir().empty()) GTEST_SKIP() << "transformers is not installed in " << python(); \
  ASSERT_TRUE(fs::exists(oracle_dir() + "/io.safetensors"))

std::map<std::string, at::Tensor> read_all(const std::string& file) { return lf::testing::read_safetensors(file); }

struct Configs {
  lf::models::DecoderConfig text;
  Qwen25VisionConfig vision;
  Qwen25VlConfig own;
};

// The oracle's config.json (transformers' field names) -> ours.
Configs read_configs(const std::string& file) {
  const auto j = nlohmann::json::parse(read_text(file));
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
  c.text.rotary_base = t.at("rope_parameters").at("rope_theta");
  c.text.mrope_section = t.at("rope_parameters").at("mrope_section").get<std::vector<int64_t>>();
  c.text.add_qkv_bias = true;
  c.text.untie_embeddings_and_output_weights = !t.at("tie_word_embeddings").get<bool>();
  const auto& v = j.at("vision");
  c.vision.depth = v.at("depth");
  c.vision.hidden_size = v.at("hidden_size");
  c.vision.intermediate_size = v.at("intermediate_size");
  c.vision.num_heads = v.at("num_heads");
  c.vision.window_size = v.at("window_size");
  c.vision.fullatt_block_indexes = v.at("fullatt_block_indexes").get<std::vector<int64_t>>();
  c.vision.out_hidden_size = v.at("out_hidden_size");
  c.own.image_token_id = j.at("image_token_id");
  c.own.video_token_id = j.at("video_token_id");
  c.own.tokens_per_second = v.at("tokens_per_second");
  return c;
}

std::unique_ptr<Qwen25Vl> oracle_model(const std::string& dir, const lf::dist::ParallelContext* ctx = nullptr) {
  const auto c = read_configs(dir + "/config.json");
  auto m = std::make_unique<Qwen25Vl>(c.text, c.vision, c.own, lf::backend::cpu_backend(), 5, at::kFloat, ctx, false,
                                      lf::models::PipelineStage{});
  m->load_hf_state(read_all(dir + "/weights.safetensors"));
  return m;
}

// max |ours - transformers'|: ours [s, b, v], theirs [b, s, v].
double logits_difference(const at::Tensor& ours, const at::Tensor& theirs) {
  const auto want = theirs.transpose(0, 1);
  EXPECT_EQ(ours.sizes(), want.sizes());
  EXPECT_GT(want.abs().max().item<double>(), 0.05);  // a real signal
  if (ours.sizes() != want.sizes()) return 1e9;
  return lf::testing::max_abs_diff(ours, want);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const lf::Error& e) {
    return e.what();
  }
  return "";
}

// fp32 end to end: the differences are the order of floating-point sums; a wrong splice, M-RoPE
// section or position would be O(0.1).
constexpr double kTolerance = 1e-4;

// The oracle's batch of images and videos (mv_*).
lf::models::Qwen25VlMedia media_batch(const std::map<std::string, at::Tensor>& io) {
  lf::models::Qwen25VlMedia m;
  m.pixel_values = io.at("mv_pixel_values");
  m.image_grid_thw = io.at("mv_image_grid");
  m.pixel_values_videos = io.at("mv_pixel_values_videos");
  m.video_grid_thw = io.at("mv_video_grid");
  const at::Tensor s = io.at("mv_seconds").to(at::kDouble).contiguous();
  m.second_per_grid_ts.assign(s.data_ptr<double>(), s.data_ptr<double>() + s.numel());
  return m;
}

TEST(Qwen25Vl, PositionIdsMatchTransformers) {
  REQUIRE_ORACLE();
  const auto c = read_configs(oracle_dir() + "/config.json");
  auto io = read_all(oracle_dir() + "/io.safetensors");
  const auto got = lf::models::qwen2_5_vl_position_ids(io.at("input_ids"), io.at("image_grid_thw"), {}, {}, c.own,
                                                       c.vision.spatial_merge_size);
  EXPECT_TRUE(at::equal(got, io.at("position_ids"))) << got << "\n" << io.at("position_ids");
}

TEST(Qwen25Vl, LogitsMatchTransformers) {
  REQUIRE_ORACLE();
  auto m = oracle_model(oracle_dir());
  auto io = read_all(oracle_dir() + "/io.safetensors");
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(m->position_ids(io.at("input_ids"), io.at("image_grid_thw")), io.at("position_ids")));
  const double diff =
      logits_difference(m->logits(io.at("input_ids"), io.at("pixel_values"), io.at("image_grid_thw")), io.at("logits"));
  std::printf("[vlm parity] qwen2_5_vl TP=1: max |logits - transformers| = %.3g\n", diff);
  RecordProperty("tp1_max_abs_diff", std::to_string(diff));
  EXPECT_LE(diff, kTolerance);
}

// Images and videos in one batch (an image and a 2-step video at 0.5 s per step in sample 0, a
// video in sample 1): the splice of each kind at its own placeholders and the videos' temporal
// positions.
TEST(Qwen25Vl, LogitsOfImagesAndVideosMatchTransformers) {
  REQUIRE_ORACLE();
  auto m = oracle_model(oracle_dir());
  auto io = read_all(oracle_dir() + "/io.safetensors");
  at::NoGradGuard no_grad;
  const auto media = media_batch(io);
  EXPECT_TRUE(at::equal(m->position_ids(io.at("mv_ids"), media), io.at("mv_position_ids")));
  const double diff = logits_difference(m->logits(io.at("mv_ids"), media), io.at("mv_logits"));
  std::printf("[vlm parity] qwen2_5_vl images + videos TP=1: max |logits - transformers| = %.3g\n", diff);
  EXPECT_LE(diff, kTolerance);
  // Videos without their pixels, or with the grids swapped between kinds, are errors.
  auto no_video = media;
  no_video.pixel_values_videos = at::Tensor();
  EXPECT_NE(error_of([&] { m->logits(io.at("mv_ids"), no_video); }).find("video placeholders"), std::string::npos);
  auto swapped = media;
  std::swap(swapped.image_grid_thw, swapped.video_grid_thw);
  std::swap(swapped.pixel_values, swapped.pixel_values_videos);
  EXPECT_NE(error_of([&] { m->logits(io.at("mv_ids"), swapped); }), "");
}

// A state dict that is not this model's: a missing, a stray and a misshapen tensor are errors
// naming them.
TEST(Qwen25Vl, MismatchedStateDictsAreErrors) {
  REQUIRE_ORACLE();
  auto m = oracle_model(oracle_dir());
  const auto weights = read_all(oracle_dir() + "/weights.safetensors");
  auto missing = weights;
  missing.erase("model.language_model.layers.1.mlp.up_proj.weight");
  auto e = error_of([&] { m->load_hf_state(missing); });
  EXPECT_NE(e.find("model.language_model.layers.1.mlp.up_proj.weight' (for decoder.layers.1"), std::string::npos) << e;
  auto stray = weights;
  stray["model.language_model.layers.2.input_layernorm.weight"] = at::ones({64});
  e = error_of([&] { m->load_hf_state(stray); });
  EXPECT_NE(e.find("'model.language_model.layers.2.input_layernorm.weight' has no place"), std::string::npos) << e;
  auto shaped = weights;
  shaped["lm_head.weight"] = at::zeros({10, 64});
  e = error_of([&] { m->load_hf_state(shaped); });
  EXPECT_NE(e.find("'lm_head.weight' has shape"), std::string::npos) << e;
  stray = weights;
  stray["vision_tower.x"] = at::ones({1});
  e = error_of([&] { m->load_hf_state(stray); });
  EXPECT_NE(e.find("'vision_tower.x' is neither"), std::string::npos) << e;
}

// A text-only batch: 1D positions (M-RoPE with equal rows); transformers' logits, and the plain
// qwen2 causal_lm (no mrope_section) with the same language-model weights gives the same.
TEST(Qwen25Vl, TextOnlyEqualsTransformersAndThePlainDecoder) {
  REQUIRE_ORACLE();
  auto m = oracle_model(oracle_dir());
  auto io = read_all(oracle_dir() + "/io.safetensors");
  at::NoGradGuard no_grad;
  const auto vlm = m->logits(io.at("text_ids"), {}, {});
  const double diff = logits_difference(vlm, io.at("text_logits"));
  std::printf("[vlm parity] qwen2_5_vl text only: max |logits - transformers| = %.3g\n", diff);
  EXPECT_LE(diff, kTolerance);

  auto text = read_configs(oracle_dir() + "/config.json").text;
  text.mrope_section.clear();
  lf::models::CausalLm plain(text, lf::backend::cpu_backend(), 9, at::kFloat);
  const auto mapping = lf::models::hf::mapping_for_architecture("Qwen2ForCausalLM", "qwen2");
  const auto full = lf::models::hf::decoder_from_hf_tensors(text, mapping, read_all(oracle_dir() + "/weights.safetensors"),
                                                            "model.language_model.");
  plain.load_full_parameters({full.begin(), full.end()});
  const double same = lf::testing::max_abs_diff(plain.forward(io.at("text_ids")), vlm);
  std::printf("[vlm parity] qwen2_5_vl text only vs the qwen2 causal_lm: max |difference| = %.3g\n", same);
  EXPECT_LE(same, 1e-5);
}

// The trainer's path: stage_forward on a batch (tokens, labels, loss_mask, pixel_values,
// image_grid_thw) computes the M-RoPE positions itself; its evaluation loss is the cross entropy of
// logits(), and the training loss reaches the vision tower's weights.
TEST(Qwen25Vl, StageForwardOnABatchOfImages) {
  REQUIRE_ORACLE();
  auto m = oracle_model(oracle_dir());
  auto io = read_all(oracle_dir() + "/io.safetensors");
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
  double want = 0;
  {
    at::NoGradGuard no_grad;
    const auto logits = m->logits(tokens, io.at("pixel_values"), io.at("image_grid_thw"));  // [s, b, v]
    const auto logp = at::log_softmax(logits.transpose(0, 1), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1);
    want = -(logp * mask).sum().item<double>();
  }
  const auto eval = m->forward_step(batch, lf::models::Pass::eval);
  ASSERT_EQ(eval.metrics.count("lm loss"), 1u);
  EXPECT_NEAR(eval.metrics.at("lm loss").sum, want, 1e-4 * std::abs(want));
  EXPECT_EQ(eval.metrics.at("lm loss").count, mask.sum().item<double>());
  const auto train = m->forward_step(batch, lf::models::Pass::train);
  ASSERT_EQ(train.losses.size(), 1u);
  EXPECT_NEAR(train.losses[0].sum.item<double>(), want, 1e-4 * std::abs(want));
  train.losses[0].sum.backward();
  for (const auto& p : m->vision_parameters()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    EXPECT_GT(p.tensor.grad().abs().max().item<double>(), 0) << p.name;
  }
  auto with_positions = batch;
  with_positions.set("position_ids", at::zeros(tokens.sizes(), at::kLong), 1);
  EXPECT_NE(error_of([&] { m->forward_step(with_positions, lf::models::Pass::eval); }).find("--reset-position-ids"),
            std::string::npos);
}

// The composite and its own fields load from a `model:` section.
TEST(Qwen25Vl, LoadsFromYaml) {
  auto cfg = lf::models::load_model_config(lf::config::parse_yaml_string(
      "type: qwen2_5_vl\nimage_token_id: 192\nvideo_token_id: 193\n"
      "vision_encoder:\n  type: qwen2_5_vl_vision\n  depth: 2\n  hidden_size: 32\n  intermediate_size: 40\n"
      "  num_heads: 2\n  fullatt_block_indexes: [1]\n"
      "foundation:\n  type: decoder\n  num_layers: 2\n  hidden_size: 64\n  ffn_hidden_size: 96\n"
      "  num_attention_heads: 4\n  num_query_groups: 2\n  kv_channels: 16\n  vocab_size: 200\n"
      "  max_position_embeddings: 256\n  mrope_section: [2, 3, 3]\n",
      {}));
  const auto own = cfg->own_fields<Qwen25VlConfig>();
  EXPECT_EQ(own.image_token_id, 192);
  EXPECT_EQ(own.tokens_per_second, 2);
  EXPECT_EQ(cfg->fields<lf::models::DecoderConfig>("foundation").mrope_section, (std::vector<int64_t>{2, 3, 3}));
  EXPECT_EQ(cfg->fields<Qwen25VisionConfig>("vision_encoder").depth, 2);
  // Sections that do not sum to head_dim / 2 are a configuration error naming the key.
  const auto bad = lf::testing::error_message([] {
    lf::models::load_model_config(lf::config::parse_yaml_string(
        "type: causal_lm\nfoundation:\n  type: decoder\n  num_layers: 2\n  hidden_size: 64\n  ffn_hidden_size: 96\n"
        "  num_attention_heads: 4\n  vocab_size: 200\n  max_position_embeddings: 256\n  mrope_section: [2, 3, 2]\n",
        {}))->fields<lf::models::DecoderConfig>("foundation");
  });
  EXPECT_NE(bad.find("summing to the rotary head_dim / 2 = 8"), std::string::npos) << bad;
}

LF_WORKER_CASE(vlm_parity_tp2) {
  const std::string dir = lf::testing::worker_args().at(0);
  auto ctx = lf::testing::make_context(2);
  auto m = oracle_model(dir, ctx.get());
  EXPECT_EQ(m->tp_size(), 2);
  auto io = read_all(dir + "/io.safetensors");
  at::NoGradGuard no_grad;
  const double diff =
      logits_difference(m->logits(io.at("input_ids"), io.at("pixel_values"), io.at("image_grid_thw")), io.at("logits"));
  std::printf("[vlm parity] qwen2_5_vl foundation TP=2 rank %d: max |logits - transformers| = %.3g\n",
              lf::testing::worker_rank(), diff);
  EXPECT_LE(diff, kTolerance);
  const double mv = logits_difference(m->logits(io.at("mv_ids"), media_batch(io)), io.at("mv_logits"));
  std::printf("[vlm parity] qwen2_5_vl images + videos foundation TP=2 rank %d: max |logits - transformers| = %.3g\n",
              lf::testing::worker_rank(), mv);
  EXPECT_LE(mv, kTolerance);
}

TEST(Qwen25Vl, LogitsMatchTransformersAtTp2) {
  REQUIRE_ORACLE();
  auto results = lf::testing::run_workers("vlm_parity_tp2", {.world_size = 2, .args = {oracle_dir()}});
  lf::testing::expect_all_ok(results);
  for (const auto& r : results)
    for (size_t at = r.output.find("[vlm parity]"); at != std::string::npos; at = r.output.find("[vlm parity]", at + 1))
      std::printf("%s\n", r.output.substr(at, r.output.find('\n', at) - at).c_str());
}

// Hand-computed positions (no Python): text, an image of 4x6 patches (2x3 merged), text, a video of
// 2 frames of 4x4 patches at 2 tokens per second and 0.5 s per grid step, text.
TEST(Qwen25Vl, PositionIdsOfImagesAndVideos) {
  Qwen25VlConfig ids;
  ids.image_token_id = 7;
  ids.video_token_id = 8;
  ids.tokens_per_second = 2;
  std::vector<int64_t> row{1, 2};
  for (int i = 0; i < 6; ++i) row.push_back(7);
  row.push_back(3);
  for (int i = 0; i < 8; ++i) row.push_back(8);
  row.push_back(4);
  const auto tokens = at::tensor(row, at::kLong).unsqueeze(0);
  const auto image = at::tensor({1, 4, 6}, at::kLong).view({1, 3}), video = at::tensor({2, 4, 4}, at::kLong).view({1, 3});
  const auto got = lf::models::qwen2_5_vl_position_ids(tokens, image, video, {0.5}, ids, 2).select(1, 0);
  // Image at 2: t 2, h 2 + {0, 1}, w 2 + {0, 1, 2}; the text after it at 2 + max(2, 3) = 5; the
  // video at 6: t 6 + floor(frame x 1.0), h/w 6 + {0, 1}; the last text at 6 + 2 = 8.
  const auto want = at::tensor({0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 6, 6, 6, 7, 7, 7, 7, 8,
                                0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 6, 7, 7, 6, 6, 7, 7, 8,
                                0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 8}, at::kLong).view({3, 18});
  EXPECT_TRUE(at::equal(got, want)) << got;
  // Text only: 0 .. s - 1 on every axis.
  const auto text = lf::models::qwen2_5_vl_position_ids(at::tensor({5, 6, 9}, at::kLong).view({1, 3}), {}, {}, {}, ids, 2);
  EXPECT_TRUE(at::equal(text, at::arange(3, at::kLong).view({1, 1, 3}).expand({3, 1, 3})));
}

// A 1-layer text foundation (vocabulary 20) and a 1-block vision tower, randomly initialised.
lf::models::DecoderConfig tiny_text() {
  lf::models::DecoderConfig text;
  text.num_layers = 1;
  text.hidden_size = 32;
  text.ffn_hidden_size = 48;
  text.num_attention_heads = 4;
  text.num_query_groups = 2;
  text.vocab_size = 20;
  text.make_vocab_size_divisible_by = 4;
  text.max_position_embeddings = 32;
  return text;
}
Qwen25VisionConfig tiny_vision() {
  Qwen25VisionConfig v;
  v.depth = 1;
  v.hidden_size = 32;
  v.intermediate_size = 40;
  v.num_heads = 2;
  v.window_size = 56;
  v.fullatt_block_indexes = {0};
  return v;
}

TEST(Qwen25Vl, PlaceholderAndGridMismatchesAreErrors) {
  Qwen25VlConfig ids;
  ids.image_token_id = 7;
  ids.video_token_id = 8;
  const auto grid = at::tensor({1, 4, 4}, at::kLong).view({1, 3});  // 4 placeholders
  const auto three = at::tensor({1, 7, 7, 7, 2}, at::kLong).view({1, 5});
  auto m = error_of([&] { lf::models::qwen2_5_vl_position_ids(three, grid, {}, {}, ids, 2); });
  EXPECT_NE(m.find("needs 4 consecutive placeholder tokens, the sequence holds 3"), std::string::npos) << m;
  const auto none = at::tensor({1, 2, 3}, at::kLong).view({1, 3});
  m = error_of([&] { lf::models::qwen2_5_vl_position_ids(none, grid, {}, {}, ids, 2); });
  EXPECT_NE(m.find("image_grid_thw holds 1 grid(s)"), std::string::npos) << m;
  m = error_of([&] { lf::models::qwen2_5_vl_position_ids(three, {}, {}, {}, ids, 2); });
  EXPECT_NE(m.find("beyond the 0 grid(s) of image_grid_thw"), std::string::npos) << m;

  // The model: tower outputs and placeholders disagree; a foundation without M-RoPE sections.
  lf::models::DecoderConfig text = tiny_text();
  Qwen25VisionConfig v = tiny_vision();
  ids.image_token_id = 151655;
  m = error_of([&] { Qwen25Vl(text, v, ids, lf::backend::cpu_backend(), 1, at::kFloat, nullptr, false, {}); });
  EXPECT_NE(m.find("model.image_token_id 151655 is outside the vocabulary of 20 tokens"), std::string::npos) << m;
  ids.image_token_id = 7;
  // No mrope_section: Qwen2.5-VL's proportions of head_dim / 2 = 4 (a quarter temporal).
  EXPECT_EQ(Qwen25Vl(text, v, ids, lf::backend::cpu_backend(), 1, at::kFloat, nullptr, false, {}).config().mrope_section,
            (std::vector<int64_t>{1, 1, 2}));
  text.mrope_section = {2, 2, 2};
  m = error_of([&] { Qwen25Vl(text, v, ids, lf::backend::cpu_backend(), 1, at::kFloat, nullptr, false, {}); });
  EXPECT_NE(m.find("summing to the rotary head_dim / 2 = 4"), std::string::npos) << m;
  text.mrope_section = {2, 1, 1};
  Qwen25Vl model(text, v, ids, lf::backend::cpu_backend(), 1, at::kFloat, nullptr, false, {});
  const auto pixels = at::randn({16, v.patch_dim()});
  const auto five = at::tensor({1, 7, 7, 7, 7, 7, 2}, at::kLong).view({1, 7});
  m = error_of([&] { model.logits(five, pixels, grid); });
  EXPECT_NE(m.find("the tokens hold 5 image placeholders (model.image_token_id 7) but the image grids (1, 4, 4) make 4"),
            std::string::npos) << m;
  const auto four = at::tensor({1, 7, 7, 7, 7, 2}, at::kLong).view({1, 6});
  EXPECT_EQ(model.logits(four, pixels, grid).sizes(), (std::vector<int64_t>{6, 1, 20}));
  m = error_of([&] { model.logits(four, {}, {}); });
  EXPECT_NE(m.find("the tokens hold 4 image placeholders"), std::string::npos) << m;
}

// --packing-sft-data: conversations with images packed into rows (document ids, restarting
// positions, the media in order) train as each conversation in its own row: the M-RoPE positions
// restart per document, attention stays within it; the loss and every gradient (the vision tower's
// too) agree, <= 1e-5 relative (fp32: the same products, per-document attention slices).
TEST(Qwen25Vl, PackedConversationsEqualEachInItsOwnRow) {
  lf::models::DecoderConfig text = tiny_text();
  text.num_layers = 2;
  const Qwen25VisionConfig v = tiny_vision();
  Qwen25VlConfig ids;
  ids.image_token_id = 7;
  ids.video_token_id = 8;
  // Three conversations; images of 4 and 8 placeholders (grids 1x4x4 and 1x4x8).
  const std::vector<std::vector<int64_t>> conv = {
      {1, 7, 7, 7, 7, 2, 3}, {4, 5, 7, 7, 7, 7, 7, 7, 7, 7, 6}, {3, 7, 7, 7, 7, 1, 2, 9, 3}};
  const std::vector<at::Tensor> grids = {at::tensor({1, 4, 4}, at::kLong), at::tensor({1, 4, 8}, at::kLong),
                                         at::tensor({1, 4, 4}, at::kLong)};
  at::manual_seed(3);
  std::vector<at::Tensor> pixels;
  for (const auto& g : grids) pixels.push_back(at::randn({(g[1] * g[2]).item<int64_t>(), v.patch_dim()}));
  const int64_t s = 24;
  // rows: lists of conversations; each conversation of n tokens predicts n - 1 labels.
  auto make = [&](const std::vector<std::vector<int>>& rows) {
    const int64_t b = static_cast<int64_t>(rows.size());
    at::Tensor tokens = at::zeros({b, s}, at::kLong), labels = at::full({b, s}, -100, at::kLong),
               mask = at::zeros({b, s}, at::kFloat), pos = at::zeros({b, s}, at::kLong), doc = at::zeros({b, s}, at::kLong);
    std::vector<at::Tensor> px, gr;
    for (int64_t r = 0; r < b; ++r) {
      int64_t at_pos = 0, d = 0;
      for (int c : rows[static_cast<size_t>(r)]) {
        const auto& t = conv[static_cast<size_t>(c)];
        for (size_t k = 0; k < t.size(); ++k) {
          tokens[r][at_pos] = t[k];
          if (k + 1 < t.size()) labels[r][at_pos] = t[k + 1], mask[r][at_pos] = 1;
          pos[r][at_pos] = static_cast<int64_t>(k);
          doc[r][at_pos] = d;
          ++at_pos;
        }
        ++d;
        px.push_back(pixels[static_cast<size_t>(c)]);
        gr.push_back(grids[static_cast<size_t>(c)]);
      }
      for (int64_t k = at_pos; k < s; ++k) pos[r][k] = k - at_pos, doc[r][k] = d;  // padding: a document of its own
    }
    lf::data::Batch batch;
    batch.set("tokens", tokens, 1);
    batch.set("labels", labels, 1);
    batch.set("loss_mask", mask, 1);
    batch.set("pixel_values", at::cat(px), -1);
    batch.set("image_grid_thw", at::stack(gr), -1);
    if (rows[0].size() > 1) {
      batch.set("position_ids", pos, 1);
      batch.set("document_ids", doc, 1);
    }
    return batch;
  };
  auto run = [&](const lf::data::Batch& batch) {
    Qwen25Vl model(text, v, ids, lf::backend::cpu_backend(), 5, at::kFloat, nullptr, false, {});
    auto out = model.forward_step(batch, lf::models::Pass::train);
    out.losses.at(0).sum.backward();
    std::vector<at::Tensor> r{out.losses.at(0).sum.detach()};
    for (const auto& p : model.parameters()) r.push_back(p.tensor.grad());
    for (const auto& p : model.vision_parameters()) r.push_back(p.tensor.grad());
    return r;
  };
  const auto want = run(make({{0}, {1}, {2}})), got = run(make({{0, 1}, {2}}));
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(want[i].defined() && got[i].defined()) << "tensor " << i;
    EXPECT_LE(lf::testing::max_abs_diff(got[i], want[i]), 1e-5 * lf::testing::scale_of(want[i])) << "tensor " << i;
  }
  // The packed positions restart with the second conversation (its text at 0, 1, then its image).
  Qwen25Vl model(text, v, ids, lf::backend::cpu_backend(), 5, at::kFloat, nullptr, false, {});
  const auto packed = make({{0, 1}, {2}});
  lf::models::Qwen25VlMedia media;
  media.image_grid_thw = packed.at("image_grid_thw");
  const auto p = model.position_ids(packed.at("tokens"), media, packed.at("document_ids"));
  EXPECT_EQ(p[0][0][7].item<int64_t>(), 0);
  EXPECT_EQ(p[0][0][8].item<int64_t>(), 1);
  EXPECT_EQ(p[2][0][9].item<int64_t>(), 2);  // the image's first column
}

TEST(Qwen25Vl, Registered) {
  const auto* t = lf::models::Registry::builtin().composite("qwen2_5_vl");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->slots.size(), 2u);
  EXPECT_EQ(t->slots[0].name, "vision_encoder");
}

}  // namespace

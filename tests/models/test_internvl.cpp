// InternVL against transformers (tests/models/internvl_oracle.py, Python as an oracle only): a
// tiny random InternVLForConditionalGeneration (InternViT with q/k bias and RMSNorm and a final
// LayerNorm, the pixel-shuffle projector, a qwen2 language model) loaded from its state dict gives
// transformers' logits on a batch of image tiles, with vision_feature_layer -2 too, and on text;
// placeholder and tile mismatches are errors naming the counts.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/composites/internvl.h"
#include "loongforge/models/hf_vlm.h"
#include "cached_oracle.h"

namespace {
namespace fs = std::filesystem;
using lf::models::InternVisionConfig;
using lf::models::InternVl;
using lf::models::InternVlConfig;

const std::string& oracle_dir() {
  static const std::string dir = lf::testing::cached_oracle(
      lf::testing::source_dir() + "/tests/models/internvl_oracle.py", "internvl_oracle", "io.safetensors");
  return dir;
}

#define REQUIRE_ORACLE()                                                                                       \
  if (oracle_dir().empty()) GTEST_SKIP() << "transformers is not installed in " << lf::testing::venv_python(); \
  ASSERT_TRUE(fs::exists(oracle_dir() + "/io.safetensors"))

// The oracle's config.json (transformers' field names) -> ours.
std::unique_ptr<InternVl> oracle_model(int64_t feature_layer = -1) {
  const auto j = nlohmann::json::parse(lf::testing::read_text(oracle_dir() + "/config.json"));
  lf::models::DecoderConfig t;
  const auto& tj = j.at("text");
  t.num_layers = tj.at("num_hidden_layers");
  t.hidden_size = tj.at("hidden_size");
  t.ffn_hidden_size = tj.at("intermediate_size");
  t.num_attention_heads = tj.at("num_attention_heads");
  t.num_query_groups = tj.at("num_key_value_heads");
  t.group_query_attention = true;
  t.vocab_size = tj.at("vocab_size");
  t.max_position_embeddings = tj.at("max_position_embeddings");
  t.norm_epsilon = tj.at("rms_norm_eps");
  t.rotary_base = tj.at("rope_parameters").at("rope_theta");
  t.add_qkv_bias = true;  // qwen2
  t.untie_embeddings_and_output_weights = true;
  InternVisionConfig v;
  const auto& vj = j.at("vision");
  v.hidden_size = vj.at("hidden_size");
  v.num_hidden_layers = vj.at("num_hidden_layers");
  v.num_attention_heads = vj.at("num_attention_heads");
  v.intermediate_size = vj.at("intermediate_size");
  v.image_size = vj.at("image_size");
  v.patch_size = vj.at("patch_size");
  v.attention_bias = vj.at("attention_bias");
  v.use_qk_norm = vj.at("use_qk_norm");
  v.use_mean_pooling = vj.at("use_mean_pooling");
  v.layer_norm_eps = vj.at("layer_norm_eps");
  v.downsample_ratio = j.at("downsample_ratio");
  v.vision_feature_layer = feature_layer;
  v.out_hidden_size = t.hidden_size;
  InternVlConfig own;
  own.image_token_id = j.at("image_token_id");
  auto m = std::make_unique<InternVl>(t, v, own, lf::backend::cpu_backend(), 3, at::kFloat, nullptr, false,
                                      lf::models::PipelineStage{});
  m->load_hf_state(lf::testing::read_safetensors(oracle_dir() + "/weights.safetensors"), "Qwen2ForCausalLM");
  return m;
}

// max |ours - transformers'|: ours [s, b, v], theirs [b, s, v].
double difference(const at::Tensor& ours, const at::Tensor& theirs) {
  const auto want = theirs.transpose(0, 1);
  EXPECT_EQ(ours.sizes(), want.sizes());
  EXPECT_GT(want.abs().max().item<double>(), 0.05);
  return ours.sizes() == want.sizes() ? (ours - want).abs().max().item<double>() : 1e9;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const lf::Error& e) {
    return e.what();
  }
  return "";
}

// fp32 end to end: the differences are the order of floating-point sums; a wrong pixel-shuffle
// order, layer scale or norm is O(0.1).
constexpr double kTolerance = 1e-4;

TEST(InternVl, LogitsMatchTransformers) {
  REQUIRE_ORACLE();
  auto io = lf::testing::read_safetensors(oracle_dir() + "/io.safetensors");
  at::NoGradGuard no_grad;
  auto m = oracle_model();
  const double images = difference(m->logits(io.at("input_ids"), io.at("pixel_values")), io.at("logits"));
  const double text = difference(m->logits(io.at("text_ids"), at::Tensor()), io.at("text_logits"));
  // The same weights with the features taken from the second-to-last hidden state.
  const double layer = difference(oracle_model(-2)->logits(io.at("input_ids"), io.at("pixel_values")),
                                  io.at("logits_layer_m2"));
  // The two feature layers give different logits: the test sees which one is projected.
  const double apart = (io.at("logits") - io.at("logits_layer_m2")).abs().max().item<double>();
  std::printf("[internvl parity] max |logits - transformers|: images %.3g, vision_feature_layer -2 %.3g, text %.3g "
              "(the two feature layers %.3g apart)\n",
              images, layer, text, apart);
  EXPECT_LE(images, kTolerance);
  EXPECT_LE(layer, kTolerance);
  EXPECT_LE(text, kTolerance);
  EXPECT_GT(apart, 0.01);
}

// HF conversion: save_pretrained's directory reads as an internvl (the qwen2 language model by its
// text_config, the tower with the projector's top-level fields) whose tensors give transformers'
// logits; lf2hf writes every tensor bit for bit and a config.json that reads as the same model; the
// online load gives the same logits.
TEST(InternVl, HfConversionKeepsTheLogitsAndRoundTripsBitExact) {
  REQUIRE_ORACLE();
  namespace hf = lf::models::hf;
  const std::string dir = oracle_dir() + "/hf";
  ASSERT_TRUE(hf::is_vlm_hf_dir(dir));
  const hf::VlmHfModel m = hf::read_vlm_hf(dir);
  EXPECT_EQ(m.config.type, "internvl");
  EXPECT_TRUE(m.config.vision_intern.use_qk_norm);
  EXPECT_FALSE(m.config.vision_intern.use_mean_pooling);
  EXPECT_EQ(m.config.vision_intern.image_size, 56);
  EXPECT_EQ(m.config.own_intern.image_token_id, 190);
  EXPECT_TRUE(m.config.foundation.add_qkv_bias);  // qwen2, by text_config.model_type
  InternVl model(m.config.foundation, m.config.vision_intern, m.config.own_intern, lf::backend::cpu_backend(), 5,
                 at::kFloat, nullptr, false, {});
  hf::load_full_vlm(model, {m.tensors.begin(), m.tensors.end()});
  auto io = lf::testing::read_safetensors(oracle_dir() + "/io.safetensors");
  at::NoGradGuard no_grad;
  const double diff = difference(model.logits(io.at("input_ids"), io.at("pixel_values")), io.at("logits"));
  std::printf("[internvl conversion] hf2lf tensors: max |logits - transformers| = %.3g\n", diff);
  EXPECT_LE(diff, kTolerance);
  const std::string out = lf::testing::make_temp_dir("internvl-lf2hf");
  hf::WriteOptions fp32;
  fp32.dtype = at::kFloat;
  hf::write_vlm_hf(out, m.config, m.tensors, fp32);
  lf::testing::expect_same_safetensors(dir + "/model.safetensors", out + "/model.safetensors");
  const hf::VlmConfig again = hf::read_vlm_hf_config(out);
  EXPECT_EQ(again.type, "internvl");
  EXPECT_TRUE(hf::model_differences(again.foundation, m.config.foundation).empty());
  EXPECT_EQ(again.vision_intern.num_hidden_layers, m.config.vision_intern.num_hidden_layers);
  EXPECT_EQ(again.vision_intern.use_qk_norm, m.config.vision_intern.use_qk_norm);
  EXPECT_DOUBLE_EQ(again.vision_intern.downsample_ratio, m.config.vision_intern.downsample_ratio);
  InternVl online(m.config.foundation, m.config.vision_intern, m.config.own_intern, lf::backend::cpu_backend(), 9,
                  at::kFloat, nullptr, false, {});
  hf::load_vlm_hf_into(online, dir);
  EXPECT_LE(difference(online.logits(io.at("input_ids"), io.at("pixel_values")), io.at("logits")), kTolerance);
  // A tower configured otherwise is named before any weight is read.
  auto other = m.config.vision_intern;
  other.use_qk_norm = false;
  InternVl wrong(m.config.foundation, other, m.config.own_intern, lf::backend::cpu_backend(), 9, at::kFloat, nullptr,
                 false, {});
  const auto e = error_of([&] { hf::load_vlm_hf_into(wrong, dir); });
  EXPECT_NE(e.find("vision_encoder.use_qk_norm: model false, config.json true"), std::string::npos) << e;
}

TEST(InternVl, PlaceholderAndTileMismatchesAreErrors) {
  REQUIRE_ORACLE();
  auto io = lf::testing::read_safetensors(oracle_dir() + "/io.safetensors");
  auto m = oracle_model();
  at::NoGradGuard no_grad;
  auto e = error_of([&] { m->logits(io.at("input_ids"), io.at("pixel_values").narrow(0, 0, 2)); });
  EXPECT_NE(e.find("the tokens hold 12 image placeholders (model.image_token_id 190) but the 2 tile(s) make 8"),
            std::string::npos)
      << e;
  e = error_of([&] { m->logits(io.at("input_ids"), at::zeros({3, 3, 28, 28})); });
  EXPECT_NE(e.find("pixel_values must be [tiles, 3, 56, 56]"), std::string::npos) << e;
  e = error_of([&] { m->logits(io.at("input_ids"), at::Tensor()); });
  EXPECT_NE(e.find("but the batch has no pixel_values"), std::string::npos) << e;
  auto weights = lf::testing::read_safetensors(oracle_dir() + "/weights.safetensors");
  weights.erase("model.vision_tower.encoder.layer.1.lambda_2");
  e = error_of([&] { oracle_model()->load_hf_state(weights, "Qwen2ForCausalLM"); });
  EXPECT_NE(e.find("model.vision_tower.encoder.layer.1.lambda_2 is missing"), std::string::npos) << e;
}

}  // namespace

// FP8 block-quantized HF checkpoints (DeepSeek-V3's release format: config.json
// quantization_config {quant_method: fp8, weight_block_size}, each linear weight in
// float8_e4m3fn with a float32 <name>_scale_inv per block) read dequantized, against
// tests/models/hf_oracle.py's fp8_checkpoint: the tiny DeepSeek-V3 (MLA, MoE, MTP) quantized in
// 16 x 32 blocks, and transformers' logits with the dequantized weights. Broken inputs are
// lf::Errors naming the key or tensor.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/hf_adapter.h"
#include "models/hf_mapping.h"
#include "cached_oracle.h"
#include "hf_test_helpers.h"
#include "multiprocess.h"

namespace {
namespace fs = std::filesystem;
namespace hf = lf::models::hf;
using nlohmann::json;

const std::string& oracle_dir() {
  static const std::string dir = lf::testing::cached_oracle(
      lf::testing::source_dir() + "/tests/models/hf_oracle.py", "hf_oracle", "qwen3/logits.safetensors");
  return dir;
}

// A copy of the oracle's FP8 directory to break.
std::string copy_fp8(const std::string& tag) {
  const std::string d = lf::testing::make_temp_dir("hf_fp8_" + tag);
  fs::copy(oracle_dir() + "/deepseek_v3/hf_fp8", d, fs::copy_options::overwrite_existing | fs::copy_options::recursive);
  return d;
}

using lf::testing::edit_config;
using lf::testing::read_error;

// Rewrites model.safetensors with `edit` applied to its tensors.
void edit_weights(const std::string& dir, const std::function<void(std::map<std::string, at::Tensor>&)>& edit) {
  auto tensors = lf::testing::read_safetensors(dir + "/model.safetensors");
  edit(tensors);
  lf::testing::write_fp8_or_f32(dir + "/model.safetensors", tensors);
}

TEST(HfFp8, BlockQuantizedCheckpointReadsAsItsDequantizedWeights) {
  if (oracle_dir().empty()) GTEST_SKIP() << "transformers is not installed";
  const std::string d = oracle_dir() + "/deepseek_v3";
  ASSERT_TRUE(fs::exists(d + "/hf_fp8/config.json"));
  // Online (loongforge-train --load HF_DIR): into an fp32 model, the weights dequantized in fp32.
  lf::models::CausalLm decoder(hf::read_hf_config(d + "/hf_fp8"), lf::backend::cpu_backend(), 1, at::kFloat);
  decoder.set_training(false);
  hf::load_hf_into(decoder, d + "/hf_fp8");
  const auto want = lf::testing::read_safetensors(d + "/fp8_logits.safetensors");
  at::NoGradGuard no_grad;
  const at::Tensor got = decoder.forward(want.at("input_ids")).permute({1, 0, 2});
  ASSERT_EQ(got.sizes(), want.at("logits").sizes());
  const double diff = (got - want.at("logits")).abs().max().item<double>();
  // The same tolerance as the unquantized parity (fp32 reductions in another order). The FP8
  // rounding itself moves these logits by ~0.35 from the unquantized model's, and reading the
  // weights without their scales by far more.
  std::printf("[hf fp8] deepseek_v3 FP8 blocks: max |logits - transformers on the dequantized weights| = %.3g\n", diff);
  EXPECT_LE(diff, 1e-4);
  const double from_unquantized =
      (got - lf::testing::read_safetensors(d + "/logits.safetensors").at("logits")).abs().max().item<double>();
  EXPECT_GT(from_unquantized, 0.05);

  // hf2lf --dtype keep: the dequantized weights in bf16 (DeepSeek's fp8_cast_bf16), the others in
  // their files' dtype; with a dtype, that one.
  const auto keep = hf::read_hf(d + "/hf_fp8");
  hf::ReadOptions fp32;
  fp32.dtype = at::kFloat;
  const auto exact = hf::read_hf(d + "/hf_fp8", fp32);
  ASSERT_EQ(keep.tensors.size(), exact.tensors.size());
  int quantized = 0;
  for (size_t i = 0; i < keep.tensors.size(); ++i) {
    const auto& [name, t] = keep.tensors[i];
    SCOPED_TRACE(name);
    const bool linear = name.find("_proj") != std::string::npos || name.find("linear_fc") != std::string::npos;
    EXPECT_EQ(t.scalar_type(), linear ? at::kBFloat16 : at::kFloat);
    EXPECT_TRUE(at::equal(t, exact.tensors[i].second.to(t.scalar_type())));
    quantized += linear;
  }
  EXPECT_GT(quantized, 20);  // MLA's projections, experts, shared experts, dense MLP, MTP's eh_proj
  // In fp32 the weights are the oracle's dequantized ones, bit for bit.
  const auto plain = hf::read_hf(d + "/hf_fp8_dequantized");
  ASSERT_EQ(plain.tensors.size(), exact.tensors.size());
  for (size_t i = 0; i < plain.tensors.size(); ++i)
    EXPECT_TRUE(at::equal(plain.tensors[i].second, exact.tensors[i].second)) << plain.tensors[i].first;
  // The shapes listing (headers only) leaves the scales out, as the reader does: the FP8
  // directory lists what the dequantized one holds.
  const auto shapes = hf::read_hf_weight_shapes(d + "/hf_fp8");
  EXPECT_EQ(shapes, hf::read_hf_weight_shapes(d + "/hf_fp8_dequantized"));
  EXPECT_GT(shapes.size(), 20u);
}

TEST(HfFp8, QuantizationMistakesNameTheKeyOrTensor) {
  if (oracle_dir().empty()) GTEST_SKIP() << "transformers is not installed";
  // Another quantization method.
  std::string d = copy_fp8("gptq");
  edit_config(d, [](json& j) { j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}}; });
  std::string e = read_error(d);
  EXPECT_MENTIONS(e, "quant_method is 'gptq'");
  EXPECT_MENTIONS(e, "config.json");
  // FP8 without blocks (per-tensor scales).
  d = copy_fp8("noblock");
  edit_config(d, [](json& j) { j["quantization_config"].erase("weight_block_size"); });
  EXPECT_MENTIONS(read_error(d), "weight_block_size");
  // FP8 weights, but config.json says nothing of it.
  d = copy_fp8("noconfig");
  edit_config(d, [](json& j) { j.erase("quantization_config"); });
  e = read_error(d);
  EXPECT_MENTIONS(e, "FP8 tensor");
  EXPECT_MENTIONS(e, "quantization_config");
  // Blocks that do not match the scales' shapes.
  d = copy_fp8("blocks");
  edit_config(d, [](json& j) { j["quantization_config"]["weight_block_size"] = {16, 16}; });
  e = read_error(d);
  EXPECT_MENTIONS(e, "_scale_inv");
  EXPECT_MENTIONS(e, "weight_block_size");
  // Static activation scales (inference kernels' input_scale tensors).
  d = copy_fp8("static");
  edit_config(d, [](json& j) { j["quantization_config"]["activation_scheme"] = "static"; });
  EXPECT_MENTIONS(read_error(d), "activation_scheme");
  // A weight's scales missing; a scale without its weight.
  d = copy_fp8("noscale");
  edit_weights(d, [](auto& t) { t.erase("model.layers.0.self_attn.o_proj.weight_scale_inv"); });
  EXPECT_MENTIONS(read_error(d), "'model.layers.0.self_attn.o_proj.weight_scale_inv' is missing");
  d = copy_fp8("stray");
  edit_weights(d, [](auto& t) { t["model.layers.0.self_attn.foo.weight_scale_inv"] = at::ones({1, 1}); });
  EXPECT_MENTIONS(read_error(d), "model.layers.0.self_attn.foo.weight_scale_inv");
}

}  // namespace

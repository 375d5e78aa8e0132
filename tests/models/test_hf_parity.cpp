// HF conversion against HF transformers (tests/models/hf_oracle.py, Python as an oracle only):
// tiny random llama / qwen2 / qwen3 models built and saved by transformers, read by the HF adapter
// (models/hf_adapter.h), loaded into lf::models::CausalLm at TP=1 and TP=2: our logits equal
// transformers' fp32 logits within 1e-4. Exporting what we read (library, and loongforge-convert
// hf2lf at TP=2 + lf2hf) reproduces every tensor bit for bit (fp32 and bf16, sharded) and
// transformers loads the export with the same logits. Broken
// inputs (missing shard, shapes that contradict config.json, unknown architecture, unsupported
// config values, stray tensors) are lf::Errors naming the file and tensor (these and the
// fused-layout test run without Python).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "../parallel/tp_testing.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/models/blocks/mla.h"
#include "loongforge/models/blocks/moe.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/hf_adapter.h"
#include "cached_oracle.h"
#include "hf_test_helpers.h"
#include "multiprocess.h"
#include "tiny_decoder.h"

namespace {
namespace fs = std::filesystem;
namespace hf = lf::models::hf;
using nlohmann::json;

const char* kFamilies[] = {"llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "deepseek_v2", "deepseek_v32"};

std::string python() { return lf::testing::venv_python(); }
std::string oracle_script() { return lf::testing::source_dir() + "/tests/models/hf_oracle.py"; }

using lf::testing::read_text;

const std::string& oracle_dir() {
  static const std::string dir = lf::testing::cached_oracle(oracle_script(), "hf_oracle", "qwen3/logits.safetensors");
  return dir;
}

#define REQUIRE_ORACLE()                                                                  \
  if (oracle_dir().empty()) GTEST_SKIP() << "transformers is not installed in " << python(); \
  ASSERT_TRUE(fs::exists(oracle_dir() + "/qwen3/logits.safetensors"))

at::Tensor read_tensor(const std::string& file, const std::string& name) {
  auto r = lf::safetensors::Reader::open(file);
  const auto& info = r.at(name);
  auto dtype = info.dtype == lf::safetensors::DType::I64 ? at::kLong : at::kFloat;
  auto t = at::empty(info.shape, at::TensorOptions().dtype(dtype));
  std::memcpy(t.data_ptr(), r.data(info), info.end - info.begin);
  return t;
}

// max |the model's logits - the oracle's| on the oracle's input_ids for the family directory d:
// the main logits, or (mtp) the first MTP layer's against the oracle's `mtp_logits`.
double oracle_difference(const lf::models::CausalLm& m, const std::string& d, bool mtp = false) {
  auto ids = read_tensor(d + "/logits.safetensors", "input_ids");
  auto want = read_tensor(d + "/logits.safetensors", mtp ? "mtp_logits" : "logits");
  at::NoGradGuard no_grad;
  auto got = (mtp ? m.mtp_logits(ids).at(0) : m.forward(ids)).permute({1, 0, 2});  // [s, b, v] -> [b, s, v]
  EXPECT_EQ(got.sizes(), want.sizes());
  EXPECT_GT(want.abs().max().item<double>(), 0.1);  // a real signal, not all zeros
  if (got.sizes() != want.sizes()) return 1e9;
  return lf::testing::max_abs_diff(got, want);
}

// Runs worker case `name` on 2 ranks with the oracle's directory and echoes its [hf parity] lines.
void run_parity_workers(const char* name) {
  auto results = lf::testing::run_workers(name, {.world_size = 2, .args = {oracle_dir()}});
  lf::testing::expect_all_ok(results);
  for (const auto& r : results)
    for (size_t at = r.output.find("[hf parity]"); at != std::string::npos; at = r.output.find("[hf parity]", at + 1))
      std::printf("%s\n", r.output.substr(at, r.output.find('\n', at) - at).c_str());
}

// Our logits for the oracle's input ids, [b, s, vocab] like transformers'; returns max |ours - HF|.
double logits_difference(const std::string& family, const lf::dist::ParallelContext* ctx) {
  const std::string d = oracle_dir() + "/" + family;
  // As a program loading an HF directory does: the model from config.json, then its weights.
  lf::models::CausalLm decoder(hf::read_hf_config(d + "/hf"), lf::backend::cpu_backend(), 1,
                              at::kFloat, ctx);
  decoder.set_training(false);
  hf::load_hf_into(decoder, d + "/hf");
  return oracle_difference(decoder, d);
}

// fp32 end to end; the only differences are the order of floating-point reductions (fused
// RMSNorm, SDPA vs eager attention, TP partial sums): ~1e-6 on O(1) logits. A wrong layout,
// bias, norm or RoPE is O(0.1) or more.
constexpr double kTolerance = 1e-4;


TEST(HfParity, LogitsMatchTransformers) {
  REQUIRE_ORACLE();
  for (const char* family : kFamilies) {
    const double diff = logits_difference(family, nullptr);
    std::printf("[hf parity] %s TP=1: max |logits - transformers| = %.3g\n", family, diff);
    RecordProperty(std::string(family) + "_tp1_max_abs_diff", std::to_string(diff));
    EXPECT_LE(diff, kTolerance) << family;
  }
}

LF_WORKER_CASE(hf_parity_tp2) {
  const std::string dir = lf::testing::worker_args().at(0);
  auto ctx = lf::testing::make_context(2);
  for (const char* family : kFamilies) {
    // DSA (deepseek_v32) runs at TP 1 only (DecoderConfig::validate_layout); EP 2 below covers it.
    if (std::string(family) == "deepseek_v32") continue;
    // oracle_dir() is this process's; the parent's directory comes as an argument.
    const std::string d = dir + "/" + family;
    // The full tensors (vocabulary padded for TP 2) into this rank's shards.
    hf::ReadOptions ro;
    ro.vocab_tp = 2;
    auto m = hf::read_hf(d + "/hf", ro);
    lf::models::CausalLm decoder(m.config, lf::backend::cpu_backend(), 1, at::kFloat, ctx.get());
    decoder.set_training(false);
    decoder.load_full_parameters({m.tensors.begin(), m.tensors.end()});
    const double diff = oracle_difference(decoder, d);
    std::printf("[hf parity] %s TP=2 rank %d: max |logits - transformers| = %.3g\n", family,
                lf::testing::worker_rank(), diff);
    EXPECT_LE(diff, kTolerance) << family;
    if (m.config.mtp_num_layers > 0) {  // DeepSeek-V3's MTP layer: its column-parallel eh_proj
      const double mtp = oracle_difference(decoder, d, /*mtp=*/true);
      std::printf("[hf parity] %s MTP layer TP=2 rank %d: max |logits - reference| = %.3g\n", family,
                  lf::testing::worker_rank(), mtp);
      EXPECT_LE(mtp, kTolerance) << family;
    }
  }
}

TEST(HfParity, LogitsMatchTransformersAtTp2) {
  REQUIRE_ORACLE();
  run_parity_workers("hf_parity_tp2");
}

// DeepSeek-V3's multi-token prediction layer (transformers has none: the oracle computes it from
// transformers' DeepseekV3DecoderLayer, RMSNorm and rotary embedding as DeepSeek-V3 defines it) on
// the converted weights (at TP 2: hf_parity_tp2).
TEST(HfParity, DeepseekV3MtpLayerMatchesReference) {
  REQUIRE_ORACLE();
  const std::string d = oracle_dir() + "/deepseek_v3";
  lf::models::CausalLm decoder(hf::read_hf_config(d + "/hf"), lf::backend::cpu_backend(), 1, at::kFloat);
  ASSERT_EQ(decoder.config().mtp_num_layers, 1);
  decoder.set_training(false);
  hf::load_hf_into(decoder, d + "/hf");
  const double diff = oracle_difference(decoder, d, /*mtp=*/true);
  std::printf("[hf parity] deepseek_v3 MTP layer: max |logits - reference| = %.3g\n", diff);
  EXPECT_LE(diff, kTolerance);
}

// The MoE families under expert parallelism: EP = 2 over two data-parallel ranks (expert TP 1),
// each rank holding half of every MoE layer's experts, with both token dispatchers; the same
// logits as transformers (the dispatch only moves rows).
LF_WORKER_CASE(hf_parity_ep2) {
  const std::string dir = lf::testing::worker_args().at(0);
  auto ctx = lf::testing::make_context(1);
  auto experts = lf::testing::make_expert_context(1, 2);
  for (const char* family : {"qwen3_moe", "deepseek_v3", "deepseek_v2", "deepseek_v32"}) {
    const std::string d = dir + "/" + family;
    auto m = hf::read_hf(d + "/hf", {});
    for (bool allgather : {false, true}) {
      lf::models::CausalLm decoder(m.config, lf::backend::cpu_backend(), 1, at::kFloat, ctx.get(), false,
                                   lf::models::PipelineStage{}, true, {experts.get(), allgather});
      decoder.set_training(false);
      decoder.load_full_parameters({m.tensors.begin(), m.tensors.end()});
      // This rank holds half the experts.
      for (const auto& p : decoder.parameters()) {
        if (p.expert) {
          ASSERT_EQ(p.tensor.size(0) * 2, p.full_shape()[0]) << p.name;
        }
      }
      const double diff = oracle_difference(decoder, d);
      std::printf("[hf parity] %s EP=2 (%s) rank %d: max |logits - transformers| = %.3g\n", family,
                  allgather ? "all-gather" : "all-to-all", lf::testing::worker_rank(), diff);
      EXPECT_LE(diff, kTolerance) << family;
    }
  }
}

TEST(HfParity, MoeLogitsMatchTransformersAtEp2) {
  REQUIRE_ORACLE();
  run_parity_workers("hf_parity_ep2");
}

// DeepSeek-V3's MoE block as transformers computes it (DeepseekV3MoE: sigmoid scores, 4 groups of
// 2 experts with the top 2 groups allowed, the score-correction bias for the choice only, top 4,
// renormalised and scaled by 2.5, one shared expert) with random weights: our MoeLayer with the
// same weights gives the same output. Group scores: transformers sums each group's top 2, Megatron
// its top topk / group_topk (= 2 here, as for DeepSeek-V3's 8 / 4).
TEST(HfParity, DeepseekV3MoeBlockMatchesTransformers) {
  REQUIRE_ORACLE();
  const std::string f = oracle_dir() + "/moe_blocks/deepseek_v3.safetensors";
  auto t = [&](const char* name) { return read_tensor(f, name); };
  lf::models::MoeConfig c;
  c.hidden_size = 32;
  c.num_experts = 8;
  c.ffn_hidden_size = 16;
  c.topk = 4;
  c.score_function = "sigmoid";
  c.num_groups = 4;
  c.group_topk = 2;
  c.scaling_factor = 2.5;
  c.expert_bias = true;
  c.shared_ffn_hidden_size = 16;
  lf::models::ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(1), at::kFloat, c10::Device(c10::kCPU), {});
  lf::models::MoeLayer layer(b, "mlp", c);
  std::map<std::string, at::Tensor> want{
      {"mlp.router.weight", t("gate.weight")},
      {"mlp.router.expert_bias", t("gate.e_score_correction_bias")},
      {"mlp.experts.linear_fc1.weight", t("experts.gate_up_proj")},
      {"mlp.experts.linear_fc2.weight", t("experts.down_proj")},
      {"mlp.shared_experts.linear_fc1.weight",
       at::cat({t("shared_experts.gate_proj.weight"), t("shared_experts.up_proj.weight")}, 0)},
      {"mlp.shared_experts.linear_fc2.weight", t("shared_experts.down_proj.weight")}};
  auto params = b.take();
  ASSERT_EQ(params.size(), want.size());
  {
    at::NoGradGuard no_grad;
    for (auto& p : params) {
      ASSERT_TRUE(want.count(p.name)) << p.name;
      ASSERT_EQ(p.tensor.sizes(), want.at(p.name).sizes()) << p.name;
      p.tensor.copy_(want.at(p.name));
    }
  }
  at::NoGradGuard no_grad;
  lf::parallel::TensorParallel tp;
  auto x = t("x").transpose(0, 1).contiguous();  // [b, s, h] -> our [s, b, h]
  auto y = layer.forward(lf::backend::cpu_backend(), tp, x, false, false, nullptr, 0, 1).transpose(0, 1);
  const double diff = (y - t("y")).abs().max().item<double>();
  std::printf("[hf parity] DeepseekV3MoE block: max |ours - transformers| = %.3g\n", diff);
  EXPECT_GT(t("y").abs().max().item<double>(), 0.1);
  EXPECT_LE(diff, 1e-5);
}

// Multi-latent attention as transformers computes it (DeepseekV3Attention), with and without the
// query bottleneck: YaRN RoPE (factor 4 over 32 original positions, mscale 1 against
// mscale_all_dim 0.5, so both the tables' attention factor and the softmax scale differ from 1),
// interleaved rotary dims, causal over 9 positions. The config path is the decoder's: the RoPE
// tables from rope_spec(DecoderConfig), the softmax scale from DecoderConfig::softmax_scale().
TEST(HfParity, DeepseekV3MlaBlockMatchesTransformers) {
  REQUIRE_ORACLE();
  for (const std::string tag : {"q_lora", "no_q_lora"}) {
    SCOPED_TRACE(tag);
    const std::string f = oracle_dir() + "/moe_blocks/mla_" + tag + ".safetensors";
    auto t = [&](const char* name) { return read_tensor(f, name); };
    lf::models::DecoderConfig c = lf::testing::tiny_decoder_config();
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.norm_epsilon = 1e-6;
    c.max_position_embeddings = 128;
    c.multi_latent_attention = true;
    c.q_lora_rank = tag == "q_lora" ? 24 : 0;
    c.kv_lora_rank = 16;
    c.qk_head_dim = 16;
    c.qk_pos_emb_head_dim = 8;
    c.v_head_dim = 12;
    c.rope_type = "yarn";
    c.rotary_scaling_factor = 4;
    c.mscale = 1.0;
    c.mscale_all_dim = 0.5;
    c.rope_scaling_original_max_position_embeddings = 32;
    c.rotary_interleaved = true;
    lf::models::MlaConfig m{c.hidden_size, c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_head_dim,
                            c.qk_pos_emb_head_dim, c.v_head_dim, c.norm_epsilon, c.softmax_scale(),
                            c.rotary_interleaved, 0.02, 0.02};
    lf::models::ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(1), at::kFloat, c10::Device(c10::kCPU), {});
    lf::models::MlaAttention block(b, "attn", m);
    std::map<std::string, std::string> hf_name{{"attn.linear_q_proj.weight", "q_proj.weight"},
                                               {"attn.linear_q_down_proj.weight", "q_a_proj.weight"},
                                               {"attn.q_layernorm.weight", "q_a_layernorm.weight"},
                                               {"attn.linear_q_up_proj.weight", "q_b_proj.weight"},
                                               {"attn.linear_kv_down_proj.weight", "kv_a_proj_with_mqa.weight"},
                                               {"attn.kv_layernorm.weight", "kv_a_layernorm.weight"},
                                               {"attn.linear_kv_up_proj.weight", "kv_b_proj.weight"},
                                               {"attn.linear_proj.weight", "o_proj.weight"}};
    auto params = b.take();
    ASSERT_EQ(params.size(), tag == "q_lora" ? 7u : 5u);
    {
      at::NoGradGuard no_grad;
      for (auto& p : params) {
        ASSERT_TRUE(hf_name.count(p.name)) << p.name;
        auto w = t(hf_name.at(p.name).c_str());
        ASSERT_EQ(p.tensor.sizes(), w.sizes()) << p.name;
        p.tensor.copy_(w);
      }
    }
    at::NoGradGuard no_grad;
    lf::models::AttentionInputs in;
    std::tie(in.cos, in.sin) = lf::models::rope_tables(lf::models::rope_spec(c), 0, 9, at::TensorOptions().dtype(at::kFloat));
    lf::parallel::TensorParallel tp;
    auto x = t("x").transpose(0, 1).contiguous();  // [s, b, h]
    auto y = block.forward(lf::backend::cpu_backend(), tp, x, in, 0).transpose(0, 1);
    const double diff = (y - t("y")).abs().max().item<double>();
    std::printf("[hf parity] DeepseekV3Attention (MLA, YaRN, %s): max |ours - transformers| = %.3g\n", tag.c_str(), diff);
    EXPECT_GT(t("y").abs().max().item<double>(), 0.1);
    EXPECT_LE(diff, 1e-5);
  }
}

// name -> (dtype, shape, bytes) of every tensor of an HF directory.
using Contents = std::map<std::string, std::tuple<std::string, std::vector<int64_t>, std::string>>;
Contents contents(const std::string& dir) {
  Contents out;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() != ".safetensors") continue;
    auto r = lf::safetensors::Reader::open(f.path().string());
    for (const auto& t : r.tensors()) {
      std::string bytes(reinterpret_cast<const char*>(r.data(t)), t.end - t.begin);
      EXPECT_TRUE(out.emplace(t.name, std::make_tuple(std::string(lf::safetensors::dtype_name(t.dtype)),
                                                      t.shape, std::move(bytes))).second)
          << t.name << " twice in " << dir;
    }
  }
  return out;
}

void expect_same_tensors(const std::string& src, const std::string& dst) {
  auto want = contents(src), got = contents(dst);
  ASSERT_EQ(got.size(), want.size()) << dst;
  for (const auto& [name, value] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    EXPECT_EQ(std::get<0>(it->second), std::get<0>(value)) << name;
    EXPECT_EQ(std::get<1>(it->second), std::get<1>(value)) << name;
    EXPECT_TRUE(std::get<2>(it->second) == std::get<2>(value)) << name << " differs in " << dst;
  }
}

// lf2hf(hf2lf(x)) == x for transformers' own files, through the library (read_hf + write_hf)
// and through the programs (loongforge-convert hf2lf at TP=2 into a native checkpoint, lf2hf
// back); transformers loads the program's export with identical logits.
TEST(HfRoundTrip, ExportReproducesEveryTensorAndLoadsInTransformers) {
  REQUIRE_ORACLE();
  const std::string convert = lf::testing::binary_dir() + "/bin/loongforge-convert";
  const std::string out = lf::testing::make_temp_dir("hf_roundtrip");
  std::vector<std::string> oracle_args{python(), oracle_script(), "logits"};
  for (const char* family : kFamilies) {
    for (const std::string variant : {"hf", "hf_bf16"}) {
      SCOPED_TRACE(std::string(family) + "/" + variant);
      const std::string src = oracle_dir() + "/" + family + "/" + variant;
      const std::string dtype = variant == "hf" ? "fp32" : "bf16";
      // Library.
      auto m = hf::read_hf(src);  // the files' dtype is kept
      hf::WriteOptions wo;
      wo.dtype = variant == "hf" ? at::kFloat : at::kBFloat16;
      wo.max_shard_bytes = 40'000;  // several shards + an index
      const std::string lib = out + "/" + family + "_" + variant + "_lib";
      hf::write_hf(lib, m.config, m.tensors, wo);
      EXPECT_TRUE(fs::exists(lib + "/model.safetensors.index.json"));
      expect_same_tensors(src, lib);
      EXPECT_EQ(hf::model_section_yaml(hf::read_hf_config(lib)), hf::model_section_yaml(m.config));
      // Programs.
      const std::string ckpt = out + "/" + family + "_" + variant + "_ckpt",
                        prog = out + "/" + family + "_" + variant + "_prog";
      auto r = lf::testing::run_command({convert, "hf2lf", "--hf-dir", src, "--out", ckpt, "--tp", "2"});
      ASSERT_TRUE(r.ok()) << r.output;
      r = lf::testing::run_command({convert, "lf2hf", "--load", ckpt, "--out", prog, "--dtype", dtype});
      ASSERT_TRUE(r.ok()) << r.output;
      expect_same_tensors(src, prog);
      if (variant == "hf")
        for (const std::string& s : {prog, oracle_dir() + "/" + family + "/logits.safetensors",
                                     out + "/" + family + "_logits.safetensors"})
          oracle_args.push_back(s);
    }
  }
  auto r = lf::testing::run_command(oracle_args, {}, std::chrono::seconds(240));
  ASSERT_TRUE(r.ok()) << r.output;
  for (const char* family : kFamilies) {
    auto want = read_tensor(oracle_dir() + "/" + family + "/logits.safetensors", "logits");
    auto got = read_tensor(out + "/" + family + "_logits.safetensors", "logits");
    // Bit-identical weights through the same transformers code: identical logits.
    EXPECT_EQ(lf::testing::max_abs_diff(got, want), 0.0) << family;
  }
}

// A model directory to break, independent of Python: the family's tiny preset with random
// weights, written by the adapter (llama sharded with an index, the others one file).
std::string copy_model(const std::string& family, const std::string& tag) {
  auto node = lf::config::parse_yaml_file(lf::testing::source_dir() + "/configs/models/" + family +
                                          "/tiny.yaml");
  auto c = lf::config::load<lf::models::DecoderConfig>(node, "model.foundation");
  lf::models::CausalLm model(c, lf::backend::cpu_backend(), 9, at::kFloat);
  hf::NamedTensors full;
  for (const auto& p : model.parameters()) full.emplace_back(p.name, p.tensor.detach());
  const std::string d = lf::testing::make_temp_dir("hf_broken_" + tag);
  hf::WriteOptions wo;
  wo.dtype = at::kFloat;
  if (family == "llama") wo.max_shard_bytes = 20'000;
  hf::write_hf(d, c, full, wo);
  return d;
}

using lf::testing::edit_config;
using lf::testing::read_error;

TEST(HfErrors, MissingShardNamesTheFile) {
  const std::string d = copy_model("llama", "shard");  // sharded: model-0000i-of-0000n + index
  EXPECT_TRUE(hf::is_hf_model_dir(d));
  EXPECT_FALSE(hf::is_hf_model_dir(d + "/nowhere"));
  json index;
  std::ifstream(d + "/model.safetensors.index.json") >> index;
  const std::string shard = index["weight_map"]["model.layers.1.mlp.up_proj.weight"];
  ASSERT_NE(shard, "model-00001-of-00001.safetensors");
  fs::remove(d + "/" + shard);
  const std::string e = read_error(d);
  EXPECT_MENTIONS(e, shard);
  EXPECT_MENTIONS(e, "model.safetensors.index.json");
}

TEST(HfErrors, ShapesThatContradictConfigNameTheTensor) {
  const std::string d = copy_model("qwen3", "shape");
  edit_config(d, [](json& j) { j["intermediate_size"] = 128; });  // tiny: 176
  const std::string e = read_error(d);
  EXPECT_MENTIONS(e, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_MENTIONS(e, "[176, 64]");
  EXPECT_MENTIONS(e, "[128, 64]");
  EXPECT_MENTIONS(e, "model.safetensors");
}

TEST(HfErrors, UnknownArchitectureNamesConfigAndKnownFamilies) {
  const std::string d = copy_model("qwen2", "arch");
  edit_config(d, [](json& j) {
    j["architectures"] = {"FooForCausalLM"};
    j["model_type"] = "foo";
  });
  const std::string e = read_error(d);
  EXPECT_MENTIONS(e, "FooForCausalLM");
  EXPECT_MENTIONS(e, "config.json");
  EXPECT_MENTIONS(e, "Qwen3ForCausalLM");
}

TEST(HfErrors, UnsupportedConfigValuesAndStrayTensors) {
  const std::string a = copy_model("qwen3", "bias");
  edit_config(a, [](json& j) { j["attention_bias"] = true; });
  EXPECT_MENTIONS(read_error(a), "attention_bias");
  const std::string r = copy_model("qwen2", "rope");
  edit_config(r, [](json& j) { j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}}; });
  EXPECT_MENTIONS(read_error(r), "dynamic");
  // One layer fewer in config.json than in the weights: layer 1's tensors have no place.
  const std::string l = copy_model("llama", "layers");
  edit_config(l, [](json& j) { j["num_hidden_layers"] = 1; });
  EXPECT_MENTIONS(read_error(l), "model.layers.1.");
  // No weights at all.
  const std::string n = copy_model("qwen2", "none");
  fs::remove(n + "/model.safetensors");
  EXPECT_MENTIONS(read_error(n), "no model.safetensors");
}

std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "'" << from << "' not in the mapping";
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

// Fused HF layouts (one qkv_proj = [q; k; v], one gate_up_proj = [gate; up], as e.g. Phi-3 stores
// them) are data too: a mapping declaring them exports and imports the model's tensors exactly,
// and its fused tensors are the unfused family's tensors stacked.
TEST(HfMapping, FusedQkvAndGateUpAreData) {
  const std::string root = lf::testing::make_temp_dir("hf_fused_configs");
  const std::string llama = read_text(lf::testing::source_dir() + "/configs/models/llama/hf.yaml");
  std::string fused = replace_once(llama, "architecture: LlamaForCausalLM", "architecture: FusedLlama");
  fused = replace_once(fused, "model_type: llama", "model_type: fused_llama");
  const std::string unfused_qkv =
      "      - {name: model.layers.<i>.self_attn.q_proj.weight, shape: [nq*d, h]}\n"
      "      - {name: model.layers.<i>.self_attn.k_proj.weight, shape: [nkv*d, h]}\n"
      "      - {name: model.layers.<i>.self_attn.v_proj.weight, shape: [nkv*d, h]}\n";
  fused = replace_once(fused, unfused_qkv,
                       "      - {name: model.layers.<i>.self_attn.qkv_proj.weight, shape: [nq*d + 2*nkv*d, h]}\n");
  fused = replace_once(fused,
                       "      - {name: model.layers.<i>.mlp.gate_proj.weight, shape: [f, h]}\n"
                       "      - {name: model.layers.<i>.mlp.up_proj.weight, shape: [f, h]}\n",
                       "      - {name: model.layers.<i>.mlp.gate_up_proj.weight, shape: [2*f, h]}\n");
  for (const auto& [family, text] : {std::pair{"llama", llama}, std::pair{"fused", fused}}) {
    fs::create_directories(root + "/models/" + family);
    std::ofstream(root + "/models/" + family + "/hf.yaml") << text;
  }
  auto c = lf::testing::tiny_decoder_config();
  c.make_vocab_size_divisible_by = 128;  // the default: 50 rows padded to 128
  c.untie_embeddings_and_output_weights = true;
  lf::models::CausalLm model(c, lf::backend::cpu_backend(), 5, at::kFloat);
  hf::NamedTensors full;
  for (const auto& p : model.parameters()) full.emplace_back(p.name, p.tensor.detach().clone());
  const std::string out = lf::testing::make_temp_dir("hf_fused");
  for (const char* arch : {"LlamaForCausalLM", "FusedLlama"}) {
    hf::WriteOptions wo;
    wo.configs_root = root;
    wo.architecture = arch;
    wo.dtype = at::kFloat;
    hf::write_hf(out + "/" + arch, c, full, wo);
    hf::ReadOptions ro;
    ro.configs_root = root;
    auto back = hf::read_hf(out + "/" + arch, ro);
    EXPECT_EQ(back.architecture, arch);
    ASSERT_EQ(back.tensors.size(), full.size());
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_EQ(back.tensors[i].first, full[i].first);
      EXPECT_TRUE(at::equal(back.tensors[i].second, full[i].second)) << arch << " " << full[i].first;
    }
  }
  const std::string a = out + "/LlamaForCausalLM/model.safetensors",
                    b = out + "/FusedLlama/model.safetensors";
  for (const std::string layer : {"model.layers.0.", "model.layers.1."}) {
    auto qkv = read_tensor(b, layer + "self_attn.qkv_proj.weight");
    EXPECT_TRUE(at::equal(qkv, at::cat({read_tensor(a, layer + "self_attn.q_proj.weight"),
                                        read_tensor(a, layer + "self_attn.k_proj.weight"),
                                        read_tensor(a, layer + "self_attn.v_proj.weight")})));
    auto gate_up = read_tensor(b, layer + "mlp.gate_up_proj.weight");
    EXPECT_TRUE(at::equal(gate_up, at::cat({read_tensor(a, layer + "mlp.gate_proj.weight"),
                                            read_tensor(a, layer + "mlp.up_proj.weight")})));
  }
  // Ours is the per-group interleaved layout, not HF's [q; k; v]: the two differ.
  EXPECT_FALSE(at::equal(full[2].second, read_tensor(b, "model.layers.0.self_attn.qkv_proj.weight")))
      << full[2].first;
}

// Loading an HF directory into a decoder configured for another model is an error listing every
// difference, raised before any weight is read.
TEST(HfErrors, LoadIntoAMismatchedDecoderListsTheDifferences) {
  const std::string d = copy_model("qwen3", "mismatch");
  auto c = hf::read_hf_config(d);
  c.ffn_hidden_size = 128;
  c.norm_epsilon = 1e-5;
  lf::models::CausalLm decoder(c, lf::backend::cpu_backend(), 1, at::kFloat);
  try {
    hf::load_hf_into(decoder, d);
    ADD_FAILURE() << "no error";
  } catch (const lf::Error& e) {
    const std::string what = e.what();
    EXPECT_MENTIONS(what, "ffn_hidden_size: model 128, config.json 176");
    EXPECT_MENTIONS(what, "norm_epsilon");
  }
  // The matching decoder loads, and holds the file's weights.
  lf::models::CausalLm ok(hf::read_hf_config(d), lf::backend::cpu_backend(), 1, at::kFloat);
  hf::load_hf_into(ok, d);
  auto m = hf::read_hf(d);
  for (size_t i = 0; i < m.tensors.size(); ++i)
    EXPECT_TRUE(at::equal(ok.parameters()[i].tensor.detach(), m.tensors[i].second))
        << m.tensors[i].first;
}

// Rewrites dir/model.safetensors with `extra` added and `drop` left out.
void rewrite_weights(const std::string& dir, const std::string& drop,
                     const std::vector<std::pair<std::string, at::Tensor>>& extra) {
  const std::string path = dir + "/model.safetensors";
  std::string bytes = read_text(path);  // the Writer below must not read the file it replaces
  auto r = lf::safetensors::Reader::from_bytes(bytes, path);
  lf::safetensors::Writer w;
  for (const auto& t : r.tensors())
    if (t.name != drop) w.add(t.name, t.dtype, t.shape, r.data(t));
  for (const auto& [name, t] : extra)
    w.add(name, lf::safetensors::DType::F32, t.sizes().vec(), t.data_ptr());
  w.write(path);
}

// A tied model whose file nevertheless stores lm_head.weight (some exports do) reads fine; an
// untied one without it is an error naming the tensor.
TEST(HfErrors, TiedLmHeadIgnoredMissingTensorNamed) {
  const std::string tied = copy_model("qwen3", "tied");  // tiny qwen3: tied embeddings
  auto before = hf::read_hf(tied);
  auto head = at::randn({256, 64});
  rewrite_weights(tied, "", {{"lm_head.weight", head}});
  auto after = hf::read_hf(tied);
  ASSERT_EQ(after.tensors.size(), before.tensors.size());
  EXPECT_FALSE(after.config.untie_embeddings_and_output_weights);
  const std::string untied = copy_model("qwen2", "untied");  // tiny qwen2: untied
  rewrite_weights(untied, "lm_head.weight", {});
  const std::string e = read_error(untied);
  EXPECT_MENTIONS(e, "lm_head.weight");
  EXPECT_MENTIONS(e, "output_layer.weight");
  EXPECT_MENTIONS(e, "missing");
}

// config.json keys: transformers 4 style (rope_theta + rope_scaling) as published checkpoints
// have them, and transformers 5 style (rope_parameters) as the oracle writes them.
TEST(HfConfig, ReadsBothRopeStylesAndExportsWhatItReads) {
  const std::string d = lf::testing::make_temp_dir("hf_config");
  std::ofstream(d + "/config.json") << R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false,
    "attention_bias": false, "mlp_bias": false, "hidden_act": "silu",
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})";
  auto c = hf::read_hf_config(d);
  EXPECT_EQ(c.num_parameters(), 8'030'261'248);  // Llama-3.1-8B
  EXPECT_TRUE(c.rope_scaling);
  EXPECT_DOUBLE_EQ(c.rotary_base, 500000.0);
  EXPECT_EQ(c.rope_scaling_original_max_position_embeddings, 8192);
  EXPECT_TRUE(c.untie_embeddings_and_output_weights);
  EXPECT_DOUBLE_EQ(c.norm_epsilon, 1e-5);
  auto j = json::parse(hf::hf_config_json(c, hf::mapping_for_config(c), at::kBFloat16));
  EXPECT_EQ(j["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["num_key_value_heads"], 8);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");

  // A model no family can express is an error that says why.
  lf::models::DecoderConfig odd = c;
  odd.add_qkv_bias = true;
  odd.rope_scaling = true;  // Qwen2 has QKV bias but no llama3 scaling; Llama has no QKV bias
  try {
    hf::mapping_for_config(odd);
    ADD_FAILURE() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_MENTIONS(std::string(e.what()), "no HF family can express");
    EXPECT_MENTIONS(std::string(e.what()), "rope_scaling");
  }
  // Qwen2's config.json has no head_dim: a head dimension other than hidden / heads is lost.
  lf::models::DecoderConfig q = c;
  q.add_qkv_bias = true;
  q.rope_scaling = false;
  q.kv_channels = 64;
  try {
    hf::hf_config_json(q, hf::mapping_for_architecture("Qwen2ForCausalLM"), at::kFloat);
    ADD_FAILURE() << "no error";
  } catch (const lf::Error& e) {
    EXPECT_MENTIONS(std::string(e.what()), "kv_channels");
  }
}

// YaRN as Qwen2.5 / Qwen3 publish it for long context: only factor and the original context, in
// transformers-4 style ("type"). Absent keys take transformers' defaults (the original context:
// max_position_embeddings); a key the mapping does not read, or truncate: false, is an error
// naming it, not a model that silently differs.
TEST(HfConfig, ReadsQwenYarnAndRefusesKeysItDoesNotRead) {
  const std::string d = lf::testing::make_temp_dir("hf_yarn");
  auto write = [&](const json& scaling) {
    json j = json::parse(R"({
      "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
      "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
      "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
      "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": false,
      "hidden_act": "silu", "use_sliding_window": false})");
    j["rope_scaling"] = scaling;
    std::ofstream(d + "/config.json") << j.dump();
  };
  write({{"factor", 4.0}, {"original_max_position_embeddings", 32768}, {"type", "yarn"}});
  auto c = hf::read_hf_config(d);
  EXPECT_EQ(c.num_parameters(), 7'615'616'512);  // Qwen2.5-7B
  EXPECT_EQ(c.rope_type, "yarn");
  EXPECT_FALSE(c.rope_scaling);
  EXPECT_DOUBLE_EQ(c.rotary_scaling_factor, 4.0);
  EXPECT_EQ(c.rope_scaling_original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.beta_fast, 32);
  EXPECT_DOUBLE_EQ(c.beta_slow, 1);
  // Written back as transformers writes it: the keys at their defaults left out.
  auto j = json::parse(hf::hf_config_json(c, hf::mapping_for_config(c), at::kBFloat16));
  EXPECT_EQ(j["rope_scaling"], json({{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}))
      << j["rope_scaling"].dump();
  // No original context: max_position_embeddings; truncate true and null keys are transformers' defaults.
  write({{"rope_type", "yarn"}, {"factor", 2.0}, {"beta_fast", 16}, {"truncate", true}, {"attention_factor", nullptr}});
  c = hf::read_hf_config(d);
  EXPECT_EQ(c.rope_scaling_original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.rotary_scaling_factor, 2.0);
  EXPECT_DOUBLE_EQ(c.beta_fast, 16);
  auto config_error = [](const std::string& dir) {
    try {
      hf::read_hf_config(dir);
    } catch (const lf::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto read_fails = [&](const json& scaling) {
    write(scaling);
    return config_error(d);
  };
  std::string e = read_fails({{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.2}});
  EXPECT_MENTIONS(e, "attention_factor");
  EXPECT_MENTIONS(e, "config.json");
  EXPECT_MENTIONS(read_fails({{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", false}}), "truncate");
  EXPECT_MENTIONS(read_fails({{"rope_type", "yarn"}, {"original_max_position_embeddings", 4096}}), "lacks 'factor'");
  // truncate: null is not transformers' default (it reads as no truncation); a zero beta is its
  // default there (`or 32`) but not here.
  EXPECT_MENTIONS(read_fails({{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", nullptr}}), "truncate");
  EXPECT_MENTIONS(read_fails({{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 0}}), "beta_fast");
  // A top-level original context (transformers gives it priority) that disagrees.
  {
    json j;
    write({{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}});
    std::ifstream(d + "/config.json") >> j;
    j["original_max_position_embeddings"] = 8192;
    std::ofstream(d + "/config.json") << j.dump();
    EXPECT_MENTIONS(config_error(d), "original_max_position_embeddings 8192");
  }
  // Llama 3.1's scaling reads no YaRN key.
  {
    const std::string l = lf::testing::make_temp_dir("hf_llama3_beta");
    std::ofstream(l + "/config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 200, "max_position_embeddings": 64, "rope_theta": 500000.0,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 32, "beta_fast": 16}})";
    e = config_error(l);
    EXPECT_MENTIONS(e, "'beta_fast'");
    EXPECT_MENTIONS(e, "rope_type llama3");
  }
  // The original context shapes YaRN's frequencies: a job configured with another one differs
  // from the checkpoint (and is refused by load_hf_into), as it does under Llama 3.1's scaling.
  lf::models::DecoderConfig other = c;
  other.rope_scaling_original_max_position_embeddings = 4096;
  auto diff = hf::model_differences(c, other, /*with_init=*/false);
  ASSERT_EQ(diff.size(), 1u);
  EXPECT_EQ(diff[0].field, "rope_scaling_original_max_position_embeddings");
  other = c;
  other.rope_type = "rope";
  other.rope_scaling_original_max_position_embeddings = 4096;
  other.rotary_scaling_factor = 1;
  other.beta_fast = 32;
  EXPECT_EQ(hf::model_differences(c, other, false).size(), 4u);  // rope_type, factor, beta_fast, the context
  lf::models::DecoderConfig plain = other;
  plain.rope_scaling_original_max_position_embeddings = 1024;  // read by no scaling: not a difference
  EXPECT_TRUE(hf::model_differences(plain, other, false).empty());
}

TEST(HfConfig, OracleConfigsUseTransformers5Keys) {
  REQUIRE_ORACLE();
  json j;
  std::ifstream(oracle_dir() + "/llama/hf/config.json") >> j;
  if (!j.contains("rope_parameters")) GTEST_SKIP() << "transformers < 5 writes rope_scaling";
  auto c = hf::read_hf_config(oracle_dir() + "/llama/hf");
  EXPECT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling_original_max_position_embeddings, 32);
  EXPECT_DOUBLE_EQ(c.rotary_base, 500000.0);
}

}  // namespace

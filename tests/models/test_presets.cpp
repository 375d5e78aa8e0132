// Every model preset under configs/models/ loads through the job pipeline as loongforge-train
// loads it (a job whose defaults pick /models/<family>@model.foundation: <preset>) and has the
// parameter count of the published model (the safetensors total of its HF release: total_size
// / 2 in bf16). Each preset is also expressible as its family's HF config.json (the HF adapter's
// round-trip check), so lf2hf can export it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "loongforge/core/config/compose.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/composites/internvl.h"
#include "loongforge/models/composites/qwen2_5_vl.h"
#include "loongforge/models/composites/qwen3_vl.h"
#include "loongforge/models/registry.h"
#include "loongforge/models/hf_adapter.h"
#include "multiprocess.h"

namespace {
namespace fs = std::filesystem;
using lf::models::DecoderConfig;

std::string configs() { return lf::testing::source_dir() + "/configs"; }

DecoderConfig load_preset(const std::string& family, const std::string& preset) {
  // A job that picks the backbone in its defaults list, as docs/configuration.md shows.
  static const std::string dir = lf::testing::make_temp_dir("presets");
  const std::string path = dir + "/" + family + "_" + preset + ".yaml";
  std::ofstream(path) << "defaults:\n  - /train/base@_global_\n  - /models/" << family
                      << "@model.foundation: " << preset
                      << "\n  - _self_\nmodel:\n  type: causal_lm\ntraining:\n  train_iters: 1\n"
                         "  seq_length: 64\ndata:\n  mock_data: true\n";
  lf::config::ComposeOptions o;
  o.config_root = configs();
  o.config_file = path;
  auto loaded = lf::config::load_job(o);
  return lf::models::load_causal_lm(loaded.job.model).foundation;
}

struct Preset {
  const char* family;
  const char* name;
  int64_t parameters;  // published: the HF release's safetensors total_size / 2 (bf16)
  const char* architecture;
};

// Sources: config.json of meta-llama/Llama-2-7b-hf, Meta-Llama-3-8B, Llama-3.1-8B,
// Llama-3.1-70B, Qwen/Qwen2.5-7B, Qwen/Qwen3-{0.6B,1.7B,4B,8B,14B,32B}; the counts equal their
// model.safetensors.index.json total_size / 2 (Llama-2's index adds 32 fp32 rotary inv_freq
// buffers, 8 KiB, that are not parameters) and the model cards' "Number of Parameters"
// (Qwen3: 0.6B/0.44B non-embedding, 1.7B/1.4B, 4.0B/3.6B, 8.2B/6.95B, 14.8B/13.2B, 32.8B/31.2B).
const Preset kPresets[] = {
    {"llama", "llama2_7b", 6'738'415'616, "LlamaForCausalLM"},
    {"llama", "llama3_8b", 8'030'261'248, "LlamaForCausalLM"},
    {"llama", "llama3.1_8b", 8'030'261'248, "LlamaForCausalLM"},
    {"llama", "llama3_70b", 70'553'706'496, "LlamaForCausalLM"},
    {"qwen2", "qwen2.5_7b", 7'615'616'512, "Qwen2ForCausalLM"},
    {"qwen3", "qwen3_0.6b", 596'049'920, "Qwen3ForCausalLM"},
    {"qwen3", "qwen3_1.7b", 1'720'574'976, "Qwen3ForCausalLM"},
    {"qwen3", "qwen3_4b", 4'022'468'096, "Qwen3ForCausalLM"},
    {"qwen3", "qwen3_8b", 8'190'735'360, "Qwen3ForCausalLM"},
    {"qwen3", "qwen3_14b", 14'768'307'200, "Qwen3ForCausalLM"},
    {"qwen3", "qwen3_32b", 32'762'123'264, "Qwen3ForCausalLM"},
    // Qwen/Qwen3-30B-A3B and Qwen3-235B-A22B config.json; model cards: 30.5B total / 3.3B
    // activated, 235B / 22B.
    {"qwen3_moe", "qwen3_30b_a3b", 30'532'122'624, "Qwen3MoeForCausalLM"},
    {"qwen3_moe", "qwen3_235b_a22b", 235'093'634'560, "Qwen3MoeForCausalLM"},
    // deepseek-ai/DeepSeek-V3 config.json with its multi-token-prediction layer: the paper's 671B
    // total (671'026'419'200 without MTP, checked below) + 11.6B MTP. The HF release's "685B" also
    // counts the MTP layer's own copies of the embedding and output layer (2 x 0.93B, shared here as
    // in Megatron) and the FP8 scales.
    {"deepseek_v3", "deepseek_v3", 682'636'487'424, "DeepseekV3ForCausalLM"},
    // deepseek-ai/DeepSeek-V3.2-Exp config.json without the MTP layer (transformers' class has
    // none): DeepSeek-V3's 671'026'419'200 + 61 lightning indexers of 13'959'424 (wq_b 64x128x1536,
    // wk 128x7168, k_norm 2x128, weights_proj 64x7168): the paper's "671B" (DeepSeek-V3.2-Exp keeps
    // V3.1's architecture and adds the indexer).
    {"deepseek_v32", "deepseek_v32", 671'877'944'064, "DeepseekV32ForCausalLM"},
    // deepseek-ai/DeepSeek-V2-Lite config.json; model card: 15.7B total.
    {"deepseek_v2", "deepseek_v2_lite", 15'706'484'224, "DeepseekV2ForCausalLM"},
};

TEST(ModelPresets, PublishedParameterCounts) {
  for (const auto& p : kPresets) {
    SCOPED_TRACE(std::string(p.family) + "/" + p.name);
    DecoderConfig c = load_preset(p.family, p.name);
    EXPECT_EQ(c.num_parameters(), p.parameters);
    // Real vocabularies are already multiples of 128: no padding rows in the count.
    EXPECT_EQ(c.padded_vocab_size(), c.vocab_size);
    EXPECT_EQ(lf::models::hf::mapping_for_config(c, configs()).architecture(), p.architecture);
  }
  DecoderConfig v3 = load_preset("deepseek_v3", "deepseek_v3");
  EXPECT_EQ(v3.mtp_num_layers, 1);
  EXPECT_EQ(v3.num_parameters() - v3.mtp_parameters(), 671'026'419'200);  // the paper's 671B
  DecoderConfig v32 = load_preset("deepseek_v32", "deepseek_v32");
  EXPECT_EQ(v32.num_parameters(), v3.num_parameters() - v3.mtp_parameters() + 61 * v32.dsa_indexer_parameters());
  EXPECT_EQ(v32.dsa_indexer_parameters(), 13'959'424);
}

// The MoE presets' parameters per token: the model cards' activated counts (3.3B, 22B).
TEST(ModelPresets, MoeActiveParameters) {
  const auto a3b = load_preset("qwen3_moe", "qwen3_30b_a3b");
  EXPECT_EQ(a3b.num_active_parameters(), 3'353'032'704);
  EXPECT_NEAR(static_cast<double>(a3b.num_active_parameters()), 3.3e9, 0.06e9);  // the card truncates 3.35B
  const auto a22b = load_preset("qwen3_moe", "qwen3_235b_a22b");
  EXPECT_NEAR(static_cast<double>(a22b.num_active_parameters()), 22e9, 0.5e9);
  for (bool moe : a3b.moe_layer_pattern()) EXPECT_TRUE(moe);
  auto v3 = load_preset("deepseek_v3", "deepseek_v3");
  v3.mtp_num_layers = 0;  // the paper's 37B activated are the main model's
  EXPECT_NEAR(static_cast<double>(v3.num_active_parameters()), 37e9, 0.6e9);
  const auto pattern = v3.moe_layer_pattern();
  EXPECT_EQ(std::count(pattern.begin(), pattern.end(), false), 3);
  // DeepSeek-V2-Lite's card says 2.4B activated: without the input embedding (a lookup) ours is 2.45B.
  const auto lite = load_preset("deepseek_v2", "deepseek_v2_lite");
  EXPECT_NEAR(static_cast<double>(lite.num_active_parameters() - lite.padded_vocab_size() * lite.hidden_size), 2.4e9,
              0.1e9);
}

TEST(ModelPresets, FamilyFeatures) {
  auto l70 = load_preset("llama", "llama3_70b");
  EXPECT_TRUE(l70.rope_scaling);
  EXPECT_DOUBLE_EQ(l70.rope_scaling_factor, 8.0);
  EXPECT_DOUBLE_EQ(l70.rope_scaling_low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(l70.rope_scaling_high_freq_factor, 4.0);
  EXPECT_EQ(l70.rope_scaling_original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(l70.rotary_base, 500000);
  EXPECT_FALSE(load_preset("llama", "llama3_8b").rope_scaling);
  auto q2 = load_preset("qwen2", "qwen2.5_7b");
  EXPECT_TRUE(q2.add_qkv_bias);
  EXPECT_FALSE(q2.qk_layernorm);
  EXPECT_DOUBLE_EQ(q2.norm_epsilon, 1e-6);
  auto q3 = load_preset("qwen3", "qwen3_0.6b");
  EXPECT_TRUE(q3.qk_layernorm);
  EXPECT_FALSE(q3.untie_embeddings_and_output_weights);
  EXPECT_EQ(q3.head_dim(), 128);  // != hidden 1024 / 16 heads = 64
  EXPECT_TRUE(load_preset("qwen3", "qwen3_8b").untie_embeddings_and_output_weights);
}

// The presets equal what the HF adapter reads from the published config.json files (the
// release's own hyper-parameters, keys as published; tokenizer ids etc. omitted).
TEST(ModelPresets, EqualThePublishedConfigJson) {
  const std::pair<const char*, const char*> published[] = {
      {"llama/llama2_7b", R"({"architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
        "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false,
        "torch_dtype": "float16", "vocab_size": 32000})"},
      {"llama/llama3_70b", R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false,
        "hidden_act": "silu", "hidden_size": 8192, "initializer_range": 0.02,
        "intermediate_size": 28672, "max_position_embeddings": 131072, "mlp_bias": false,
        "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 80,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "vocab_size": 128256})"},
      {"qwen2/qwen2.5_7b", R"({"architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu",
        "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
        "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2",
        "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false,
        "vocab_size": 152064})"},
      {"qwen3/qwen3_0.6b", R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
        "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
        "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
        "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
        "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})"},
  };
  const std::string dir = lf::testing::make_temp_dir("published");
  for (const auto& [preset, text] : published) {
    SCOPED_TRACE(preset);
    const std::string d = dir + "/" + fs::path(preset).filename().string();
    fs::create_directories(d);
    std::ofstream(d + "/config.json") << text;
    const std::string name(preset);
    const auto slash = name.find('/');
    DecoderConfig from_hf = lf::models::hf::read_hf_config(d, nullptr, configs());
    DecoderConfig ours = load_preset(name.substr(0, slash), name.substr(slash + 1));
    EXPECT_EQ(lf::models::hf::model_section_yaml(from_hf), lf::models::hf::model_section_yaml(ours));
  }
}

// Every YAML file of a family directory (but the HF mapping) is a preset that loads, and the
// tiny ones stay tiny (seconds on a CPU).
TEST(ModelPresets, EveryPresetLoadsAndTinyOnesAreTiny) {
  int n = 0;
  for (const char* family : {"llama", "qwen2", "qwen3"}) {
    for (const auto& f : fs::directory_iterator(configs() + "/models/" + family)) {
      const std::string stem = f.path().stem().string();
      if (f.path().extension() != ".yaml" || stem == "hf") continue;
      SCOPED_TRACE(f.path().string());
      DecoderConfig c;
      ASSERT_NO_THROW(c = load_preset(family, stem));
      if (stem == "tiny") {
        EXPECT_LT(c.num_parameters(), 200'000);
      }
      ++n;
    }
  }
  EXPECT_GE(n, 14);
}

// The vision tower presets (configs/models/<tower>/) in a VLM job beside a foundation preset, as
// loongforge-train composes them. Qwen2.5-VL-7B-Instruct and Qwen3-VL-8B-Instruct: the release's
// safetensors total / 2; InternViT-300M with InternVL's projector: transformers'
// InternVLForConditionalGeneration built from the same fields on the meta device (its vision_tower
// and multi_modal_projector parameters) at the projector widths 896 and 3584.
std::shared_ptr<const lf::models::ModelConfig> load_vlm(const std::string& type, const std::string& tower,
                                                         const std::string& preset, const std::string& family,
                                                         const std::string& foundation, const std::string& extra = "") {
  static const std::string dir = lf::testing::make_temp_dir("vlm-presets");
  const std::string path = dir + "/" + tower + "_" + preset + "_" + foundation + ".yaml";
  std::ofstream(path) << "defaults:\n  - /train/base@_global_\n  - /models/" << tower << "@model.vision_encoder: " << preset
                      << "\n  - /models/" << family << "@model.foundation: " << foundation
                      << "\n  - _self_\nmodel:\n  type: " << type << "\n" << extra
                      << "training:\n  train_iters: 1\n  seq_length: 64\ndata:\n  mock_data: true\n";
  lf::config::ComposeOptions o;
  o.config_root = configs();
  o.config_file = path;
  return lf::models::load_model_config(lf::config::load_job(o).job.model);
}

TEST(ModelPresets, VisionTowersGiveThePublishedCounts) {
  {
    const auto m = load_vlm("qwen2_5_vl", "qwen2_5_vl_vision", "qwen2_5_vl_7b", "qwen2", "qwen2.5_7b");
    const auto text = lf::models::qwen2_5_vl_foundation(m->fields<DecoderConfig>("foundation"));
    auto tower = m->fields<lf::models::Qwen25VisionConfig>("vision_encoder");
    tower.out_hidden_size = text.hidden_size;
    EXPECT_EQ(tower.num_parameters(), 676'550'144);
    EXPECT_EQ(text.num_parameters() + tower.num_parameters(), 8'292'166'656);  // Qwen2.5-VL-7B-Instruct
    EXPECT_EQ(text.mrope_section, (std::vector<int64_t>{16, 24, 24}));
  }
  {
    const auto m = load_vlm("qwen3_vl", "qwen3_vl_vision", "qwen3_vl_8b", "qwen3", "qwen3_8b",
                            "  foundation:\n    mrope_section: [24, 20, 20]\n    mrope_interleaved: true\n");
    const auto& text = m->fields<DecoderConfig>("foundation");
    auto tower = m->fields<lf::models::Qwen3VisionConfig>("vision_encoder");
    tower.out_hidden_size = text.hidden_size;
    EXPECT_EQ(tower.num_parameters(), 576'388'336);
    EXPECT_EQ(text.num_parameters() + tower.num_parameters(), 8'767'123'696);  // Qwen3-VL-8B-Instruct
  }
  for (const auto& [foundation, width, want] : {std::tuple<std::string, int64_t, int64_t>{"qwen2.5_7b", 3584, 331'552'768}}) {
    const auto m = load_vlm("internvl", "intern_vit", "internvit_300m_448px", "qwen2", foundation);
    auto tower = m->fields<lf::models::InternVisionConfig>("vision_encoder");
    tower.out_hidden_size = width;
    EXPECT_EQ(tower.num_parameters(), want);
    tower.out_hidden_size = 896;  // InternVL3-1B's Qwen2.5-0.5B
    EXPECT_EQ(tower.num_parameters(), 308'495'104);
    EXPECT_EQ((tower.grid() / tower.merge()) * (tower.grid() / tower.merge()), 256);  // placeholders a tile
  }
}

}  // namespace


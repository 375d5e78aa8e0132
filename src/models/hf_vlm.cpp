// HF vision-language checkpoints <-> LoongForge's multimodal composites (hf_vlm.h). The language
// model goes through the decoder family's mapping (hf_adapter.cpp: the same rules, with the HF
// names under the VLM's language-model prefix); the vision tower through its own name table
// (qwen25_vision_from_hf and its inverse below). Every transform is a rearrangement, so
// lf2hf(hf2lf(x)) reproduces each tensor bit for bit.
#include "loongforge/models/hf_vlm.h"

#include <ATen/Functions.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <tuple>

#include "hf_mapping.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/models/registry.h"

namespace lf::models::hf {
namespace fs = std::filesystem;

namespace {

// The architecture table: an HF class, the composite it becomes, the decoder mapping of its
// language model and the model_type strings transformers writes for the sub-configs.
struct VlmArchitecture {
  const char* architecture;
  const char* model_type;
  const char* composite;
  const char* text_architecture;  // the decoder mapping (configs/models/*/hf.yaml) of the language model
  const char* text_model_type;
  const char* vision_model_type;
  const char* vision_component;  // our registered vision_encoder type
};

constexpr VlmArchitecture kVlms[] = {
    {"Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", "qwen2_5_vl", "Qwen2ForCausalLM", "qwen2_5_vl_text",
     "qwen2_5_vl_vision", "qwen2_5_vl_vision"},
    {"Qwen3VLForConditionalGeneration", "qwen3_vl", "qwen3_vl", "Qwen3ForCausalLM", "qwen3_vl_text", "qwen3_vl",
     "qwen3_vl_vision"},
    // The language model's family is its text_config's (qwen2, qwen3, llama ...): text_mapping_of.
    {"InternVLForConditionalGeneration", "internvl", "internvl", "", "", "internvl_vision", "intern_vit"},
};

const VlmArchitecture* by_hf(const std::string& architecture, const std::string& model_type) {
  for (const auto& a : kVlms)
    if (architecture == a.architecture) return &a;
  if (architecture.empty())
    for (const auto& a : kVlms)
      if (model_type == a.model_type) return &a;
  return nullptr;
}
const VlmArchitecture* by_composite(const std::string& type) {
  for (const auto& a : kVlms)
    if (type == a.composite) return &a;
  return nullptr;
}

std::string known_list() {
  std::string s;
  for (const auto& a : kVlms) s += (s.empty() ? "" : ", ") + std::string(a.architecture);
  return s;
}
const VlmArchitecture& architecture_of(const VlmConfig& config) {
  const VlmArchitecture* a = by_composite(config.type);
  LF_CHECK(a != nullptr, "model type ", config.type, " has no HF vision-language form", lf::hint("known: " + known_list()));
  return *a;
}

Mapping text_mapping(const VlmArchitecture& a) { return mapping_for_architecture(a.text_architecture); }
// The language model's mapping of a read config (InternVL: by text_config.model_type) or of a
// foundation to write (InternVL: the family able to express it).
Mapping text_mapping_of(const VlmArchitecture& a, const std::string& text_model_type) {
  return *a.text_architecture ? text_mapping(a) : mapping_for_architecture("", text_model_type);
}
Mapping text_mapping_for(const VlmArchitecture& a, const DecoderConfig& foundation) {
  return *a.text_architecture ? text_mapping(a) : mapping_for_config(foundation);
}
const std::string kInternVision = "model.vision_tower.", kInternProjector = "model.multi_modal_projector.";

// InternVL's files keep the original checkpoint's names (transformers maps them on load and back
// on save): language_model.model.* / language_model.lm_head.weight / vision_tower.* /
// multi_modal_projector.* on disk, model.language_model.* / lm_head.weight / model.vision_tower.* /
// model.multi_modal_projector.* in memory. Names already in memory form pass unchanged.
const std::pair<const char*, const char*> kInternDiskNames[] = {{"language_model.model.", "model.language_model."},
                                                                  {"language_model.lm_head.", "lm_head."},
                                                                  {"vision_tower.", "model.vision_tower."},
                                                                  {"multi_modal_projector.", "model.multi_modal_projector."}};
std::string intern_name(const std::string& name, bool to_disk) {
  for (const auto& [disk, memory] : kInternDiskNames) {
    const std::string from = to_disk ? memory : disk, to = to_disk ? disk : memory;
    if (name.rfind(from, 0) == 0) return to + name.substr(from.size());
  }
  return name;
}

std::pair<std::string, std::string> architecture_of(const json& j) {
  std::string arch, type = j.value("model_type", std::string());
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  return {arch, type};
}

// The vision tower's parameter names (relative to the encoder) and full shapes, in the
// encoder's registration order.
std::vector<std::pair<std::string, std::vector<int64_t>>> vision_tensors(const Qwen25VisionConfig& c) {
  const int64_t h = c.hidden_size, f = c.intermediate_size,
                merged = h * c.spatial_merge_size * c.spatial_merge_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out{{"patch_embed.weight", {h, c.patch_dim()}}};
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    out.push_back({p + "norm1.weight", {h}});
    out.push_back({p + "attention.linear_qkv.weight", {3 * h, h}});
    out.push_back({p + "attention.linear_qkv.bias", {3 * h}});
    out.push_back({p + "attention.linear_proj.weight", {h, h}});
    out.push_back({p + "attention.linear_proj.bias", {h}});
    out.push_back({p + "norm2.weight", {h}});
    out.push_back({p + "mlp.linear_fc1.weight", {2 * f, h}});
    out.push_back({p + "mlp.linear_fc1.bias", {2 * f}});
    out.push_back({p + "mlp.linear_fc2.weight", {h, f}});
    out.push_back({p + "mlp.linear_fc2.bias", {h}});
  }
  out.push_back({"merger.ln_q.weight", {h}});
  out.push_back({"merger.mlp.linear_fc1.weight", {merged, merged}});
  out.push_back({"merger.mlp.linear_fc1.bias", {merged}});
  out.push_back({"merger.mlp.linear_fc2.weight", {c.out_hidden_size, merged}});
  out.push_back({"merger.mlp.linear_fc2.bias", {c.out_hidden_size}});
  return out;
}

const std::string kVision = "vision_encoder.";

// Our vision tensors (relative names) -> transformers' (prefix + patch_embed.proj.weight ...):
// the inverse of qwen25_vision_from_hf.
NamedTensors vision_to_hf(const Qwen25VisionConfig& c, const std::map<std::string, at::Tensor>& ours,
                          const std::string& prefix) {
  const int64_t h = c.hidden_size, d = c.head_dim(), nh = c.num_heads, f = c.intermediate_size;
  auto get = [&](const std::string& name) { return ours.at(name).detach().cpu(); };
  NamedTensors out;
  out.emplace_back(prefix + "patch_embed.proj.weight",
                   get("patch_embed.weight").reshape({h, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}));
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".", hp = prefix + p;
    out.emplace_back(hp + "norm1.weight", get(p + "norm1.weight"));
    out.emplace_back(hp + "norm2.weight", get(p + "norm2.weight"));
    out.emplace_back(hp + "attn.qkv.weight", get(p + "attention.linear_qkv.weight")
                                                 .view({nh, 3, d, h}).transpose(0, 1).reshape({3 * h, h}));
    out.emplace_back(hp + "attn.qkv.bias",
                     get(p + "attention.linear_qkv.bias").view({nh, 3, d}).transpose(0, 1).reshape({3 * h}));
    out.emplace_back(hp + "attn.proj.weight", get(p + "attention.linear_proj.weight"));
    out.emplace_back(hp + "attn.proj.bias", get(p + "attention.linear_proj.bias"));
    const auto fc1 = get(p + "mlp.linear_fc1.weight").split(f, 0), fc1b = get(p + "mlp.linear_fc1.bias").split(f, 0);
    out.emplace_back(hp + "mlp.gate_proj.weight", fc1[0]);
    out.emplace_back(hp + "mlp.gate_proj.bias", fc1b[0]);
    out.emplace_back(hp + "mlp.up_proj.weight", fc1[1]);
    out.emplace_back(hp + "mlp.up_proj.bias", fc1b[1]);
    out.emplace_back(hp + "mlp.down_proj.weight", get(p + "mlp.linear_fc2.weight"));
    out.emplace_back(hp + "mlp.down_proj.bias", get(p + "mlp.linear_fc2.bias"));
  }
  out.emplace_back(prefix + "merger.ln_q.weight", get("merger.ln_q.weight"));
  out.emplace_back(prefix + "merger.mlp.0.weight", get("merger.mlp.linear_fc1.weight"));
  out.emplace_back(prefix + "merger.mlp.0.bias", get("merger.mlp.linear_fc1.bias"));
  out.emplace_back(prefix + "merger.mlp.2.weight", get("merger.mlp.linear_fc2.weight"));
  out.emplace_back(prefix + "merger.mlp.2.bias", get("merger.mlp.linear_fc2.bias"));
  for (auto& [name, t] : out) t = t.contiguous();
  return out;
}

// vision_config -> ours; transformers' defaults for absent keys.
Qwen25VisionConfig vision_from_json(const json& v, const std::string& src) {
  LF_CHECK(v.is_object(), src, ": vision_config must be an object");
  auto integer = [&](std::initializer_list<const char*> keys, int64_t fallback) {
    for (const char* k : keys)
      if (v.contains(k) && !v[k].is_null()) {
        LF_CHECK(v[k].is_number_integer(), src, ": vision_config.", k, " must be an integer, got ", v[k].dump());
        return v[k].get<int64_t>();
      }
    return fallback;
  };
  Qwen25VisionConfig c;
  c.depth = integer({"depth", "num_hidden_layers"}, 32);
  c.hidden_size = integer({"hidden_size"}, 3584);
  c.intermediate_size = integer({"intermediate_size"}, 3420);
  c.num_heads = integer({"num_heads", "num_attention_heads"}, 16);
  c.in_channels = integer({"in_channels", "in_chans"}, 3);
  c.patch_size = integer({"patch_size", "spatial_patch_size"}, 14);
  c.spatial_merge_size = integer({"spatial_merge_size"}, 2);
  c.temporal_patch_size = integer({"temporal_patch_size"}, 2);
  c.window_size = integer({"window_size"}, 112);
  c.out_hidden_size = integer({"out_hidden_size"}, 3584);
  if (v.contains("fullatt_block_indexes")) {
    LF_CHECK(v["fullatt_block_indexes"].is_array(), src, ": vision_config.fullatt_block_indexes must be a list");
    c.fullatt_block_indexes = v["fullatt_block_indexes"].get<std::vector<int64_t>>();
  } else {
    c.fullatt_block_indexes = {7, 15, 23, 31};
  }
  c.hidden_act = v.value("hidden_act", std::string("silu"));
  LF_CHECK(c.hidden_act == "silu", src, ": vision_config.hidden_act '", c.hidden_act, "' is not supported (silu)");
  if (v.contains("initializer_range") && v["initializer_range"].is_number())
    c.initializer_range = v["initializer_range"].get<double>();
  if (v.contains("rope_parameters") && v["rope_parameters"].is_object() && v["rope_parameters"].contains("rope_theta"))
    c.rope_theta = v["rope_parameters"]["rope_theta"].get<double>();
  else if (v.contains("rope_theta") && v["rope_theta"].is_number())
    c.rope_theta = v["rope_theta"].get<double>();
  LF_CHECK(c.hidden_size % c.num_heads == 0, src, ": vision_config.hidden_size ", c.hidden_size,
           " is not a multiple of num_heads ", c.num_heads);
  return c;
}

json vision_to_json(const Qwen25VisionConfig& c, const Qwen25VlConfig& own, const VlmArchitecture& a) {
  return json{{"model_type", a.vision_model_type},
              {"depth", c.depth},
              {"hidden_size", c.hidden_size},
              {"intermediate_size", c.intermediate_size},
              {"num_heads", c.num_heads},
              {"in_channels", c.in_channels},
              {"patch_size", c.patch_size},
              {"spatial_merge_size", c.spatial_merge_size},
              {"temporal_patch_size", c.temporal_patch_size},
              {"window_size", c.window_size},
              {"fullatt_block_indexes", c.fullatt_block_indexes},
              {"out_hidden_size", c.out_hidden_size},
              {"hidden_act", c.hidden_act},
              {"initializer_range", c.initializer_range},
              {"tokens_per_second", own.tokens_per_second},
              {"rope_parameters", {{"rope_theta", c.rope_theta}, {"rope_type", "axial"}}}};
}

// --- the Qwen3-VL tower (encoders/qwen3_vl_vision.h: qwen3_vision_from_hf and its inverse here) ---

std::vector<std::pair<std::string, std::vector<int64_t>>> vision3_tensors(const Qwen3VisionConfig& c) {
  const int64_t h = c.hidden_size, f = c.intermediate_size, m = c.merged_size(), o = c.out_hidden_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out{
      {"patch_embed.weight", {h, c.patch_dim()}}, {"patch_embed.bias", {h}}, {"pos_embed.weight", {c.num_position_embeddings, h}}};
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    for (const char* norm : {"norm1", "norm2"}) {
      out.push_back({p + norm + ".weight", {h}});
      out.push_back({p + norm + ".bias", {h}});
    }
    out.push_back({p + "attention.linear_qkv.weight", {3 * h, h}});
    out.push_back({p + "attention.linear_qkv.bias", {3 * h}});
    out.push_back({p + "attention.linear_proj.weight", {h, h}});
    out.push_back({p + "attention.linear_proj.bias", {h}});
    out.push_back({p + "mlp.linear_fc1.weight", {f, h}});
    out.push_back({p + "mlp.linear_fc1.bias", {f}});
    out.push_back({p + "mlp.linear_fc2.weight", {h, f}});
    out.push_back({p + "mlp.linear_fc2.bias", {h}});
  }
  auto merger = [&](const std::string& ours, int64_t norm_width) {
    out.push_back({ours + "norm.weight", {norm_width}});
    out.push_back({ours + "norm.bias", {norm_width}});
    out.push_back({ours + "linear_fc1.weight", {m, m}});
    out.push_back({ours + "linear_fc1.bias", {m}});
    out.push_back({ours + "linear_fc2.weight", {o, m}});
    out.push_back({ours + "linear_fc2.bias", {o}});
  };
  merger("merger.", h);
  for (size_t k = 0; k < c.deepstack_visual_indexes.size(); ++k) merger("deepstack_merger." + std::to_string(k) + ".", m);
  return out;
}

NamedTensors vision3_to_hf(const Qwen3VisionConfig& c, const std::map<std::string, at::Tensor>& ours,
                           const std::string& prefix) {
  const int64_t h = c.hidden_size, d = c.head_dim(), nh = c.num_heads;
  auto get = [&](const std::string& name) { return ours.at(name).detach().cpu(); };
  NamedTensors out;
  out.emplace_back(prefix + "patch_embed.proj.weight",
                   get("patch_embed.weight").reshape({h, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}));
  out.emplace_back(prefix + "patch_embed.proj.bias", get("patch_embed.bias"));
  out.emplace_back(prefix + "pos_embed.weight", get("pos_embed.weight"));
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".", hp = prefix + p;
    for (const char* norm : {"norm1", "norm2"})
      for (const char* part : {".weight", ".bias"}) out.emplace_back(hp + norm + part, get(p + norm + part));
    // Ours per head (q, k, v) x d; HF's (q | k | v) x heads x d.
    out.emplace_back(hp + "attn.qkv.weight",
                     get(p + "attention.linear_qkv.weight").view({nh, 3, d, h}).transpose(0, 1).reshape({3 * h, h}));
    out.emplace_back(hp + "attn.qkv.bias",
                     get(p + "attention.linear_qkv.bias").view({nh, 3, d}).transpose(0, 1).reshape({3 * h}));
    out.emplace_back(hp + "attn.proj.weight", get(p + "attention.linear_proj.weight"));
    out.emplace_back(hp + "attn.proj.bias", get(p + "attention.linear_proj.bias"));
    for (const char* name : {"mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"})
      out.emplace_back(hp + name, get(p + name));
  }
  auto merger = [&](const std::string& ours, const std::string& hf) {
    for (const char* name : {"norm.weight", "norm.bias", "linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight",
                             "linear_fc2.bias"})
      out.emplace_back(prefix + hf + name, get(ours + name));
  };
  merger("merger.", "merger.");
  for (size_t k = 0; k < c.deepstack_visual_indexes.size(); ++k)
    merger("deepstack_merger." + std::to_string(k) + ".", "deepstack_merger_list." + std::to_string(k) + ".");
  for (auto& [name, t] : out) t = t.contiguous();
  return out;
}

// vision_config -> ours; transformers' Qwen3VLVisionConfig defaults for absent keys.
Qwen3VisionConfig vision3_from_json(const json& v, const std::string& src) {
  LF_CHECK(v.is_object(), src, ": vision_config must be an object");
  auto integer = [&](const char* key, int64_t fallback) {
    if (!v.contains(key) || v[key].is_null()) return fallback;
    LF_CHECK(v[key].is_number_integer(), src, ": vision_config.", key, " must be an integer, got ", v[key].dump());
    return v[key].get<int64_t>();
  };
  Qwen3VisionConfig c;
  c.depth = integer("depth", 27);
  c.hidden_size = integer("hidden_size", 1152);
  c.intermediate_size = integer("intermediate_size", 4304);
  c.num_heads = integer("num_heads", 16);
  c.in_channels = integer("in_channels", 3);
  c.patch_size = integer("patch_size", 16);
  c.spatial_merge_size = integer("spatial_merge_size", 2);
  c.temporal_patch_size = integer("temporal_patch_size", 2);
  c.out_hidden_size = integer("out_hidden_size", 3584);
  c.num_position_embeddings = integer("num_position_embeddings", 2304);
  if (v.contains("deepstack_visual_indexes")) {
    LF_CHECK(v["deepstack_visual_indexes"].is_array(), src, ": vision_config.deepstack_visual_indexes must be a list");
    c.deepstack_visual_indexes = v["deepstack_visual_indexes"].get<std::vector<int64_t>>();
  }
  c.hidden_act = v.value("hidden_act", std::string("gelu_pytorch_tanh"));
  LF_CHECK(c.hidden_act == "gelu_pytorch_tanh" || c.hidden_act == "gelu", src, ": vision_config.hidden_act '",
           c.hidden_act, "' is not supported (gelu_pytorch_tanh, gelu)");
  if (v.contains("initializer_range") && v["initializer_range"].is_number())
    c.initializer_range = v["initializer_range"].get<double>();
  LF_CHECK(c.num_heads > 0 && c.hidden_size % c.num_heads == 0, src, ": vision_config.hidden_size ", c.hidden_size,
           " is not a multiple of num_heads ", c.num_heads);
  return c;
}

json vision3_to_json(const Qwen3VisionConfig& c, const VlmArchitecture& a) {
  return json{{"model_type", a.vision_model_type},
              {"depth", c.depth},
              {"hidden_size", c.hidden_size},
              {"intermediate_size", c.intermediate_size},
              {"num_heads", c.num_heads},
              {"in_channels", c.in_channels},
              {"patch_size", c.patch_size},
              {"spatial_merge_size", c.spatial_merge_size},
              {"temporal_patch_size", c.temporal_patch_size},
              {"out_hidden_size", c.out_hidden_size},
              {"num_position_embeddings", c.num_position_embeddings},
              {"deepstack_visual_indexes", c.deepstack_visual_indexes},
              {"hidden_act", c.hidden_act},
              {"initializer_range", c.initializer_range}};
}

// --- InternVL's tower (encoders/intern_vit.h): vision_config plus the projector's top-level fields ---

// vision_config (j_v) and the top-level projector fields (j) -> ours; transformers' defaults.
InternVisionConfig intern_from_json(const json& j, const json& v, const std::string& src) {
  LF_CHECK(v.is_object(), src, ": vision_config must be an object");
  auto side = [&](const char* key, int64_t fallback) {  // an int or a square [n, n]
    if (!v.contains(key)) return fallback;
    if (v[key].is_array()) {
      const auto a = v[key].get<std::vector<int64_t>>();
      LF_CHECK(a.size() == 2 && a[0] == a[1], src, ": vision_config.", key, " ", v[key].dump(),
               " is not square (non-square tiles are not supported)");
      return a[0];
    }
    LF_CHECK(v[key].is_number_integer(), src, ": vision_config.", key, " must be an integer, got ", v[key].dump());
    return v[key].get<int64_t>();
  };
  InternVisionConfig c;
  c.hidden_size = v.value("hidden_size", int64_t{1024});
  c.num_hidden_layers = v.value("num_hidden_layers", int64_t{24});
  c.num_attention_heads = v.value("num_attention_heads", int64_t{16});
  c.intermediate_size = v.value("intermediate_size", int64_t{4096});
  c.num_channels = v.value("num_channels", int64_t{3});
  c.image_size = side("image_size", 448);
  c.patch_size = side("patch_size", 14);
  c.attention_bias = v.value("attention_bias", false);
  c.use_qk_norm = v.value("use_qk_norm", false);
  c.hidden_act = v.value("hidden_act", std::string("gelu"));
  c.norm_type = v.value("norm_type", std::string("layer_norm"));
  c.layer_norm_eps = v.value("layer_norm_eps", 1e-6);
  c.layer_scale_init_value = v.value("layer_scale_init_value", 0.1);
  c.use_absolute_position_embeddings = v.value("use_absolute_position_embeddings", true);
  c.use_mean_pooling = v.value("use_mean_pooling", true);
  c.initializer_range = v.value("initializer_range", 0.02);
  c.downsample_ratio = j.value("downsample_ratio", 0.5);
  c.projector_hidden_act = j.value("projector_hidden_act", std::string("gelu"));
  LF_CHECK(!j.contains("vision_feature_layer") || j["vision_feature_layer"].is_number_integer(), src,
           ": vision_feature_layer ", j.value("vision_feature_layer", json()).dump(),
           " is not one layer (a list of layers is not supported)");
  c.vision_feature_layer = j.value("vision_feature_layer", int64_t{-1});
  c.vision_feature_select_strategy = j.value("vision_feature_select_strategy", std::string("default"));
  for (const auto& [key, value, allowed] :
       {std::tuple<const char*, std::string, std::vector<std::string>>{"vision_config.hidden_act", c.hidden_act, {"gelu"}},
        {"vision_config.norm_type", c.norm_type, {"layer_norm", "rms_norm"}},
        {"projector_hidden_act", c.projector_hidden_act, {"gelu"}},
        {"vision_feature_select_strategy", c.vision_feature_select_strategy, {"default"}}})
    LF_CHECK(std::find(allowed.begin(), allowed.end(), value) != allowed.end(), src, ": ", key, " '", value,
             "' is not supported");
  return c;
}

json intern_vision_json(const InternVisionConfig& c, const VlmArchitecture& a) {
  return json{{"model_type", a.vision_model_type},
              {"hidden_size", c.hidden_size},
              {"num_hidden_layers", c.num_hidden_layers},
              {"num_attention_heads", c.num_attention_heads},
              {"intermediate_size", c.intermediate_size},
              {"num_channels", c.num_channels},
              {"image_size", {c.image_size, c.image_size}},
              {"patch_size", {c.patch_size, c.patch_size}},
              {"attention_bias", c.attention_bias},
              {"use_qk_norm", c.use_qk_norm},
              {"hidden_act", c.hidden_act},
              {"norm_type", c.norm_type},
              {"layer_norm_eps", c.layer_norm_eps},
              {"layer_scale_init_value", c.layer_scale_init_value},
              {"use_absolute_position_embeddings", c.use_absolute_position_embeddings},
              {"use_mean_pooling", c.use_mean_pooling},
              {"initializer_range", c.initializer_range}};
}

// The tower's tensor table and HF form of each composite.
std::vector<std::pair<std::string, std::vector<int64_t>>> tower_tensors(const VlmConfig& c) {
  if (c.intern()) return intern_vision_tensors(c.vision_intern);
  return c.qwen3() ? vision3_tensors(c.vision3) : vision_tensors(c.vision);
}
json tower_json(const VlmConfig& c, const VlmArchitecture& a) {
  if (c.intern()) return intern_vision_json(c.vision_intern, a);
  return c.qwen3() ? vision3_to_json(c.vision3, a) : vision_to_json(c.vision, c.own, a);
}

// Copies the tower's full tensors into its parameters (this rank's shards); erases what it used
// from `names`.
void load_tower(const std::vector<Parameter>& params, const std::map<std::string, at::Tensor>& full,
                std::set<std::string>& names) {
  at::NoGradGuard no_grad;
  for (const auto& p : params) {
    auto it = full.find(p.name);
    LF_CHECK(it != full.end(), "the weights lack the vision tower's ", p.name,
             lf::hint("the weights belong to another model (or a text-only one)"));
    const at::Tensor shard = p.sharding.shard(it->second, p.tp_rank, p.tp_size);
    LF_CHECK(shard.sizes() == p.tensor.sizes(), "parameter ", p.name, ": the given tensor has shape ",
             it->second.sizes(), ", the model needs ", p.tensor.sizes());
    p.tensor.copy_(shard);
    names.erase(p.name);
  }
  LF_CHECK(names.empty(), "tensor ", names.empty() ? "" : *names.begin(), " is not a parameter of this model's vision tower",
           lf::hint("the weights belong to a model with a different vision configuration (depth)"));
}

template <class Model>
void load_full(Model& model, const std::map<std::string, at::Tensor>& full) {
  std::map<std::string, at::Tensor> lm;
  std::set<std::string> vision_names;
  for (const auto& [name, t] : full)
    if (name.rfind(kVision, 0) == 0) vision_names.insert(name);
    else lm.emplace(name, t);
  model.load_full_parameters(lm);
  if (model.vision_parameters().empty()) return;  // a stage without the tower
  load_tower(model.vision_parameters(), full, vision_names);
}

}  // namespace

bool is_vlm_hf_dir(const std::string& dir) {
  if (!is_hf_model_dir(dir)) return false;
  try {
    const auto [arch, type] = architecture_of(read_json_file((fs::path(dir) / "config.json").string()));
    return by_hf(arch, type) != nullptr;
  } catch (const lf::Error&) {
    return false;  // an unreadable config.json: the decoder path reports it
  }
}

VlmConfig read_vlm_hf_config(const std::string& hf_dir) {
  const std::string path = (fs::path(hf_dir) / "config.json").string(), src = lf::config::display_path(path);
  const json j = read_json_file(path);
  LF_CHECK(j.is_object(), src, ": config.json must hold a JSON object");
  const auto [arch, type] = architecture_of(j);
  const VlmArchitecture* a = by_hf(arch, type);
  LF_CHECK(a != nullptr, src, ": architecture '", arch, "' (model_type '", type, "') is not a known vision-language model",
           lf::hint("known: " + known_list()));
  VlmConfig out;
  out.type = a->composite;
  // The language model: transformers 5 nests it (text_config), transformers 4 writes it flat.
  json t = j.contains("text_config") && j["text_config"].is_object() ? j["text_config"] : j;
  const bool tied = j.value("tie_word_embeddings", false) || t.value("tie_word_embeddings", false);
  t["tie_word_embeddings"] = tied;
  if (out.intern()) {
    LF_CHECK(j.contains("vision_config"), src, ": no vision_config");
    const std::string text_type = t.value("model_type", std::string("qwen2"));
    out.foundation = config_from_json(t, text_mapping_of(*a, text_type).impl(), src + " (language model)");
    out.vision_intern = intern_from_json(j, j["vision_config"], src);
    out.vision_intern.out_hidden_size = out.foundation.hidden_size;
    out.own_intern.image_token_id = j.value("image_token_id", int64_t{151667});
    out.own.image_token_id = out.own_intern.image_token_id;
    LF_CHECK(out.own_intern.image_token_id >= 0 && out.own_intern.image_token_id < out.foundation.vocab_size, src,
             ": image_token_id ", out.own_intern.image_token_id, " is outside the vocabulary of ",
             out.foundation.vocab_size, " tokens");
    return out;
  }
  std::vector<int64_t> mrope;
  bool interleaved = false;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!t.contains(key) || !t[key].is_object() || !t[key].contains("mrope_section")) continue;
    LF_CHECK(t[key]["mrope_section"].is_array(), src, ": ", key, ".mrope_section must be a list");
    mrope = t[key]["mrope_section"].get<std::vector<int64_t>>();
    json& r = t[key];
    r.erase("mrope_section");
    if (r.contains("mrope_interleaved")) {
      LF_CHECK(r["mrope_interleaved"].is_boolean(), src, ": ", key, ".mrope_interleaved must be true or false");
      interleaved = r["mrope_interleaved"].get<bool>();
      r.erase("mrope_interleaved");
    }
    const std::string kind = r.value("rope_type", r.value("type", std::string("default")));
    if (kind == "mrope" || kind == "default") {
      if (std::string(key) == "rope_scaling") {
        t.erase("rope_scaling");  // transformers 4: {"type": "mrope", "mrope_section": [...]}; theta at top level
      } else {
        r["rope_type"] = "default";
        r.erase("type");
      }
    }
    break;
  }
  LF_CHECK(mrope.size() == 3, src, ": the language model needs M-RoPE: no 3-section mrope_section in ",
           j.contains("text_config") ? "text_config." : "", "rope_parameters or rope_scaling",
           lf::hint("a Qwen2.5-VL config.json has rope_parameters.mrope_section, e.g. [16, 24, 24]"));
  out.foundation = config_from_json(t, text_mapping(*a).impl(), src + " (language model)");
  out.foundation.mrope_section = mrope;
  out.foundation.mrope_interleaved = interleaved;
  LF_CHECK(interleaved == out.qwen3(), src, ": ", a->architecture, out.qwen3() ? " needs" : " does not take",
           " interleaved M-RoPE (rope_parameters.mrope_interleaved)");
  int64_t sum = 0;
  for (auto s : mrope) sum += s;
  LF_CHECK(2 * sum == out.foundation.head_dim(), src, ": mrope_section sums to ", sum, ", the head dim ",
           out.foundation.head_dim(), " needs ", out.foundation.head_dim() / 2);
  LF_CHECK(j.contains("vision_config"), src, ": no vision_config");
  if (out.qwen3())
    out.vision3 = vision3_from_json(j["vision_config"], src);
  else
    out.vision = vision_from_json(j["vision_config"], src);
  const int64_t tower_width = out.qwen3() ? out.vision3.out_hidden_size : out.vision.out_hidden_size;
  LF_CHECK(tower_width == out.foundation.hidden_size, src, ": vision_config.out_hidden_size ", tower_width,
           " differs from the language model's hidden_size ", out.foundation.hidden_size);
  const json& v = j["vision_config"];
  auto id = [&](const char* key, int64_t fallback) {
    const json* where = j.contains(key) ? &j : t.contains(key) ? &t : nullptr;
    if (!where) return fallback;
    LF_CHECK((*where)[key].is_number_integer(), src, ": ", key, " must be an integer, got ", (*where)[key].dump());
    return (*where)[key].get<int64_t>();
  };
  out.own.image_token_id = out.own3.image_token_id = id("image_token_id", 151655);
  out.own.video_token_id = out.own3.video_token_id = id("video_token_id", 151656);
  if (!out.qwen3())
    out.own.tokens_per_second = v.contains("tokens_per_second") ? v["tokens_per_second"].get<int64_t>()
                                                                 : j.value("tokens_per_second", int64_t{4});
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"image_token_id", out.own.image_token_id},
                                   {"video_token_id", out.own.video_token_id}})
    LF_CHECK(value >= 0 && value < out.foundation.vocab_size, src, ": ", key, " ", value,
             " is outside the vocabulary of ", out.foundation.vocab_size, " tokens");
  return out;
}

VlmHfModel read_vlm_hf(const std::string& hf_dir, const ReadOptions& options) {
  VlmHfModel out;
  out.config = read_vlm_hf_config(hf_dir);
  const VlmArchitecture& a = *by_composite(out.config.type);
  out.architecture = a.architecture;
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, t] : read_hf_weights(hf_dir, options.dtype, "model", options.dequantized_dtype))
    tensors.emplace(out.config.intern() ? intern_name(name, false) : name, std::move(t));
  // transformers 5: model.visual.*, model.language_model.*; transformers 4: visual.*, model.*.
  const bool v5 = std::any_of(tensors.begin(), tensors.end(),
                              [](const auto& e) { return e.first.rfind("model.language_model.", 0) == 0; });
  const bool intern = out.config.intern();
  const std::string visual = intern ? kInternVision : v5 ? "model.visual." : "visual.",
                    lm = v5 ? "model.language_model." : "model.";
  const Mapping mapping = text_mapping_for(a, out.config.foundation);
  std::vector<std::string> used;
  out.tensors = decoder_from_hf_tensors(out.config.foundation, mapping, tensors, lm, options.vocab_tp, &used);
  const std::set<std::string> read(used.begin(), used.end());
  for (const auto& [name, t] : tensors)
    LF_CHECK(name.rfind(visual, 0) == 0 || (intern && name.rfind(kInternProjector, 0) == 0) || read.count(name),
             "HF tensor '", name, "' in ", hf_dir, " is neither the vision tower's (", visual, "*",
             intern ? ", " + kInternProjector + "*" : std::string(), ") nor a tensor of the language model (",
             out.config.foundation.num_layers, " layers, ", mapping.model_type(), " mapping)",
             lf::hint("config.json may not match the weights (e.g. num_hidden_layers)"));
  if (intern) {
    for (auto& [name, t] : intern_vision_from_hf(out.config.vision_intern, tensors, kInternVision, kInternProjector))
      out.tensors.emplace_back(kVision + name, t.contiguous());
  } else if (out.config.qwen3()) {
    for (auto& [name, t] : qwen3_vision_from_hf(out.config.vision3, tensors, visual))
      out.tensors.emplace_back(kVision + name, t.contiguous());
  } else {
    for (auto& [name, t] : qwen25_vision_from_hf(out.config.vision, tensors, visual))
      out.tensors.emplace_back(kVision + name, t.contiguous());
  }
  return out;
}

// The language model's config.json fields through the decoder mapping (M-RoPE is written apart).
static json text_json(const VlmConfig& config, const Mapping& mapping, at::ScalarType dtype) {
  DecoderConfig text = config.foundation;
  text.mrope_section.clear();
  text.mrope_interleaved = false;
  return config_to_json(text, mapping.impl(), dtype);
}
void check_vlm_hf_form(const VlmConfig& c) { (void)text_json(c, text_mapping_for(architecture_of(c), c.foundation), at::kFloat); }
void write_vlm_hf(const std::string& out_dir, const VlmConfig& config, const NamedTensors& full,
                  const WriteOptions& options) {
  const VlmArchitecture* a = &architecture_of(config);
  LF_CHECK(options.architecture.empty() || options.architecture == a->architecture, "--architecture ",
           options.architecture, " cannot express a ", config.type, " model", lf::hint(std::string("use ") + a->architecture));
  std::map<std::string, at::Tensor> lm, vision;
  for (const auto& [name, t] : full) {
    auto& into = name.rfind(kVision, 0) == 0 ? vision : lm;
    const std::string key = name.rfind(kVision, 0) == 0 ? name.substr(kVision.size()) : name;
    LF_CHECK(into.emplace(key, t).second, "tensor '", name, "' given twice");
  }
  const auto table = tower_tensors(config);
  for (const auto& [name, shape] : table) {
    auto it = vision.find(name);
    LF_CHECK(it != vision.end(), "the model lacks tensor '", kVision + name, "' of the vision tower");
    LF_CHECK(it->second.sizes().vec() == shape, "tensor '", kVision + name, "' has shape ",
             shape_text(it->second.sizes().vec()), ", but the configuration implies ", shape_text(shape));
  }
  LF_CHECK(vision.size() == table.size(), "the vision tower holds ", vision.size(), " tensors, its configuration ",
           table.size());
  const Mapping mapping = text_mapping_for(*a, config.foundation);
  std::vector<std::string> used;
  NamedTensors hf_tensors = config.intern()
                                 ? intern_vision_to_hf(config.vision_intern, vision, kInternVision, kInternProjector)
                             : config.qwen3() ? vision3_to_hf(config.vision3, vision, "model.visual.")
                                              : vision_to_hf(config.vision, vision, "model.visual.");
  for (auto& e : decoder_to_hf_tensors(config.foundation, mapping, lm, "model.language_model.", &used))
    hf_tensors.push_back(std::move(e));
  const std::set<std::string> read(used.begin(), used.end());
  for (const auto& [name, t] : lm)
    LF_CHECK(read.count(name), "tensor '", name, "' has no place in the ", mapping.model_type(), " mapping (",
             mapping.path(), ") of the language model",
             lf::hint("the configuration does not match the tensors (e.g. num_layers)"));
  json t = text_json(config, mapping, options.dtype);  // config.json, transformers 5's layout
  json rope = {{"rope_type", "default"}, {"rope_theta", t["rope_theta"]}};
  if (t.contains("rope_scaling") && t["rope_scaling"].is_object())
    for (const auto& [k, v] : t["rope_scaling"].items()) rope[k] = v;
  if (!config.foundation.mrope_section.empty()) rope["mrope_section"] = config.foundation.mrope_section;
  if (config.foundation.mrope_interleaved) rope["mrope_interleaved"] = true;
  for (const char* k : {"architectures", "torch_dtype", "rope_scaling", "rope_theta"}) t.erase(k);
  t["model_type"] = *a->text_model_type ? std::string(a->text_model_type) : mapping.model_type();
  t["rope_parameters"] = rope;
  const char* dtype = options.dtype == at::kBFloat16 ? "bfloat16" : options.dtype == at::kHalf ? "float16" : "float32";
  json j = {{"architectures", json::array({a->architecture})},
            {"model_type", a->model_type},
            {"dtype", dtype},
            {"image_token_id", config.intern() ? config.own_intern.image_token_id : config.own.image_token_id},
            {"tie_word_embeddings", !config.foundation.untie_embeddings_and_output_weights},
            {"text_config", t},
            {"vision_config", tower_json(config, *a)}};
  if (config.intern()) {
    const auto& v = config.vision_intern;
    j["downsample_ratio"] = v.downsample_ratio;
    j["projector_hidden_act"] = v.projector_hidden_act;
    j["vision_feature_layer"] = v.vision_feature_layer;
    j["vision_feature_select_strategy"] = v.vision_feature_select_strategy;
    j["image_seq_length"] = (v.grid() / v.merge()) * (v.grid() / v.merge());
  } else {
    j["video_token_id"] = config.own.video_token_id;
  }
  if (config.intern())
    for (auto& [name, t] : hf_tensors) name = intern_name(name, true);
  write_hf_files(out_dir, j.dump(2) + "\n", hf_tensors, options.dtype, options.max_shard_bytes);
}

std::string vlm_model_section_yaml(const VlmConfig& config) {
  using lf::config::Node;
  const VlmArchitecture* a = by_composite(config.type);
  LF_CHECK(a != nullptr, "model type ", config.type, " is not a vision-language composite");
  Node model = Node::map();
  model.set("type", Node::scalar(config.type));
  const Node own = config.intern()  ? lf::config::to_node(config.own_intern)
                   : config.qwen3() ? lf::config::to_node(config.own3)
                                    : lf::config::to_node(config.own),
             tower = config.intern()  ? lf::config::to_node(config.vision_intern)
                     : config.qwen3() ? lf::config::to_node(config.vision3)
                                      : lf::config::to_node(config.vision);
  for (const auto& field : own.children()) model.set(field.key(), field);
  Node vision = Node::map();
  vision.set("type", Node::scalar(a->vision_component));
  for (const auto& field : tower.children()) vision.set(field.key(), field);
  model.set("vision_encoder", std::move(vision));
  model.set("foundation", lf::config::to_node(config.foundation));
  Node root = Node::map();
  root.set("model", std::move(model));
  return lf::config::to_yaml(root);
}

std::optional<VlmConfig> vlm_config_from_model_section(const std::string& yaml_text, const std::string& source) {
  const auto root = lf::config::parse_yaml_string(yaml_text, lf::config::Origin::from_file(source, 1));
  const auto* model = root.find("model");
  LF_CHECK(model != nullptr, source, ": no model: section in the checkpoint's configuration",
           lf::hint("the checkpoint was not written by loongforge-train or loongforge-convert"));
  const auto* type = model->find("type");
  if (!type || !type->is_scalar() || !by_composite(type->text())) return std::nullopt;
  const auto mc = load_model_config(*model);
  VlmConfig out;
  out.type = mc->type;
  if (out.intern()) {
    out.foundation = mc->fields<DecoderConfig>("foundation");
    out.vision_intern = mc->fields<InternVisionConfig>("vision_encoder");
    if (out.vision_intern.out_hidden_size == 0) out.vision_intern.out_hidden_size = out.foundation.hidden_size;
    out.own_intern = mc->own_fields<InternVlConfig>();
    out.own.image_token_id = out.own_intern.image_token_id;
    return out;
  }
  if (out.qwen3()) {
    out.foundation = mc->fields<DecoderConfig>("foundation");
    out.vision3 = mc->fields<Qwen3VisionConfig>("vision_encoder");
    if (out.vision3.out_hidden_size == 0) out.vision3.out_hidden_size = out.foundation.hidden_size;
    out.own3 = mc->own_fields<Qwen3VlConfig>();
    out.own.image_token_id = out.own3.image_token_id;
    out.own.video_token_id = out.own3.video_token_id;
    return out;
  }
  out.foundation = qwen2_5_vl_foundation(mc->fields<DecoderConfig>("foundation"));
  out.vision = mc->fields<Qwen25VisionConfig>("vision_encoder");
  if (out.vision.out_hidden_size == 0) out.vision.out_hidden_size = out.foundation.hidden_size;
  out.own = mc->own_fields<Qwen25VlConfig>();
  return out;
}
std::map<std::string, lf::parallel::Sharding> vlm_shardings(const VlmConfig& config) {
  auto out = causal_lm_shardings(config.foundation);
  for (const auto& [name, shape] : tower_tensors(config)) out[kVision + name] = lf::parallel::Sharding::replicated();
  return out;
}
void load_full_vlm(Qwen25Vl& model, const std::map<std::string, at::Tensor>& full) { load_full(model, full); }
void load_full_vlm(Qwen3Vl& model, const std::map<std::string, at::Tensor>& full) { load_full(model, full); }
void load_full_vlm(InternVl& model, const std::map<std::string, at::Tensor>& full) { load_full(model, full); }
DecoderConfig load_vlm_hf_into(CausalLm& model, const std::string& hf_dir) {
  const VlmConfig have = read_vlm_hf_config(hf_dir);
  const VlmArchitecture& a = *by_composite(have.type);
  auto* v25 = dynamic_cast<Qwen25Vl*>(&model);
  auto* v3 = dynamic_cast<Qwen3Vl*>(&model);
  auto* vi = dynamic_cast<InternVl*>(&model);
  const bool right = have.intern() ? vi != nullptr : have.qwen3() ? v3 != nullptr : v25 != nullptr;
  LF_CHECK(right && model.type() == have.type, "the HF model in ", hf_dir, " is a ", a.architecture, " (", have.type,
           "); the configured model is ", model.type(),
           lf::hint("set model.type " + have.type + " with its vision_encoder (e.g. configs/examples/" + have.type +
                    "_tiny.yaml), or convert with loongforge-convert hf2lf and read the config.yaml it writes"));
  // Checked before the weights are read.
  std::string list;
  for (const auto& d : model_differences(model.config(), have.foundation))
    list += "\n  foundation." + d.field + ": model " + d.ours + ", config.json " + d.theirs;
  const bool tower_here = have.intern()  ? !vi->vision_parameters().empty()
                          : have.qwen3() ? !v3->vision_parameters().empty()
                                         : !v25->vision_parameters().empty();
  if (tower_here) {
    json ours = have.intern()  ? intern_vision_json(vi->vision_encoder().config(), a)
                : have.qwen3() ? vision3_to_json(v3->vision_encoder().config(), a)
                               : vision_to_json(v25->vision_encoder().config(), v25->own_config(), a),
         theirs = tower_json(have, a);
    for (const char* skip : {"initializer_range", "tokens_per_second"}) ours.erase(skip), theirs.erase(skip);
    if (have.intern()) {  // the projector's fields, ours on the tower
      const auto& mine = vi->vision_encoder().config();
      const auto& want = have.vision_intern;
      ours["downsample_ratio"] = mine.downsample_ratio, theirs["downsample_ratio"] = want.downsample_ratio;
      ours["vision_feature_layer"] = mine.vision_feature_layer, theirs["vision_feature_layer"] = want.vision_feature_layer;
    }
    for (const auto& [key, value] : ours.items())
      if (theirs[key] != value)
        list += "\n  vision_encoder." + key + ": model " + value.dump() + ", config.json " + theirs[key].dump();
  }
  std::vector<std::tuple<const char*, int64_t, int64_t>> ids;
  if (have.intern()) {
    ids.emplace_back("image_token_id", vi->own_config().image_token_id, have.own_intern.image_token_id);
  } else {
    const int64_t image = have.qwen3() ? v3->own_config().image_token_id : v25->own_config().image_token_id,
                  video = have.qwen3() ? v3->own_config().video_token_id : v25->own_config().video_token_id;
    ids = {{"image_token_id", image, have.own.image_token_id}, {"video_token_id", video, have.own.video_token_id}};
    if (!have.qwen3())
      ids.emplace_back("tokens_per_second", v25->own_config().tokens_per_second, have.own.tokens_per_second);
  }
  for (const auto& [key, ours, theirs] : ids)
    if (ours != theirs) list += lf::str("\n  ", key, ": model ", ours, ", config.json ", theirs);
  if (!list.empty())
    LF_FAIL("the HF model in ", hf_dir, " is not the configured model:", list,
            lf::hint("set these model fields to config.json's values (loongforge-convert hf2lf writes them all into "
                     "its config.yaml)"));
  ReadOptions options;
  options.vocab_tp = model.tp_size();
  if (!model.parameters().empty()) options.dequantized_dtype = model.parameters().front().tensor.scalar_type();
  VlmHfModel m = read_vlm_hf(hf_dir, options);
  const std::map<std::string, at::Tensor> full(m.tensors.begin(), m.tensors.end());
  if (have.intern()) load_full_vlm(*vi, full);
  else if (have.qwen3()) load_full_vlm(*v3, full);
  else load_full_vlm(*v25, full);
  return m.config.foundation;
}

}  // namespace lf::models::hf

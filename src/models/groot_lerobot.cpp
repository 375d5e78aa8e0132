#include "loongforge/models/groot_lerobot.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hf_mapping.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/models/registry.h"

namespace lf::models::lerobot {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

const std::string kPolicyPrefix = "_groot_model.";
const std::string kCosmos = "nvidia/Cosmos-Reason2-2B";

// LeRobot's built-in copy of nvidia/Cosmos-Reason2-2B's config.json (a Qwen3-VL-2B layout).
const char* kCosmosConfig = R"({
  "image_token_id": 151655, "video_token_id": 151656, "tie_word_embeddings": true,
  "text_config": {"head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 262144,
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-6,
    "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"},
    "rope_theta": 5000000, "vocab_size": 151936},
  "vision_config": {"deepstack_visual_indexes": [5, 11, 17], "depth": 24, "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 1024, "in_channels": 3, "intermediate_size": 4096, "num_heads": 16,
    "num_position_embeddings": 2304, "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2,
    "temporal_patch_size": 2}
})";

json read_json(const fs::path& file) {
  std::ifstream in(file);
  LF_CHECK(in.good(), file.string(), ": cannot read");
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    LF_FAIL(file.string(), ": not JSON (", e.what(), ")");
  }
}

template <class T>
T field(const json& j, const std::string& key, const std::string& where) {
  LF_CHECK(j.is_object() && j.contains(key), where, ": no key \"", key, "\"");
  try {
    return j.at(key).get<T>();
  } catch (const std::exception& e) {
    LF_FAIL(where, ": key \"", key, "\" has the wrong type (", e.what(), ")");
  }
}

template <class T>
T field_or(const json& j, const std::string& key, T fallback, const std::string& where) {
  return j.is_object() && j.contains(key) && !j.at(key).is_null() ? field<T>(j, key, where) : fallback;
}

GrootBackbone backbone_from(const json& j, const std::string& where) {
  GrootBackbone b;
  const std::string tw = where + " text_config", vw = where + " vision_config";
  LF_CHECK(j.is_object() && j.contains("text_config") && j.contains("vision_config"), where,
           ": not a Qwen3-VL config (no text_config / vision_config)");
  const auto& t = j.at("text_config");
  auto& f = b.foundation;
  f.num_layers = field<int64_t>(t, "num_hidden_layers", tw);
  f.hidden_size = field<int64_t>(t, "hidden_size", tw);
  f.ffn_hidden_size = field<int64_t>(t, "intermediate_size", tw);
  f.num_attention_heads = field<int64_t>(t, "num_attention_heads", tw);
  f.num_query_groups = field<int64_t>(t, "num_key_value_heads", tw);
  f.kv_channels = field_or<int64_t>(t, "head_dim", f.hidden_size / f.num_attention_heads, tw);
  f.vocab_size = field<int64_t>(t, "vocab_size", tw);
  f.max_position_embeddings = field_or<int64_t>(t, "max_position_embeddings", 262144, tw);
  f.norm_epsilon = field_or<double>(t, "rms_norm_eps", 1e-6, tw);
  // transformers 5 writes rope_parameters (with rope_theta); older files rope_scaling + rope_theta.
  const json rope = t.contains("rope_parameters") ? t.at("rope_parameters") : t.value("rope_scaling", json::object());
  f.rotary_base = rope.contains("rope_theta") ? field<double>(rope, "rope_theta", tw + " rope_parameters")
                                              : field<double>(t, "rope_theta", tw);
  f.mrope_section = field<std::vector<int64_t>>(rope, "mrope_section", tw + " rope");
  f.mrope_interleaved = field_or<bool>(rope, "mrope_interleaved", false, tw + " rope");
  LF_CHECK(!field_or<bool>(t, "attention_bias", false, tw), tw, ": attention_bias true is not a Qwen3-VL layout");
  f.qk_layernorm = true;
  f.untie_embeddings_and_output_weights = true;
  const auto& v = j.at("vision_config");
  auto& e = b.vision;
  e.depth = field<int64_t>(v, "depth", vw);
  e.hidden_size = field<int64_t>(v, "hidden_size", vw);
  e.intermediate_size = field<int64_t>(v, "intermediate_size", vw);
  e.num_heads = field<int64_t>(v, "num_heads", vw);
  e.in_channels = field_or<int64_t>(v, "in_channels", 3, vw);
  e.patch_size = field<int64_t>(v, "patch_size", vw);
  e.spatial_merge_size = field<int64_t>(v, "spatial_merge_size", vw);
  e.temporal_patch_size = field<int64_t>(v, "temporal_patch_size", vw);
  e.out_hidden_size = field<int64_t>(v, "out_hidden_size", vw);
  e.num_position_embeddings = field<int64_t>(v, "num_position_embeddings", vw);
  e.deepstack_visual_indexes = field<std::vector<int64_t>>(v, "deepstack_visual_indexes", vw);
  e.hidden_act = field_or<std::string>(v, "hidden_act", "gelu_pytorch_tanh", vw);
  b.ids.image_token_id = field<int64_t>(j, "image_token_id", where);
  b.ids.video_token_id = field<int64_t>(j, "video_token_id", where);
  return b;
}

}  // namespace

bool is_groot_dir(const std::string& dir) {
  const auto path = fs::path(dir) / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  try {
    std::ifstream in(path);
    const auto j = json::parse(in);
    return j.is_object() && j.value("model_type", std::string()) == "Gr00tN1d7";
  } catch (const std::exception&) {
    return false;
  }
}

GrootBackbone read_qwen3_vl_backbone(const std::string& config_json) {
  return backbone_from(read_json(config_json), config_json);
}

GrootSetup read_groot_setup(const std::string& dir, const std::string& backbone_dir) {
  const fs::path file = fs::path(dir) / "config.json";
  const std::string where = file.string();
  const auto j = read_json(file);
  LF_CHECK(j.is_object() && j.value("model_type", std::string()) == "Gr00tN1d7", where,
           ": not a GR00T N1.7 model (\"model_type\" is not \"Gr00tN1d7\")");
  GrootSetup s;
  const std::string model_name = field_or<std::string>(j, "model_name", kCosmos, where);
  if (!backbone_dir.empty()) {
    s.backbone = read_qwen3_vl_backbone((fs::path(backbone_dir) / "config.json").string());
  } else if (fs::is_regular_file(fs::path(model_name) / "config.json")) {
    s.backbone = read_qwen3_vl_backbone((fs::path(model_name) / "config.json").string());
  } else {
    LF_CHECK(model_name == kCosmos, where, ": \"model_name\" is ", model_name,
             ", neither a directory with the backbone's config.json nor ", kCosmos,
             lf::hint("pass the backbone's Qwen3-VL config directory (--backbone-config DIR)"));
    s.backbone = backbone_from(json::parse(kCosmosConfig), kCosmos + " (built in)");
  }
  LF_CHECK(field_or<std::string>(j, "backbone_model_type", "qwen", where) == "qwen", where,
           ": backbone_model_type must be \"qwen\" (GR00T N1.7's Qwen3-VL backbone)");
  LF_CHECK(!field_or<bool>(j, "reproject_vision", false, where), where, ": reproject_vision true is not supported");
  LF_CHECK(!field_or<bool>(j, "apply_sincos_state_encoding", false, where), where,
           ": apply_sincos_state_encoding true is not supported");
  auto& c = s.config;
  c.select_layer = field<int64_t>(j, "select_layer", where);
  c.hidden_size = field<int64_t>(j, "hidden_size", where);
  c.input_embedding_dim = field<int64_t>(j, "input_embedding_dim", where);
  c.max_state_dim = field<int64_t>(j, "max_state_dim", where);
  c.max_action_dim = field<int64_t>(j, "max_action_dim", where);
  c.action_dim = c.max_action_dim;  // GR00T masks a robot's dims by its batches' action_mask
  if (j.contains("image_target_size") && j.at("image_target_size").is_array() && j.at("image_target_size").size() == 2)
    c.image_size = field<std::vector<int64_t>>(j, "image_target_size", where).at(0);
  c.action_horizon = field<int64_t>(j, "action_horizon", where);
  c.state_history_length = field_or<int64_t>(j, "state_history_length", 1, where);
  c.max_num_embodiments = field<int64_t>(j, "max_num_embodiments", where);
  c.max_seq_len = field_or<int64_t>(j, "max_seq_len", c.max_seq_len, where);
  c.add_pos_embed = field_or<bool>(j, "add_pos_embed", true, where);
  c.use_vlln = field_or<bool>(j, "use_vlln", true, where);
  c.use_alternate_vl_dit = field_or<bool>(j, "use_alternate_vl_dit", true, where);
  c.attend_text_every_n_blocks = field_or<int64_t>(j, "attend_text_every_n_blocks", 2, where);
  c.num_inference_timesteps = field_or<int64_t>(j, "num_inference_timesteps", 4, where);
  c.num_timestep_buckets = field_or<int64_t>(j, "num_timestep_buckets", 1000, where);
  c.noise_beta_alpha = field_or<double>(j, "noise_beta_alpha", 1.5, where);
  c.noise_beta_beta = field_or<double>(j, "noise_beta_beta", 1.0, where);
  c.noise_s = field_or<double>(j, "noise_s", 0.999, where);
  c.state_dropout_prob = field_or<double>(j, "state_dropout_prob", 0.0, where);
  const std::string dw = where + " diffusion_model_cfg";
  const auto& d = j.contains("diffusion_model_cfg") ? j.at("diffusion_model_cfg") : json::object();
  LF_CHECK(field_or<std::string>(d, "norm_type", "ada_norm", dw) == "ada_norm", dw, ": norm_type must be ada_norm");
  LF_CHECK(d.contains("positional_embeddings") && d.at("positional_embeddings").is_null(), dw,
           ": positional_embeddings must be null (the DiT's sinusoidal variant is not supported)");
  c.dit_num_layers = field_or<int64_t>(d, "num_layers", 12, dw);
  c.dit_num_attention_heads = field_or<int64_t>(d, "num_attention_heads", 8, dw);
  c.dit_attention_head_dim = field_or<int64_t>(d, "attention_head_dim", 64, dw);
  c.dit_output_dim = field_or<int64_t>(d, "output_dim", 26, dw);
  c.dit_interleave_self_attention = field_or<bool>(d, "interleave_self_attention", false, dw);
  c.dit_dropout = field_or<double>(d, "dropout", 0.1, dw);
  c.dit_final_dropout = field_or<bool>(d, "final_dropout", true, dw);
  const std::string vw = where + " vl_self_attention_cfg";
  const auto& v = j.contains("vl_self_attention_cfg") && !j.at("vl_self_attention_cfg").is_null()
                      ? j.at("vl_self_attention_cfg")
                      : json::object();
  c.vl_num_layers = field_or<int64_t>(v, "num_layers", 0, vw);
  if (c.vl_num_layers > 0)
    LF_CHECK(v.contains("positional_embeddings") && v.at("positional_embeddings").is_null(), vw,
             ": positional_embeddings must be null (the sinusoidal variant is not supported)");
  c.vl_num_attention_heads = field_or<int64_t>(v, "num_attention_heads", 8, vw);
  c.vl_attention_head_dim = field_or<int64_t>(v, "attention_head_dim", 64, vw);
  c.vl_dropout = field_or<double>(v, "dropout", 0.1, vw);
  c.vl_final_dropout = field_or<bool>(v, "final_dropout", true, vw);
  const int64_t width = field_or<int64_t>(j, "backbone_embedding_dim", s.backbone.foundation.hidden_size, where);
  LF_CHECK(width == s.backbone.foundation.hidden_size, where, ": backbone_embedding_dim ", width,
           " differs from the backbone's hidden_size ", s.backbone.foundation.hidden_size);
  lf::config::ErrorList errors;
  c.validate(width, s.backbone.foundation.num_layers, where + ": ", errors);
  errors.throw_if_any();
  return s;
}

std::map<std::string, at::Tensor> read_groot_weights(const std::string& dir, std::optional<at::ScalarType> dtype) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, t] : lf::models::hf::read_hf_weights(dir, dtype))
    out[name.starts_with(kPolicyPrefix) ? name.substr(kPolicyPrefix.size()) : name] = t;
  return out;
}

std::string groot_model_section_yaml(const GrootSetup& setup) {
  using lf::config::Node;
  GrootOwnConfig own{setup.config, setup.backbone.ids};
  DecoderConfig foundation = setup.backbone.foundation;
  Qwen3VisionConfig vision = setup.backbone.vision;
  Node model = Node::map();
  model.set("type", Node::scalar("groot"));
  const Node own_node = lf::config::to_node(own);  // kept alive: children() refers into it
  for (const auto& field : own_node.children()) model.set(field.key(), field);
  auto slot = [&](const char* name, const char* type, const Node& fields) {
    Node n = Node::map();
    n.set("type", Node::scalar(type));
    for (const auto& field : fields.children()) n.set(field.key(), field);
    model.set(name, std::move(n));
  };
  const Node vision_node = lf::config::to_node(vision), foundation_node = lf::config::to_node(foundation);
  slot("vision_encoder", "qwen3_vl_vision", vision_node);
  slot("foundation", "decoder", foundation_node);
  Node root = Node::map();
  root.set("model", std::move(model));
  return lf::config::to_yaml(root);
}

std::optional<GrootSetup> groot_setup_from_model_section(const std::string& yaml_text, const std::string& source) {
  const auto root = lf::config::parse_yaml_string(yaml_text, lf::config::Origin::from_file(source, 1));
  const auto* model = root.find("model");
  LF_CHECK(model != nullptr, source, ": no model: section in the checkpoint's configuration",
           lf::hint("the checkpoint was not written by loongforge-train or loongforge-convert"));
  const auto* type = model->find("type");
  if (!type || !type->is_scalar() || type->text() != "groot") return std::nullopt;
  const auto config = load_model_config(*model);
  GrootSetup s;
  s.backbone.foundation = config->fields<DecoderConfig>("foundation");
  s.backbone.vision = config->fields<Qwen3VisionConfig>("vision_encoder");
  const auto own = config->own_fields<GrootOwnConfig>();
  s.config = own.head;
  s.backbone.ids = own.ids;
  return s;
}

}  // namespace lf::models::lerobot

#include "loongforge/models/pi05_lerobot.h"

#include <ATen/Functions.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "hf_mapping.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/models/registry.h"

namespace lf::models::lerobot {
namespace {
namespace fs = std::filesystem;

const std::string kPrefix = "model.";
const std::string kVision = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.";
const std::string kLm = "paligemma_with_expert.paligemma.model.language_model.";
const std::string kExpert = "paligemma_with_expert.gemma_expert.model.";
const std::string kLmHead = "paligemma_with_expert.paligemma.lm_head.weight";
const std::string kExpertHead = "paligemma_with_expert.gemma_expert.lm_head.weight";
// The head counts LeRobot fixes in code (openpi's gemma variants; PaliGemma's SigLIP so400m).
constexpr int64_t kGemmaHeads = 8;
constexpr int64_t kSiglipHeads = 16;

nlohmann::json read_json(const fs::path& file) {
  std::ifstream in(file);
  LF_CHECK(in.good(), file.string(), ": cannot read");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    LF_FAIL(file.string(), ": not JSON (", e.what(), ")");
  }
}

// LeRobot's tensor name -> ours: "model." dropped, the older action_time_mlp_* names renamed (as
// LeRobot's loader does); "" for the LM heads, which the model does not hold.
std::string lf_name(const std::string& name) {
  std::string n = name.starts_with(kPrefix) ? name.substr(kPrefix.size()) : name;
  if (n.starts_with("action_time_mlp_")) n = n.substr(7);
  return n == kExpertHead || n == kLmHead ? "" : n;
}

// The shape of every tensor in the directory's weights by our name, from the file headers only.
std::map<std::string, std::vector<int64_t>> weight_shapes(const std::string& dir) {
  std::map<std::string, std::vector<int64_t>> out;
  std::vector<int64_t> lm_head;
  for (const auto& [name, shape] : lf::models::hf::read_hf_weight_shapes(dir)) {
    if (const std::string n = lf_name(name); !n.empty()) out[n] = shape;
    if (name.ends_with(kLmHead)) lm_head = shape;
  }
  if (!out.count(kLm + "embed_tokens.weight") && !lm_head.empty()) out[kLm + "embed_tokens.weight"] = lm_head;
  return out;
}

int64_t count_layers(const std::map<std::string, std::vector<int64_t>>& shapes, const std::string& prefix) {
  std::set<int64_t> layers;
  for (const auto& [name, shape] : shapes)
    if (name.starts_with(prefix + "layers.")) layers.insert(std::stoll(name.substr(prefix.size() + 7)));
  return static_cast<int64_t>(layers.size());
}

}  // namespace

bool is_pi05_dir(const std::string& dir) {
  const auto path = fs::path(dir) / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  try {
    std::ifstream in(path);
    const auto j = nlohmann::json::parse(in);
    return j.is_object() && j.value("type", std::string()) == "pi05";
  } catch (const std::exception&) {
    return false;
  }
}

std::map<std::string, at::Tensor> read_pi05_weights(const std::string& dir, std::optional<at::ScalarType> dtype) {
  std::map<std::string, at::Tensor> out;
  at::Tensor lm_head;
  for (auto& [name, t] : lf::models::hf::read_hf_weights(dir, dtype)) {
    if (const std::string n = lf_name(name); !n.empty())
      out[n] = t;
    else if (name.ends_with(kLmHead))
      lm_head = t;  // stands in for a missing token embedding, as LeRobot's loader does
  }
  if (!out.count(kLm + "embed_tokens.weight") && lm_head.defined()) out[kLm + "embed_tokens.weight"] = lm_head;
  return out;
}

Pi05Setup read_pi05_setup(const std::string& dir) {
  const fs::path file = fs::path(dir) / "config.json";
  const auto j = read_json(file);
  LF_CHECK(j.is_object() && j.value("type", std::string()) == "pi05", file.string(),
           ": not a LeRobot pi05 policy (\"type\" is not \"pi05\")");
  Pi05Setup s;
  auto& p = s.policy;
  auto number = [&](const char* key, auto& field) {
    if (!j.contains(key)) return;
    LF_CHECK(j[key].is_number(), file.string(), ": \"", key, "\" must be a number, got ", j[key].dump());
    field = j[key].get<std::decay_t<decltype(field)>>();
  };
  number("chunk_size", p.chunk_size);
  number("max_action_dim", p.max_action_dim);
  number("num_inference_steps", p.num_inference_steps);
  number("time_sampling_beta_alpha", p.time_sampling_beta_alpha);
  number("time_sampling_beta_beta", p.time_sampling_beta_beta);
  number("time_sampling_scale", p.time_sampling_scale);
  number("time_sampling_offset", p.time_sampling_offset);
  number("min_period", p.min_period);
  number("max_period", p.max_period);
  number("tokenizer_max_length", p.tokenizer_max_length);
  p.action_dim = p.max_action_dim;
  if (j.contains("output_features") && j["output_features"].is_object() && j["output_features"].contains("action")) {
    const auto& shape = j["output_features"]["action"]["shape"];
    LF_CHECK(shape.is_array() && shape.size() == 1 && shape[0].is_number_integer(), file.string(),
             ": output_features.action.shape must be [action_dim], got ", shape.dump());
    p.action_dim = shape[0].get<int64_t>();
  }
  int64_t cameras = 0;
  if (j.contains("input_features") && j["input_features"].is_object())
    for (const auto& [key, f] : j["input_features"].items())
      if (f.is_object() && f.value("type", std::string()) == "VISUAL") ++cameras;
  p.mock_cameras = std::max<int64_t>(1, cameras + j.value("empty_cameras", 0));
  const std::string dtype = j.value("dtype", std::string("float32"));
  LF_CHECK(dtype == "float32" || dtype == "bfloat16", file.string(), ": \"dtype\" ", dtype,
           " is neither float32 nor bfloat16");

  const auto shapes = weight_shapes(dir);
  auto shape = [&](const std::string& name) -> const std::vector<int64_t>& {
    auto it = shapes.find(name);
    LF_CHECK(it != shapes.end(), dir, "/model.safetensors lacks tensor '", kPrefix + name,
             "', which every pi05 policy has", lf::hint("the directory is not what PI05Policy.save_pretrained writes"));
    return it->second;
  };
  auto& v = s.vision;
  const auto& patch = shape(kVision + "embeddings.patch_embedding.weight");  // [hidden, 3, p, p]
  v.hidden_size = patch[0];
  v.patch_size = patch[2];
  const int64_t positions = shape(kVision + "embeddings.position_embedding.weight")[0];
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(positions))));
  LF_CHECK(side * side == positions, dir, ": the vision position table has ", positions,
           " rows, not a square grid of patches");
  v.image_size = side * v.patch_size;
  v.num_hidden_layers = count_layers(shapes, kVision + "encoder.");
  v.intermediate_size = shape(kVision + "encoder.layers.0.mlp.fc1.weight")[0];
  v.num_attention_heads = kSiglipHeads;
  if (j.contains("image_resolution")) {
    const auto& r = j["image_resolution"];
    LF_CHECK(r.is_array() && r.size() == 2 && r[0] == v.image_size && r[1] == v.image_size, file.string(),
             ": image_resolution ", r.dump(), " does not match the vision tower's ", v.image_size, "x", v.image_size,
             " (patch ", v.patch_size, ", ", positions, " positions)");
  }
  auto gemma = [&](const std::string& prefix, bool expert) {
    PiGemmaConfig g;
    g.depth = count_layers(shapes, prefix);
    const auto& q = shape(prefix + "layers.0.self_attn.q_proj.weight");  // [heads d, width]
    g.width = q[1];
    g.num_heads = kGemmaHeads;
    LF_CHECK(q[0] % kGemmaHeads == 0, dir, ": ", prefix, "layers.0.self_attn.q_proj has ", q[0],
             " rows, not 8 heads' worth");
    g.head_dim = q[0] / kGemmaHeads;
    g.num_kv_heads = shape(prefix + "layers.0.self_attn.k_proj.weight")[0] / g.head_dim;
    g.mlp_dim = shape(prefix + "layers.0.mlp.gate_proj.weight")[0];
    g.vocab_size = expert ? 0 : shape(prefix + "embed_tokens.weight")[0];
    return g;
  };
  s.vlm = gemma(kLm, false);
  s.expert = gemma(kExpert, true);
  const auto& in_proj = shape("action_in_proj.weight");  // [expert width, max_action_dim]
  LF_CHECK(in_proj[1] == p.max_action_dim, dir, ": action_in_proj takes ", in_proj[1],
           " action dims but config.json's max_action_dim is ", p.max_action_dim);
  LF_CHECK(p.action_dim <= p.max_action_dim, file.string(), ": the action feature's ", p.action_dim,
           " dims exceed max_action_dim ", p.max_action_dim);
  return s;
}

std::vector<std::pair<std::string, at::Tensor>> checked_pi05_tensors(const Pi05Setup& setup,
                                                                     std::map<std::string, at::Tensor> tensors,
                                                                     const std::string& source) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& r : pi05_parameter_records(setup.vision, setup.vlm, setup.expert, setup.policy)) {
    auto it = tensors.find(r.name);
    LF_CHECK(it != tensors.end(), source, " lacks tensor '", r.name, "', which the pi05 model needs",
             lf::hint("the weights and the configuration disagree"));
    LF_CHECK(it->second.sizes().vec() == r.shape, source, ": tensor '", r.name, "' has shape ", it->second.sizes(),
             ", but the model's configuration needs ", at::IntArrayRef(r.shape));
    out.emplace_back(r.name, std::move(it->second));
    tensors.erase(it);
  }
  if (!tensors.empty())
    LF_FAIL(source, " holds tensor '", tensors.begin()->first, "', which the pi05 model does not have",
            lf::hint("the weights and the configuration disagree"));
  return out;
}

void write_pi05(const std::string& out_dir, const Pi05Setup& setup,
                const std::vector<std::pair<std::string, at::Tensor>>& full, at::ScalarType dtype,
                const std::string& template_config) {
  const auto& p = setup.policy;
  nlohmann::ordered_json j;
  if (!template_config.empty()) {
    j = nlohmann::ordered_json::parse(template_config);
  } else {
    j = {{"type", "pi05"}, {"n_obs_steps", 1}, {"input_features", nlohmann::ordered_json::object()},
         {"output_features", nlohmann::ordered_json::object()}, {"device", "cpu"}, {"use_amp", false},
         {"paligemma_variant", "gemma_2b"}, {"action_expert_variant", "gemma_300m"}, {"n_action_steps", p.chunk_size},
         {"max_state_dim", 32}, {"empty_cameras", 0}, {"tokenizer_max_length", 200},
         {"normalization_mapping", {{"VISUAL", "IDENTITY"}, {"STATE", "QUANTILES"}, {"ACTION", "QUANTILES"}}}};
    for (int64_t c = 0; c < p.mock_cameras; ++c)
      j["input_features"]["observation.images.camera" + std::to_string(c)] = {
          {"type", "VISUAL"}, {"shape", {3, setup.vision.image_size, setup.vision.image_size}}};
    j["input_features"]["observation.state"] = {{"type", "STATE"}, {"shape", {32}}};
  }
  j["type"] = "pi05";
  j["dtype"] = dtype == at::kBFloat16 ? "bfloat16" : "float32";
  j["chunk_size"] = p.chunk_size;
  if (j.value("n_action_steps", p.chunk_size) > p.chunk_size) j["n_action_steps"] = p.chunk_size;
  j["max_action_dim"] = p.max_action_dim;
  j["num_inference_steps"] = p.num_inference_steps;
  j["time_sampling_beta_alpha"] = p.time_sampling_beta_alpha;
  j["time_sampling_beta_beta"] = p.time_sampling_beta_beta;
  j["time_sampling_scale"] = p.time_sampling_scale;
  j["time_sampling_offset"] = p.time_sampling_offset;
  j["min_period"] = p.min_period;
  j["max_period"] = p.max_period;
  j["tokenizer_max_length"] = p.tokenizer_max_length;
  j["image_resolution"] = {setup.vision.image_size, setup.vision.image_size};
  j["output_features"]["action"] = {{"type", "ACTION"}, {"shape", {p.action_dim}}};

  lf::models::hf::NamedTensors tensors;
  at::Tensor embed;
  for (const auto& [name, t] : full) {
    tensors.emplace_back(kPrefix + name, t);
    if (name == kLm + "embed_tokens.weight") embed = t;
  }
  LF_CHECK(embed.defined(), "write_pi05: no token embedding among the tensors");
  tensors.emplace_back(kPrefix + kLmHead, embed);
  tensors.emplace_back(kPrefix + kExpertHead, at::zeros({embed.size(0), setup.expert.width}, embed.options()));
  lf::models::hf::write_hf_files(out_dir, j.dump(4) + "\n", tensors, dtype, int64_t{1} << 62);
}

std::string pi05_model_section_yaml(const Pi05Setup& setup) {
  using lf::config::Node;
  const Node own = lf::config::to_node(setup.policy), vision = lf::config::to_node(setup.vision),
             vlm = lf::config::to_node(setup.vlm), expert = lf::config::to_node(setup.expert);
  Node model = Node::map();
  model.set("type", Node::scalar("pi05"));
  for (const auto& field : own.children()) model.set(field.key(), field);
  auto slot = [&](const char* name, const char* type, const Node& fields) {
    Node n = Node::map();
    n.set("type", Node::scalar(type));
    for (const auto& field : fields.children()) n.set(field.key(), field);
    model.set(name, std::move(n));
  };
  slot("vision_encoder", "siglip", vision);
  slot("foundation", "pi_gemma", vlm);
  slot("action_expert", "pi_gemma", expert);
  Node root = Node::map();
  root.set("model", std::move(model));
  return lf::config::to_yaml(root);
}

std::optional<Pi05Setup> pi05_setup_from_model_section(const std::string& yaml_text, const std::string& source) {
  const auto root = lf::config::parse_yaml_string(yaml_text, lf::config::Origin::from_file(source, 1));
  const auto* model = root.find("model");
  LF_CHECK(model != nullptr, source, ": no model: section in the checkpoint's configuration",
           lf::hint("the checkpoint was not written by loongforge-train or loongforge-convert"));
  const auto* type = model->find("type");
  if (!type || !type->is_scalar() || type->text() != "pi05") return std::nullopt;
  const auto config = load_model_config(*model);
  Pi05Setup s;
  s.vision = config->fields<SiglipConfig>("vision_encoder");
  s.vlm = config->fields<PiGemmaConfig>("foundation");
  s.expert = config->fields<PiGemmaConfig>("action_expert");
  s.policy = config->own_fields<Pi05Config>();
  return s;
}

std::map<std::string, lf::parallel::Sharding> pi05_shardings(const Pi05Setup& setup, int tp) {
  std::map<std::string, lf::parallel::Sharding> out;
  for (const auto& r : pi05_parameter_records(setup.vision, setup.vlm, setup.expert, setup.policy, tp))
    out[r.name] = r.sharding;
  return out;
}

}  // namespace lf::models::lerobot

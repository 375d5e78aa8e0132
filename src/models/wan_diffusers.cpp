#include "loongforge/models/wan_diffusers.h"

#include <ATen/Functions.h>
#include <c10/core/GradMode.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "hf_mapping.h"
#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"

namespace lf::models::diffusers {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
const char* kClass = "WanTransformer3DModel";
const char* kStem = "diffusion_pytorch_model";
}  // namespace

bool is_wan_dir(const std::string& dir) {
  const fs::path p = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(p)) return false;
  try {
    std::ifstream in(p);
    const json j = json::parse(in);
    return j.is_object() && j.value("_class_name", "") == kClass;
  } catch (const std::exception&) {
    return false;
  }
}

WanConfig read_wan_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  const std::string shown = lf::config::display_path(path);
  LF_CHECK(fs::exists(path), "no config.json in ", dir,
           lf::hint("give the directory that WanTransformer3DModel.save_pretrained wrote (a pipeline's transformer/)"));
  const json j = lf::models::hf::read_json_file(path);
  LF_CHECK(j.value("_class_name", "") == kClass, shown, ": _class_name is '", j.value("_class_name", ""), "', not ",
           kClass, lf::hint("for a diffusers pipeline give its transformer/ (or transformer_2/) directory"));
  WanConfig c;
  auto get_int = [&](const char* key, int64_t& out, bool nullable) {
    if (!j.contains(key)) return;
    const auto& v = j[key];
    if (v.is_null() && nullable) {
      out = 0;
      return;
    }
    LF_CHECK(v.is_number_integer(), shown, ": ", key, " must be an integer", nullable ? " or null" : "", ", got ", v.dump());
    out = v.get<int64_t>();
  };
  if (j.contains("patch_size")) {
    const auto& v = j["patch_size"];
    LF_CHECK(v.is_array() && v.size() == 3, shown, ": patch_size must be a list of three sizes, got ", v.dump());
    c.patch_size = v.get<std::vector<int64_t>>();
  }
  get_int("num_attention_heads", c.num_attention_heads, false);
  get_int("attention_head_dim", c.attention_head_dim, false);
  get_int("in_channels", c.in_channels, false);
  get_int("out_channels", c.out_channels, true);
  get_int("text_dim", c.text_dim, false);
  get_int("freq_dim", c.freq_dim, false);
  get_int("ffn_dim", c.ffn_dim, false);
  get_int("num_layers", c.num_layers, false);
  get_int("image_dim", c.image_dim, true);
  get_int("added_kv_proj_dim", c.added_kv_proj_dim, true);
  get_int("pos_embed_seq_len", c.pos_embed_seq_len, true);
  get_int("rope_max_seq_len", c.rope_max_seq_len, false);
  if (j.contains("cross_attn_norm")) c.cross_attn_norm = j["cross_attn_norm"].get<bool>();
  if (j.contains("eps")) c.eps = j["eps"].get<double>();
  if (j.contains("qk_norm")) {
    const auto& v = j["qk_norm"];
    LF_CHECK(v.is_null() || v == "rms_norm_across_heads", shown, ": qk_norm ", v.dump(),
             " is not one WanTransformer3DModel builds (its attention always normalises queries and keys across "
             "heads: rms_norm_across_heads)");
  }
  for (const char* key : {"num_attention_heads", "attention_head_dim", "ffn_dim", "num_layers"})
    LF_CHECK(j.contains(key), shown, ": ", key, " is missing");
  lf::config::ErrorList errors;
  c.validate(lf::config::Node(), shown, errors);
  errors.throw_if_any();
  return c;
}

std::string wan_config_json(const WanConfig& c) {
  auto opt = [](int64_t v) { return v > 0 ? json(v) : json(nullptr); };
  json j = {{"_class_name", kClass},
            {"_diffusers_version", "0.42.1"},
            {"patch_size", c.patch_size},
            {"num_attention_heads", c.num_attention_heads},
            {"attention_head_dim", c.attention_head_dim},
            {"in_channels", c.in_channels},
            {"out_channels", c.out_dim()},
            {"text_dim", c.text_dim},
            {"freq_dim", c.freq_dim},
            {"ffn_dim", c.ffn_dim},
            {"num_layers", c.num_layers},
            {"cross_attn_norm", c.cross_attn_norm},
            {"qk_norm", "rms_norm_across_heads"},
            {"eps", c.eps},
            {"image_dim", opt(c.image_dim)},
            {"added_kv_proj_dim", opt(c.added_kv_proj_dim)},
            {"rope_max_seq_len", c.rope_max_seq_len},
            {"pos_embed_seq_len", opt(c.pos_embed_seq_len)}};
  return j.dump(2) + "\n";
}

std::map<std::string, at::Tensor> read_wan_weights(const std::string& dir, std::optional<at::ScalarType> dtype) {
  return lf::models::hf::read_hf_weights(dir, dtype, kStem);
}

void load_into(const std::vector<lf::parallel::Parameter>& params, const std::map<std::string, at::Tensor>& tensors,
               const std::string& source) {
  c10::NoGradGuard no_grad;
  std::set<std::string> used;
  for (const auto& p : params) {
    auto it = tensors.find(p.name);
    LF_CHECK(it != tensors.end(), source, " lacks tensor '", p.name, "', which the model needs",
             lf::hint("the directory's config.json and weights disagree, or it is not a Wan transformer"));
    const auto full = p.full_shape();
    LF_CHECK(it->second.sizes().vec() == full, source, ": tensor '", p.name, "' has shape ", it->second.sizes(),
             ", but the model (from config.json) needs ", at::IntArrayRef(full));
    p.tensor.copy_(p.sharding.shard(it->second, p.tp_rank, p.tp_size));
    used.insert(p.name);
  }
  for (const auto& [name, t] : tensors)
    if (!used.count(name) && name != "norm_added_q.weight" && !name.ends_with(".norm_added_q.weight"))
      LF_FAIL(source, " holds tensor '", name, "', which the model (from its config.json) does not have",
              lf::hint("config.json does not describe these weights"));
}

void write_wan(const std::string& out_dir, const WanConfig& config,
               const std::vector<std::pair<std::string, at::Tensor>>& full, at::ScalarType dtype,
               int64_t max_shard_bytes) {
  lf::models::hf::write_hf_files(out_dir, wan_config_json(config), full, dtype, max_shard_bytes, kStem);
}

}  // namespace lf::models::diffusers

// Internal to the HF adapter: the parsed form of a family's hf.yaml (Mapping::Impl), the
// config.json <-> DecoderConfig translation and the shape expressions. Not a public header; the
// API is include/loongforge/models/hf_adapter.h.
#pragma once

#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "loongforge/core/config/node.h"
#include "loongforge/models/hf_adapter.h"

namespace lf::models::hf {

using json = nlohmann::json;

struct HfTensorSpec {
  std::string name;                // may contain <i> (and <e>: the expert, transform experts)
  std::vector<std::string> shape;  // sums of products of symbols / integers: "nq*d", "2*f"
};

struct TensorRule {
  std::string lf;  // may contain <i>
  std::vector<HfTensorSpec> hf;
  std::string transform = "copy";  // copy | vocab | qkv | concat | experts
  std::string when;                // "" | field | !field (per layer also moe_layer / !moe_layer)
  std::string origin;              // file:line of the entry, for messages
  // An HF copy of a tensor mapped elsewhere (DeepSeek's MTP layers carry the embedding and the
  // output layer again): written on export, checked equal on import.
  bool duplicate = false;
  bool per_layer() const { return lf.find("<i>") != std::string::npos; }
  // Per MTP layer: the HF names hold <n> (the HF layer index, num_layers + the MTP layer), the
  // LoongForge name <m> (the MTP layer) unless the rule is a duplicate.
  bool per_mtp() const { return !hf.empty() && hf[0].name.find("<n>") != std::string::npos; }
};

struct IgnoreRule {
  std::regex pattern;
  std::string text, when;
};

struct ConfigKey {
  std::string hf_key, field;
  std::vector<std::string> aliases;  // other config.json keys read for it (written as hf_key)
  std::string times;                 // the field is hf_key's value times this config.json key's
  bool zero_is_null = false;         // config.json null <-> 0 (DeepSeek's q_lora_rank)
  bool negate = false;
  bool has_default = false;
  json default_value;
};

// One key of a rope_scaling object: read into `field` (required unless it has a default: a value,
// or another config.json key's), or, `accept` set, a key whose one supported value is `accept`
// (YaRN's truncate: true), checked when present and never written.
struct RopeField {
  std::string key, field;
  json default_value;       // null: none
  std::string default_key;  // config.json key read when `key` is absent (null: none)
  json accept;
};

struct RopeScaling {
  // flag: a boolean field switched on, or `field=value` (a string field set to value).
  std::string type, flag;
  std::vector<RopeField> fields;
};

struct Mapping::Impl {
  std::string path, architecture, model_type;
  std::vector<std::pair<std::string, json>> fixed;      // foundation field -> value
  std::vector<std::pair<std::string, json>> constants;  // config.json key -> value
  std::vector<ConfigKey> config;
  std::string rope_theta_field;
  std::vector<RopeScaling> rope_scaling;
  std::vector<TensorRule> tensors;
  std::vector<IgnoreRule> ignore;
  // MoE layer placement (moe_layer_freq) in config.json: Qwen-MoE's decoder_sparse_step and
  // mlp_only_layers, DeepSeek's first_k_dense_replace (keys empty: not in the family).
  bool moe_section = false;
  // Multi-token prediction layers in HF as extra decoder layers after the last (DeepSeek-V3): the
  // decoder-layer rules repeat for each at HF index num_layers + m, as mtp.layers.<m>.transformer_layer.*
  bool mtp_layers = false;
  std::string sparse_step_key, dense_layers_key, first_dense_key;
};

// Every field of the config as JSON (int64 / double / bool / string), with kv_channels and
// num_query_groups resolved (head_dim(), query_groups()).
json config_fields(const DecoderConfig& config);
// `when` of a rule: "" is true; "x" / "!x" read the boolean field x (a number: non-zero).
bool holds(const std::string& when, const json& fields, const std::string& where);

// config.json (parsed) -> DecoderConfig, validated; `source` names the file in messages.
DecoderConfig config_from_json(const json& j, const Mapping::Impl& m, const std::string& source);
json config_to_json(const DecoderConfig& config, const Mapping::Impl& m, at::ScalarType dtype);

// A JSON file; errors name it.
json read_json_file(const std::string& path);

// Shape expressions: the symbols h, f, nq, nkv, d, vocab, layers, experts, fe (one routed
// expert's hidden size), fs (the shared experts'), and MLA's ql (q_lora_rank), kvl
// (kv_lora_rank), dqk (qk_head_dim), dr (qk_pos_emb_head_dim), dv (v_head_dim).
std::map<std::string, int64_t> shape_symbols(const DecoderConfig& config);
std::vector<int64_t> eval_shape(const std::vector<std::string>& shape,
                                const std::map<std::string, int64_t>& symbols);
std::string shape_text(const std::vector<int64_t>& shape);  // "[64, 32]"

// For the multimodal adapter (hf_vlm.cpp), defined in hf_adapter.cpp:
// every tensor of an HF directory's weights (model.safetensors, or the index and its shards) by
// HF name, in the file's dtype or converted to `dtype`; FP8 block-quantized weights (config.json's
// quantization_config) dequantized, in `dtype` or else `dequantized` (their _scale_inv tensors are
// read with them, not returned). stem: the files' name ("model"; diffusers: "diffusion_pytorch_model").
std::map<std::string, at::Tensor> read_hf_weights(const std::string& dir, std::optional<at::ScalarType> dtype,
                                                  const std::string& stem = "model",
                                                  at::ScalarType dequantized = at::kBFloat16);
// The same directory's tensor shapes by HF name, from the headers only (no tensor data read; an
// FP8 weight's _scale_inv tensor left out, as read_hf_weights leaves it).
std::map<std::string, std::vector<int64_t>> read_hf_weight_shapes(const std::string& dir,
                                                                  const std::string& stem = "model");
// Our full decoder tensors (by name) -> the mapping's HF tensors in mapping order, names beginning
// with "model." written with `model_prefix` in its place; `used` receives our names read. Throws
// naming the tensor when one is missing or has a shape the config contradicts.
NamedTensors decoder_to_hf_tensors(const DecoderConfig& config, const Mapping& mapping,
                                   const std::map<std::string, at::Tensor>& full, const std::string& model_prefix,
                                   std::vector<std::string>* used);
// config.json text + HF tensors -> out_dir (model.safetensors, or model-0000i-of-0000n.safetensors
// + index past max_shard_bytes, as HF forms shards), stale weight files of an earlier export removed.
void write_hf_files(const std::string& out_dir, const std::string& config_text, const NamedTensors& tensors,
                    at::ScalarType dtype, int64_t max_shard_bytes, const std::string& stem = "model");

}  // namespace lf::models::hf

// HF transformers vision-language checkpoints (config.json with text_config + vision_config,
// safetensors sharded or not) <-> LoongForge's multimodal composites: the configuration of the
// composite (its foundation DecoderConfig, vision tower and own fields) and the full, unsharded
// tensors under our parameter names. A table of architectures (hf_vlm.cpp) says which HF class
// maps to which composite: Qwen2_5_VLForConditionalGeneration <-> qwen2_5_vl (its language model
// through the qwen2 decoder mapping, configs/models/qwen2/hf.yaml; its tower through
// encoders/qwen2_5_vl_vision.h), Qwen3VLForConditionalGeneration <-> qwen3_vl (the qwen3 mapping
// with interleaved M-RoPE; encoders/qwen3_vl_vision.h, DeepStack mergers included) and
// InternVLForConditionalGeneration <-> internvl (the language model's mapping by its text_config
// model_type, 1D RoPE; encoders/intern_vit.h with the projector). Programs (loongforge-convert hf2lf / lf2hf,
// loongforge-generate) ask is_vlm_hf_dir / vlm_config_from_model_section first and fall back to
// the decoder path of hf_adapter.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>

#include "loongforge/models/composites/qwen2_5_vl.h"
#include "loongforge/models/composites/internvl.h"
#include "loongforge/models/composites/qwen3_vl.h"
#include "loongforge/models/hf_adapter.h"
#include "loongforge/parallel/sharding.h"

namespace lf::models::hf {

// A multimodal composite's configuration: `type` names the composite (qwen2_5_vl, qwen3_vl, internvl);
// the tower and own fields of that type are the ones set (out_hidden_size resolved, > 0).
struct VlmConfig {
  std::string type;
  DecoderConfig foundation;  // M-RoPE (mrope_section set; qwen3_vl: mrope_interleaved)
  Qwen25VisionConfig vision;  // qwen2_5_vl
  Qwen25VlConfig own;
  Qwen3VisionConfig vision3;  // qwen3_vl
  Qwen3VlConfig own3;
  InternVisionConfig vision_intern;  // internvl (the projector's fields with the tower's)
  InternVlConfig own_intern;
  bool qwen3() const { return type == "qwen3_vl"; }
  bool intern() const { return type == "internvl"; }
};

// True when dir is an HF model directory (is_hf_model_dir) whose config.json names an
// architecture (else model_type) of the VLM table.
bool is_vlm_hf_dir(const std::string& dir);

// config.json -> VlmConfig: transformers 5's nested text_config / vision_config or transformers
// 4's flat text fields; mrope_section from rope_parameters or rope_scaling ({"type": "mrope"}).
// Errors name the file and key.
VlmConfig read_vlm_hf_config(const std::string& hf_dir);

struct VlmHfModel {
  VlmConfig config;
  std::string architecture;
  NamedTensors tensors;  // our names (vision_encoder.*, embedding.*, decoder.*, output_layer.*), full
};

// Reads config.json and every weight (model.safetensors, or the index and its shards). Every HF
// tensor must be used; errors name the tensor and file. options.vocab_tp / dtype as read_hf.
VlmHfModel read_vlm_hf(const std::string& hf_dir, const ReadOptions& options = {});

// Throws, naming why, when write_vlm_hf could not express a model of this configuration (checked
// before training by loongforge-train --save-hf).
void check_vlm_hf_form(const VlmConfig& config);

// Writes out_dir/config.json (transformers 5 layout: text_config with rope_parameters incl.
// mrope_section, vision_config) and the weights under transformers 5's names (model.visual.*,
// model.language_model.*, lm_head.weight), sharded past options.max_shard_bytes as write_hf.
// `full`: our names, every tensor of the model and no other.
void write_vlm_hf(const std::string& out_dir, const VlmConfig& config, const NamedTensors& full,
                  const WriteOptions& options = {});

// The checkpoint config.yaml `model:` section of the composite (type, own fields, foundation,
// vision_encoder), and back: nullopt when the section's type is not a VLM of the table (a
// causal_lm: config_from_model_section).
std::string vlm_model_section_yaml(const VlmConfig& config);
std::optional<VlmConfig> vlm_config_from_model_section(const std::string& yaml_text, const std::string& source);

// The shardings of every parameter of the composite at TP 1 (the vision tower's replicated: it
// runs at TP 1), for write_model_checkpoint.
std::map<std::string, lf::parallel::Sharding> vlm_shardings(const VlmConfig& config);

// Copies full tensors under our names into a built model (this rank's shards): the language model
// through CausalLm::load_full_parameters, the tower's parameters by name (on the stages that hold
// it; others skip the tower's tensors). Every parameter must be given and every tensor used.
void load_full_vlm(Qwen25Vl& model, const std::map<std::string, at::Tensor>& full);
void load_full_vlm(Qwen3Vl& model, const std::map<std::string, at::Tensor>& full);
void load_full_vlm(InternVl& model, const std::map<std::string, at::Tensor>& full);

// The online form of hf2lf for a VLM (load_hf_into calls it for a directory of the table, so
// loongforge-train --load / --pretrained-checkpoint HF_DIR work): `model` must be the composite
// config.json describes; every difference of the foundation, the tower (checked on the first
// pipeline stage, which holds it) and the own fields is listed in one lf::Error before any weight
// is read. Returns the foundation's configuration.
DecoderConfig load_vlm_hf_into(CausalLm& model, const std::string& hf_dir);

}  // namespace lf::models::hf

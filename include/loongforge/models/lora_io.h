// LoRA adapters on disk: PEFT's adapter directories (adapter_config.json + adapter_model.safetensors,
// keys base_model.model.model.layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight) read into and
// written from our adapter names (blocks/lora.h: decoder.layers.<i>.<self_attention|mlp>.<module>
// .lora_<A|B>.weight), and merging adapters into full decoder weights (W + scale B A). Not the
// adapters' training (composites/causal_lm.h add_lora) or native checkpoints (train/checkpoint.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "loongforge/models/blocks/lora.h"
#include "loongforge/models/foundations/decoder_config.h"

namespace lf::models {

using NamedTensorList = std::vector<std::pair<std::string, at::Tensor>>;

struct PeftAdapter {
  LoraSpec spec;
  NamedTensorList tensors;  // our names, fp32
  std::string base_model;   // adapter_config.json base_model_name_or_path (informational)
};

// Reads a PEFT LoRA adapter directory. Errors name the file and key: a PEFT type other than LORA,
// settings we do not implement (DoRA, biases, rank/alpha patterns, modules_to_save, fan_in_fan_out,
// layers_to_transform), a target module outside q/k/v/o/gate/up/down_proj, a tensor name that is
// not a decoder layer's adapter, a layer index >= num_layers, a missing A or B.
PeftAdapter read_peft_adapter(const std::string& dir, const DecoderConfig& config);

// Writes dir/adapter_config.json and dir/adapter_model.safetensors (fp32) as PEFT saves them.
void write_peft_adapter(const std::string& dir, const LoraSpec& spec, const NamedTensorList& adapters,
                        const std::string& base_model);

// The LoRA settings of a training run's resolved configuration (a checkpoint's config.yaml, its
// lora: section; disabled when absent or rank 0). `source` names the file in errors.
LoraSpec lora_spec_from_job_yaml(const std::string& yaml_text, const std::string& source);

// Full decoder tensors (our names, unsharded) with every adapter merged: W += scale * B @ A, in
// the layout of the fused tensors (q/k/v rows into linear_qkv per query group, gate/up into
// linear_fc1's halves). Computed in fp32, returned in each weight's dtype.
NamedTensorList merge_lora(const NamedTensorList& base, const LoraSpec& spec, const NamedTensorList& adapters,
                           const DecoderConfig& config);

}  // namespace lf::models

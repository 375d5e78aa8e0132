// GR00T N1.7 model directories (what GR00TN17.save_pretrained writes, as NVIDIA publishes
// nvidia/GR00T-N1.7: config.json with "model_type": "Gr00tN1d7" and model.safetensors, the
// backbone cut to select_layer layers; LeRobot's GrootPolicy checkpoints hold the same tensors
// under "_groot_model.") -> the `groot` composite. The backbone's Qwen3-VL config is not in that
// config.json: its `model_name` names it, read from that directory's config.json when it is one,
// or LeRobot's built-in copy for nvidia/Cosmos-Reason2-2B, or the directory the caller gives.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>

#include "loongforge/models/composites/groot.h"

namespace lf::models::lerobot {

struct GrootSetup {
  GrootBackbone backbone;  // the foundation's num_layers: the full Qwen3-VL's (select_layer cuts it)
  GrootConfig config;
};

// True when `dir` holds a config.json whose "model_type" is "Gr00tN1d7".
bool is_groot_dir(const std::string& dir);
// A Qwen3-VL config.json (transformers' Qwen3VLConfig: text_config, vision_config) -> the backbone.
// Errors name the file and key.
GrootBackbone read_qwen3_vl_backbone(const std::string& config_json);
// config.json -> the setup (validated). backbone_dir: a directory with the backbone's Qwen3-VL
// config.json (empty: the config's model_name, as above). Errors name the file and key.
GrootSetup read_groot_setup(const std::string& dir, const std::string& backbone_dir = "");
// The directory's tensors by GR00T name (float32 unless dtype), "_groot_model." dropped.
std::map<std::string, at::Tensor> read_groot_weights(const std::string& dir,
                                                     std::optional<at::ScalarType> dtype = std::nullopt);

// The `model:` section a converted checkpoint stores as config.yaml (type groot, the action head's
// fields and the token ids, the vision_encoder and foundation slots), and the setup back from a
// checkpoint's config.yaml (nullopt when its model is not groot).
std::string groot_model_section_yaml(const GrootSetup& setup);
std::optional<GrootSetup> groot_setup_from_model_section(const std::string& yaml_text, const std::string& source);

}  // namespace lf::models::lerobot

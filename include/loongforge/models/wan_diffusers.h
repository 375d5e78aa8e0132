// diffusers' WanTransformer3DModel directories (what save_pretrained writes: config.json and
// diffusion_pytorch_model.safetensors, or its index and shards) <-> the `wan` foundation. The
// foundation uses diffusers' parameter names, so the conversion is the configuration and a check
// of every tensor's name and shape. Not the native checkpoint format (train/checkpoint.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loongforge/models/foundations/wan.h"
#include "loongforge/parallel/sharding.h"

namespace lf::models::diffusers {

// True when `dir` holds a config.json whose _class_name is WanTransformer3DModel.
bool is_wan_dir(const std::string& dir);
// config.json -> WanConfig (validated); errors name the file and key.
WanConfig read_wan_config(const std::string& dir);
// WanConfig -> config.json text (diffusers' keys, _class_name WanTransformer3DModel).
std::string wan_config_json(const WanConfig& config);
// Every tensor of the directory by name, in the file's dtype or converted to `dtype`.
std::map<std::string, at::Tensor> read_wan_weights(const std::string& dir,
                                                   std::optional<at::ScalarType> dtype = std::nullopt);
// Copies each parameter's shard of its full tensor from `tensors` (no_grad); throws naming the
// source and the tensor when one is missing, has another shape, or is not a parameter of the model.
void load_into(const std::vector<lf::parallel::Parameter>& params, const std::map<std::string, at::Tensor>& tensors,
               const std::string& source);
// Writes config.json and the weights (full tensors by name; sharded past max_shard_bytes as
// diffusers shards) into out_dir.
void write_wan(const std::string& out_dir, const WanConfig& config,
               const std::vector<std::pair<std::string, at::Tensor>>& full, at::ScalarType dtype,
               int64_t max_shard_bytes = 10'000'000'000);

}  // namespace lf::models::diffusers

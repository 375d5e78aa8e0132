// The native-checkpoint side of a Wan model (a `flow_matching` composite on the `wan`
// foundation): the `model:` section a converted checkpoint stores as its config.yaml and reading
// the foundation back from any such section (a converted or a trained checkpoint's), and the
// foundation's parameter records (name, full shape, TP sharding) without allocating weights, for
// offline tools. Not the diffusers directory format (wan_diffusers.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loongforge/models/foundations/wan.h"
#include "loongforge/parallel/sharding.h"

namespace lf::models::diffusers {

// The composite a converted Wan checkpoint holds.
inline constexpr const char* kWanComposite = "flow_matching";

// config.yaml text: `model:` with type flow_matching, its own fields' defaults and `foundation:`
// (type wan and every WanConfig field).
std::string flow_matching_model_section_yaml(const WanConfig& foundation);
// The foundation of a checkpoint's config.yaml whose model type is flow_matching (validated;
// errors name `source`); nullopt for another model type (a causal_lm, a VLM ...).
std::optional<WanConfig> wan_config_from_model_section(const std::string& yaml_text, const std::string& source);

struct WanParameterRecord {
  std::string name;            // diffusers' name (the native checkpoint uses the same)
  std::vector<int64_t> shape;  // full
  lf::parallel::Sharding sharding;
};
// Every parameter of the foundation, in the model's order; nothing is drawn or allocated.
std::vector<WanParameterRecord> wan_parameter_records(const WanConfig& config);

// The full tensors of `config`'s model from `tensors`, in the records' order, checked: each
// parameter present with its shape and no other tensor (diffusers' unused norm_added_q weights
// are dropped). Errors name `source` and the tensor.
std::vector<std::pair<std::string, at::Tensor>> checked_wan_tensors(const WanConfig& config,
                                                                    std::map<std::string, at::Tensor> tensors,
                                                                    const std::string& source);

}  // namespace lf::models::diffusers

#include "loongforge/models/wan_checkpoint.h"

#include <ATen/ops/empty.h>

#include "loongforge/backend/registry.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/models/blocks/param_builder.h"
#include "loongforge/models/composites/flow_matching.h"
#include "loongforge/models/registry.h"

namespace lf::models::diffusers {

std::string flow_matching_model_section_yaml(const WanConfig& foundation) {
  using lf::config::Node;
  // Kept in variables: a range-for over a temporary's children() would dangle.
  const Node own = lf::config::to_node(FlowMatchingConfig{}), fields = lf::config::to_node(foundation);
  Node model = Node::map();
  model.set("type", Node::scalar(kWanComposite));
  for (const auto& field : own.children()) model.set(field.key(), field);
  Node f = Node::map();
  f.set("type", Node::scalar("wan"));
  for (const auto& field : fields.children()) f.set(field.key(), field);
  model.set("foundation", std::move(f));
  Node root = Node::map();
  root.set("model", std::move(model));
  return lf::config::to_yaml(root);
}

std::optional<WanConfig> wan_config_from_model_section(const std::string& yaml_text, const std::string& source) {
  const auto root = lf::config::parse_yaml_string(yaml_text, lf::config::Origin::from_file(source, 1));
  const auto* model = root.find("model");
  LF_CHECK(model != nullptr, source, ": no model: section in the checkpoint's configuration",
           lf::hint("the checkpoint was not written by loongforge-train or loongforge-convert"));
  const auto* type = model->find("type");
  if (!type || !type->is_scalar() || type->text() != kWanComposite) return std::nullopt;
  return load_model_config(*model)->fields<WanConfig>("foundation");
}

std::vector<WanParameterRecord> wan_parameter_records(const WanConfig& config) {
  // A records-only builder: the weights are meta tensors (shapes without storage).
  ParamBuilder b = ParamBuilder::records_only();
  WanDit dit(config, lf::backend::cpu_backend(), b, /*seed=*/0, /*tp_rank=*/0);
  std::vector<WanParameterRecord> out;
  for (const auto& p : b.params()) out.push_back({p.name, p.full_shape(), p.sharding});
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> checked_wan_tensors(const WanConfig& config,
                                                                    std::map<std::string, at::Tensor> tensors,
                                                                    const std::string& source) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& r : wan_parameter_records(config)) {
    auto it = tensors.find(r.name);
    LF_CHECK(it != tensors.end(), source, " lacks tensor '", r.name, "', which the model needs",
             lf::hint("the weights and the configuration disagree, or this is not a Wan transformer"));
    LF_CHECK(it->second.sizes().vec() == r.shape, source, ": tensor '", r.name, "' has shape ", it->second.sizes(),
             ", but the model's configuration needs ", at::IntArrayRef(r.shape));
    out.emplace_back(r.name, std::move(it->second));
    tensors.erase(it);
  }
  for (const auto& [name, t] : tensors)
    LF_CHECK(name == "norm_added_q.weight" || name.ends_with(".norm_added_q.weight"), source, " holds tensor '", name,
             "', which the model (from its configuration) does not have",
             lf::hint("the configuration does not describe these weights"));
  return out;
}

}  // namespace lf::models::diffusers

#include "loongforge/models/causal_lm.h"

#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/schema.h"

namespace lf::models {
namespace {
// `user` over `defaults`: keys the user gave keep their node (and origin).
lf::config::Node overlay(const lf::config::Node& defaults, const lf::config::Node& user) {
  lf::config::Node out = defaults;
  for (const auto& child : user.children()) out.set(child.key(), child);
  return out;
}
}  // namespace

CausalLmConfig load_causal_lm(const lf::config::Node& model) {
  lf::config::ErrorList errors;
  CausalLmConfig out;
  if (!model.is_map()) {
    errors.add("model", model.origin(), "the job has no model section",
               "add `defaults: [/models/causal_lm@model: tiny]` or a model: map to the config");
    errors.throw_if_any();
  }
  const auto* type = model.find("type");
  if (!type || type->text() != "causal_lm") {
    errors.add("model.type", type ? type->origin() : model.origin(),
               "model.type must be causal_lm, got " + (type ? "'" + type->text() + "'" : std::string("nothing")),
               "other composites (vlm, diffusion, vla) arrive with their issues");
  }
  for (const auto& child : model.children())
    if (child.key() != "type" && child.key() != "foundation")
      errors.add("model." + child.key(), child.origin(), "unknown key in a causal_lm model",
                 lf::config::did_you_mean(child.key(), {"type", "foundation"}));
  const auto* foundation = model.find("foundation");
  if (!foundation) {
    errors.add("model.foundation", model.origin(), "causal_lm needs a foundation",
               "add `- /models/llama@foundation: tiny` to the model's defaults");
    errors.throw_if_any();
  }
  lf::config::load_into(foundation, "model.foundation", out.foundation, errors);
  if (errors.empty()) out.foundation.validate(*foundation, "model.foundation", errors);
  errors.throw_if_any();
  out.resolved = model;
  out.resolved.set("foundation",
                   overlay(lf::config::to_node(out.foundation, lf::config::Origin::from_default()),
                           *foundation));
  return out;
}

}  // namespace lf::models

#include "loongforge/models/registry.h"

#include "builtin_types.h"
#include "loongforge/core/error.h"

namespace lf::models {

namespace detail {
lf::config::Node overlay(const lf::config::Node& defaults, const lf::config::Node& user) {
  lf::config::Node out = defaults;
  for (const auto& child : user.children()) out.set(child.key(), child);
  return out;
}
}  // namespace detail

namespace {

// The keys every component may carry besides its own fields.
struct SettingsFields {
  std::string type;
  std::optional<int64_t> tensor_model_parallel_size;
  bool freeze = false;

  template <class V>
  void visit(V& v) {
    v("type", type, "Component type (the registry's name)");
    v("tensor_model_parallel_size", tensor_model_parallel_size,
      "This component's tensor-parallel size (null: the foundation's)", lf::config::Min{1});
    v("freeze", freeze, "Freeze the component (no gradients, no optimizer state)");
  }
};

const char* kSettingKeys[] = {"type", "tensor_model_parallel_size", "freeze"};

}  // namespace

const Registry& Registry::builtin() {
  static const Registry r = [] {
    Registry reg;
    register_builtin_types(reg);
    return reg;
  }();
  return r;
}

void Registry::add(ComponentType type) {
  LF_CHECK(!type.name.empty() && type.load, "a component type needs a name and a loader");
  LF_CHECK(components_.count(type.name) == 0, "component type '", type.name, "' is registered twice");
  components_.emplace(type.name, std::move(type));
}

void Registry::add(CompositeType type) {
  LF_CHECK(!type.name.empty() && type.plan, "a composite type needs a name and a planner");
  LF_CHECK(composites_.count(type.name) == 0, "composite type '", type.name, "' is registered twice");
  composites_.emplace(type.name, std::move(type));
}

const ComponentType* Registry::component(const std::string& name) const {
  auto it = components_.find(name);
  return it == components_.end() ? nullptr : &it->second;
}

const CompositeType* Registry::composite(const std::string& name) const {
  auto it = composites_.find(name);
  return it == composites_.end() ? nullptr : &it->second;
}

std::vector<std::string> Registry::component_names(const std::string& kind) const {
  std::vector<std::string> out;
  for (const auto& [name, t] : components_)
    if (kind.empty() || t.kind == kind) out.push_back(name);
  return out;
}

std::vector<std::string> Registry::composite_names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : composites_) out.push_back(name);
  return out;
}

const ComponentConfig& ModelConfig::component(const std::string& slot) const {
  auto it = components.find(slot);
  LF_CHECK(it != components.end(), "model type ", type, " has no component '", slot, "'");
  return *it->second;
}

void ModelConfig::wrong_kind(const std::string& slot) const {
  if (slot.empty()) LF_FAIL("model type ", type, ": its own fields are not of the expected kind (a registry mix-up)");
  LF_FAIL("model.", slot, ".type ", component(slot).type, " is not a component that ", type, " can use in its ", slot,
          " slot", lf::hint("see docs/design/model-layer.md for the types each composite takes"));
}

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}
}  // namespace

std::shared_ptr<const ModelConfig> load_model_config(const lf::config::Node& model, const Registry& registry) {
  using lf::config::Node;
  lf::config::ErrorList errors;
  auto out = std::make_shared<ModelConfig>();
  if (!model.is_map()) {
    errors.add("model", model.origin(), "the job has no model section",
               "add `defaults: [/models@model: causal_lm]` or a model: map to the config");
    errors.throw_if_any();
  }
  const Node* type = model.find("type");
  const auto composites = registry.composite_names();
  if (!type || !type->is_scalar()) {
    errors.add("model.type", type ? type->origin() : model.origin(), "model.type is missing",
               "name a composite: one of " + join(composites));
    errors.throw_if_any();
  }
  out->type = type->text();
  out->composite = registry.composite(out->type);
  if (!out->composite) {
    errors.add("model.type", type->origin(), "unknown model type '" + out->type + "'",
               lf::config::did_you_mean(out->type, composites) + " (registered: " + join(composites) + ")");
    errors.throw_if_any();
  }
  const CompositeType& ct = *out->composite;
  out->resolved = Node::map(model.origin());
  out->resolved.set("type", *type);
  Node own = Node::map(model.origin());
  std::vector<std::string> slot_names;
  for (const auto& s : ct.slots) slot_names.push_back(s.name);
  for (const auto& child : model.children()) {
    if (child.key() == "type") continue;
    bool is_slot = false;
    for (const auto& s : ct.slots) is_slot = is_slot || s.name == child.key();
    if (!is_slot) own.set(child.key(), child);
  }
  for (const auto& slot : ct.slots) {
    const std::string key = "model." + slot.name;
    const Node* node = model.find(slot.name);
    if (!node) {
      if (slot.required)
        errors.add(key, model.origin(), ct.name + " needs a " + slot.name + " (a " + slot.kind + ")",
                   "add `- /models/<family>@" + slot.name + ": <option>` to the model's defaults, e.g. " +
                       (slot.kind == "foundation" ? "`- /models/llama@foundation: tiny`"
                                                  : "`- /models/" + slot.name + "@" + slot.name + ": <name>`"));
      continue;
    }
    if (!node->is_map()) {
      errors.add(key, node->origin(), key + " must be a map (the component's fields)");
      continue;
    }
    // The settings every component has, then its own fields.
    Node settings_node = Node::map(node->origin()), fields_node = *node;
    for (const char* k : kSettingKeys)
      if (const Node* n = node->find(k)) {
        settings_node.set(k, *n);
        fields_node.erase(k);
      }
    SettingsFields settings;
    settings.type = slot.default_type;
    lf::config::load_into(&settings_node, key, settings, errors);
    if (slot.kind == "foundation" && settings.tensor_model_parallel_size) {
      const Node* n = node->find("tensor_model_parallel_size");
      errors.add(key + ".tensor_model_parallel_size", n ? n->origin() : node->origin(),
                 "the foundation's tensor-parallel size is the job's: " + key +
                     ".tensor_model_parallel_size cannot be set",
                 "use --tensor-model-parallel-size (parallel.tensor_model_parallel_size); the other components "
                 "may set their own");
    }
    if (settings.type.empty()) {
      errors.add(key + ".type", node->origin(), key + ".type is missing",
                 "name a " + slot.kind + ": one of " + join(registry.component_names(slot.kind)));
      continue;
    }
    const ComponentType* comp = registry.component(settings.type);
    const Node* type_node = node->find("type");
    const auto origin = type_node ? type_node->origin() : node->origin();
    if (!comp || comp->kind != slot.kind) {
      const auto names = registry.component_names(slot.kind);
      errors.add(key + ".type", origin,
                 comp ? "'" + settings.type + "' is a " + comp->kind + ", the " + slot.name + " slot takes a " + slot.kind
                      : "unknown " + slot.kind + " type '" + settings.type + "'",
                 lf::config::did_you_mean(settings.type, names) + " (" + slot.kind + "s: " + join(names) + ")");
      continue;
    }
    std::unique_ptr<ComponentConfig> c = comp->load(fields_node, key, errors);
    if (!c) continue;
    c->slot = slot.name;
    c->type = settings.type;
    c->settings.tensor_model_parallel_size = settings.tensor_model_parallel_size;
    c->settings.freeze = settings.freeze;
    Node resolved = c->resolved.is_map() ? c->resolved : Node::map(node->origin());
    Node head = lf::config::to_node(settings, lf::config::Origin::from_default());
    if (slot.kind == "foundation") head.erase("tensor_model_parallel_size");
    for (const auto& k : head.children())
      if (!settings_node.find(k.key())) settings_node.set(k.key(), k);
    // type first, then the settings, then the fields.
    Node ordered = Node::map(node->origin());
    for (const char* k : kSettingKeys)
      if (const Node* n = settings_node.find(k)) ordered.set(k, *n);
    for (const auto& f : resolved.children()) ordered.set(f.key(), f);
    c->resolved = ordered;
    out->resolved.set(slot.name, ordered);
    out->components[slot.name] = std::shared_ptr<const ComponentConfig>(std::move(c));
  }
  if (ct.load_own) {
    std::unique_ptr<ComponentConfig> o = ct.load_own(own, "model", errors);
    if (o) {
      for (const auto& f : o->resolved.children()) out->resolved.set(f.key(), f);
      out->own = std::shared_ptr<const ComponentConfig>(std::move(o));
    }
  } else {
    for (const auto& child : own.children())
      errors.add("model." + child.key(), child.origin(), "unknown key in a " + ct.name + " model",
                 lf::config::did_you_mean(child.key(), slot_names) + " (" + ct.name + " has: type, " + join(slot_names) + ")");
  }
  errors.throw_if_any();
  return out;
}

std::unique_ptr<ModelPlan> plan_model(std::shared_ptr<const ModelConfig> config, const PlanArgs& args) {
  lf::config::ErrorList errors;
  auto plan = config->composite->plan(config, args, errors);
  errors.throw_if_any();
  return plan;
}

}  // namespace lf::models

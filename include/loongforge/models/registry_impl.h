// Template definitions of models/registry.h (included at its end; not for direct use).
#pragma once

#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/schema.h"

namespace lf::models {

namespace detail {
// `user` over `defaults`: keys the user gave keep their node (and origin).
lf::config::Node overlay(const lf::config::Node& defaults, const lf::config::Node& user);
}  // namespace detail

template <class Fields>
ComponentLoader schema_loader() {
  return [](const lf::config::Node& node, const std::string& key,
            lf::config::ErrorList& errors) -> std::unique_ptr<ComponentConfig> {
    auto out = std::make_unique<ComponentConfigOf<Fields>>();
    const size_t before = errors.size();
    lf::config::load_into(&node, key, out->fields, errors);
    if constexpr (requires(const Fields& f, const lf::config::Node& n, const std::string& k,
                           lf::config::ErrorList& e) { f.validate(n, k, e); }) {
      if (errors.size() == before) out->fields.validate(node, key, errors);
    }
    out->resolved = detail::overlay(lf::config::to_node(out->fields, lf::config::Origin::from_default()), node);
    return out;
  };
}

}  // namespace lf::models

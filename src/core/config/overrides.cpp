// Command-line overrides of config values: parsing `a.b=v`, `+a.b=v`, `++a.b=v`, `~a.b[=v]` and
// applying them to a composed tree (Hydra semantics). Defaults-group overrides (`group=option`)
// are handled by compose.cpp.
#include <algorithm>
#include <cctype>

#include "loongforge/core/config/compose.h"
#include "loongforge/core/config/yaml.h"

namespace lf::config {
namespace {

bool valid_key(std::string_view key) {
  if (key.empty() || key.front() == '.' || key.back() == '.') return false;
  if (key.find("..") != std::string_view::npos) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' ||
           c == '@' || c == '-';
  });
}

std::string how_to_add(const Override& o) {
  if (o.kind != Override::Kind::set) return "";
  return "to add a new key write +" + o.key + "=VALUE (or ++" + o.key + "=VALUE: add or replace)";
}

// The first existing non-map on the way to `key` (adding below a scalar would silently drop it).
const Node* blocking_ancestor(const Node& tree, const std::string& key, std::string& where) {
  std::vector<std::string> parts = split_path(key);
  const Node* n = &tree;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    n = n->find(parts[i]);
    if (!n) return nullptr;
    where = join_path(where, parts[i]);
    if (!n->is_map()) return n;
  }
  return nullptr;
}

}  // namespace

Override Override::parse(const std::string& text) {
  Override o;
  o.text = text;
  o.origin = Origin::from_override(text);
  std::string_view s = text;
  if (s.starts_with("~")) {
    o.kind = Kind::erase;
    s.remove_prefix(1);
  } else if (s.starts_with("++")) {
    o.kind = Kind::force;
    s.remove_prefix(2);
  } else if (s.starts_with("+")) {
    o.kind = Kind::add;
    s.remove_prefix(1);
  }
  size_t eq = s.find('=');
  o.key = std::string(s.substr(0, eq));
  ErrorList errors;
  if (!valid_key(o.key)) {
    errors.add("", o.origin, "malformed override '" + text + "': bad key '" + o.key + "'",
               "the forms are a.b=v, +a.b=v, ++a.b=v, ~a.b and group=option");
    errors.throw_if_any();
  }
  if (eq == std::string_view::npos) {
    if (o.kind != Kind::erase) {
      errors.add(o.key, o.origin, "malformed override '" + text + "': missing '=value'",
                 "write " + o.key + "=VALUE, or ~" + o.key + " to delete the key");
      errors.throw_if_any();
    }
    return o;
  }
  try {
    o.value = parse_yaml_string(s.substr(eq + 1), o.origin);
  } catch (const ConfigError& e) {
    errors.add(o.key, o.origin, "malformed override '" + text + "': the value is not YAML",
               e.issues().empty() ? "" : e.issues()[0].message);
    errors.throw_if_any();
  }
  return o;
}

Override Override::from_flag(std::string key, Node value, std::string flag_text) {
  Override o;
  o.kind = Kind::force;
  o.origin = Origin::from_flag(std::move(flag_text));
  value.set_origin_recursive(o.origin);
  o.text = "++" + key + "=" + to_yaml(value);
  if (!o.text.empty() && o.text.back() == '\n') o.text.pop_back();
  o.key = std::move(key);
  o.value = std::move(value);
  return o;
}

void apply_overrides(Node& tree, const std::vector<Override>& overrides, ErrorList& errors) {
  for (const Override& o : overrides) {
    const std::string& key = o.key;
    Node* target = tree.find_path(key);
    std::string blocked_at;
    const Node* blocker = blocking_ancestor(tree, key, blocked_at);
    auto missing = [&](const std::string& how) {
      std::string near = suggest_key(tree, key);
      std::string hint = near.empty() ? "" : "did you mean '" + near + "'? ";
      errors.add(key, o.origin, "cannot " + how + " '" + key + "': no such key in the config",
                 hint + how_to_add(o));
    };
    switch (o.kind) {
      case Override::Kind::set:
        if (!target) {
          missing("override");
          break;
        }
        target->replace_value(*o.value);
        break;
      case Override::Kind::add:
        if (target) {
          errors.add(key, o.origin,
                     "cannot add '" + key + "': it already exists (" + target->origin().str() + ")",
                     "use " + key + "=VALUE to replace it, or ++" + key + "=VALUE");
          break;
        }
        [[fallthrough]];
      case Override::Kind::force:
        if (blocker) {
          errors.add(key, o.origin,
                     "cannot set '" + key + "': '" + blocked_at + "' is a " +
                         Node::type_name(blocker->type()) + ", not a map (" +
                         blocker->origin().str() + ")");
          break;
        }
        tree.set_path(key, *o.value);
        break;
      case Override::Kind::erase:
        if (!target) {
          missing("delete");
          break;
        }
        if (o.value && !target->same_value(*o.value)) {
          errors.add(key, o.origin,
                     "cannot delete '" + key + "': its value is not the one given (" +
                         target->origin().str() + ")",
                     "write ~" + key + " to delete whatever the value is");
          break;
        }
        tree.erase_path(key);
        break;
    }
  }
}

}  // namespace lf::config

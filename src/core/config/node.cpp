// The configuration tree: construction, dotted-path access, merging. No YAML syntax here.
#include "loongforge/core/config/node.h"

#include <algorithm>
#include <regex>

#include "loongforge/core/error.h"

namespace lf::config {

Origin Origin::from_file(std::string file, int line, int column) {
  Origin o;
  o.kind = Kind::file;
  o.file = std::move(file);
  o.line = line;
  o.column = column;
  return o;
}
Origin Origin::from_flag(std::string text) {
  Origin o;
  o.kind = Kind::flag;
  o.text = std::move(text);
  return o;
}
Origin Origin::from_override(std::string text) {
  Origin o;
  o.kind = Kind::override_;
  o.text = std::move(text);
  return o;
}
Origin Origin::from_default() {
  Origin o;
  o.kind = Kind::default_;
  return o;
}
Origin Origin::from_env(std::string variable) {
  Origin o;
  o.kind = Kind::env;
  o.text = std::move(variable);
  return o;
}

std::string Origin::str() const {
  switch (kind) {
    case Kind::file:
      return line > 0 ? file + ":" + std::to_string(line) : file;
    case Kind::flag:
      return "flag " + text;
    case Kind::override_:
      return "override " + text;
    case Kind::default_:
      return "default";
    case Kind::env:
      return "env " + text;
    case Kind::unknown:
      break;
  }
  return "<unknown origin>";
}

Node Node::null(Origin origin) {
  Node n;
  n.origin_ = std::move(origin);
  return n;
}
Node Node::scalar(std::string text, Origin origin, bool quoted) {
  Node n;
  n.type_ = Type::scalar;
  n.text_ = std::move(text);
  n.quoted_ = quoted;
  n.origin_ = std::move(origin);
  return n;
}
Node Node::map(Origin origin) {
  Node n;
  n.type_ = Type::map;
  n.origin_ = std::move(origin);
  return n;
}
Node Node::sequence(Origin origin) {
  Node n;
  n.type_ = Type::sequence;
  n.origin_ = std::move(origin);
  return n;
}

const char* Node::type_name(Type type) {
  switch (type) {
    case Type::null: return "null";
    case Type::scalar: return "scalar";
    case Type::map: return "map";
    case Type::sequence: return "sequence";
  }
  return "?";
}

void Node::set_origin_recursive(const Origin& origin) {
  origin_ = origin;
  for (Node& c : children_) c.set_origin_recursive(origin);
}

const Node* Node::find(std::string_view key) const {
  if (type_ != Type::map) return nullptr;
  for (const Node& c : children_)
    if (c.key_ == key) return &c;
  return nullptr;
}
Node* Node::find(std::string_view key) {
  return const_cast<Node*>(static_cast<const Node*>(this)->find(key));
}

Node& Node::set(std::string_view key, Node value) {
  LF_CHECK(type_ == Type::map, "Node::set('", key, "') on a ", type_name(type_));
  value.key_ = std::string(key);
  if (Node* existing = find(key)) {
    *existing = std::move(value);
    return *existing;
  }
  children_.push_back(std::move(value));
  return children_.back();
}

bool Node::erase(std::string_view key) {
  if (type_ != Type::map) return false;
  auto it = std::find_if(children_.begin(), children_.end(),
                         [&](const Node& c) { return c.key_ == key; });
  if (it == children_.end()) return false;
  children_.erase(it);
  return true;
}

std::vector<std::string> Node::keys() const {
  std::vector<std::string> out;
  if (type_ == Type::map)
    for (const Node& c : children_) out.push_back(c.key_);
  return out;
}

void Node::replace_value(Node value) {
  std::string key = std::move(key_);
  *this = std::move(value);
  key_ = std::move(key);
}

void Node::push_back(Node value) {
  LF_CHECK(type_ == Type::sequence, "Node::push_back on a ", type_name(type_));
  value.key_.clear();
  children_.push_back(std::move(value));
}

bool looks_like_non_string(std::string_view text) {
  static const std::regex re(
      R"(^(|~|null|Null|NULL|true|True|TRUE|false|False|FALSE|yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF)$|^[-+]?(\d[\d_]*)?\.?\d*([eE][-+]?\d+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$|^0x[0-9a-fA-F]+$)");
  return std::regex_match(text.begin(), text.end(), re);
}

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> parts;
  if (path.empty()) return parts;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    parts.emplace_back(path.substr(start, dot == std::string_view::npos ? path.npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::string join_path(std::string_view prefix, std::string_view key) {
  if (prefix.empty()) return std::string(key);
  if (key.empty()) return std::string(prefix);
  return std::string(prefix) + "." + std::string(key);
}

const Node* Node::find_path(std::string_view path) const {
  const Node* n = this;
  for (const std::string& part : split_path(path)) {
    n = n->find(part);
    if (!n) return nullptr;
  }
  return n;
}
Node* Node::find_path(std::string_view path) {
  return const_cast<Node*>(static_cast<const Node*>(this)->find_path(path));
}

Node& Node::set_path(std::string_view path, Node value) {
  std::vector<std::string> parts = split_path(path);
  if (parts.empty()) {
    replace_value(std::move(value));
    return *this;
  }
  Node* n = this;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!n->is_map()) n->replace_value(Node::map(value.origin()));
    Node* next = n->find(parts[i]);
    if (!next) next = &n->set(parts[i], Node::map(value.origin()));
    n = next;
  }
  if (!n->is_map()) n->replace_value(Node::map(value.origin()));
  return n->set(parts.back(), std::move(value));
}

bool Node::erase_path(std::string_view path) {
  std::vector<std::string> parts = split_path(path);
  if (parts.empty()) return false;
  Node* n = this;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    n = n->find(parts[i]);
    if (!n) return false;
  }
  return n->erase(parts.back());
}

namespace {
void collect_paths(const Node& n, const std::string& prefix, std::vector<std::string>& out) {
  if (!n.is_map()) return;
  for (const Node& c : n.children()) {
    std::string p = join_path(prefix, c.key());
    out.push_back(p);
    collect_paths(c, p, out);
  }
}
}  // namespace

std::vector<std::string> Node::all_paths() const {
  std::vector<std::string> out;
  collect_paths(*this, "", out);
  return out;
}

bool Node::same_value(const Node& other) const {
  if (type_ != other.type_) return false;
  if (type_ == Type::scalar)
    return text_ == other.text_ && (quoted_ == other.quoted_ || !looks_like_non_string(text_));
  if (children_.size() != other.children_.size()) return false;
  for (size_t i = 0; i < children_.size(); ++i) {
    if (type_ == Type::map && children_[i].key_ != other.children_[i].key_) return false;
    if (!children_[i].same_value(other.children_[i])) return false;
  }
  return true;
}

void merge_into(Node& dst, const Node& src) {
  if (dst.is_map() && src.is_map()) {
    // The section now comes from the later file (errors about it point there).
    if (src.origin().kind != Origin::Kind::unknown) dst.set_origin(src.origin());
    for (const Node& c : src.children()) {
      if (Node* existing = dst.find(c.key()))
        merge_into(*existing, c);
      else
        dst.set(c.key(), c);
    }
    return;
  }
  dst.replace_value(src);
}

void fill_missing(Node& dst, const Node& defaults) {
  if (!dst.is_map() || !defaults.is_map()) return;
  for (const Node& c : defaults.children()) {
    if (Node* existing = dst.find(c.key()))
      fill_missing(*existing, c);
    else
      dst.set(c.key(), c);
  }
}

}  // namespace lf::config

// lf::config::Node: the configuration tree (null / scalar / map / sequence) in which every value
// remembers where it came from (a file:line, a flag, an override, a schema default, the
// environment). It is a plain value type; it knows nothing of YAML syntax (config/yaml.h), of
// composition (config/compose.h) or of typed schemas (config/schema.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lf::config {

// Where a value came from. Printed by --show-origin and in every error about the value.
struct Origin {
  enum class Kind { unknown, file, flag, override_, default_, env };
  Kind kind = Kind::unknown;
  std::string file;  // kind == file: the path as displayed (relative to the cwd when under it)
  int line = 0;      // 1-based; 0 when unknown
  int column = 0;    // 1-based; 0 when unknown
  std::string text;  // kind == flag: "--lr 3e-4"; override_: "training.seed=3"; env: "VAR"

  static Origin from_file(std::string file, int line, int column = 0);
  static Origin from_flag(std::string text);
  static Origin from_override(std::string text);
  static Origin from_default();
  static Origin from_env(std::string variable);

  // "configs/x.yaml:12", "flag --lr 3e-4", "override training.seed=3", "default", "env VAR".
  std::string str() const;
  bool operator==(const Origin&) const = default;
};

// Maps keep insertion order (printing follows the files). Scalars keep their text: YAML scalars
// are typed on access (config/schema.h), so `lr: 3e-4` is read as a double by a double field and
// as "3e-4" by a string field. A quoted scalar is always a string.
class Node {
 public:
  enum class Type { null, scalar, map, sequence };

  Node() = default;  // null, unknown origin
  static Node null(Origin origin = {});
  static Node scalar(std::string text, Origin origin = {}, bool quoted = false);
  static Node map(Origin origin = {});
  static Node sequence(Origin origin = {});

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::null; }
  bool is_scalar() const { return type_ == Type::scalar; }
  bool is_map() const { return type_ == Type::map; }
  bool is_sequence() const { return type_ == Type::sequence; }
  static const char* type_name(Type type);  // "null", "scalar", "map", "sequence"

  const Origin& origin() const { return origin_; }
  void set_origin(Origin origin) { origin_ = std::move(origin); }
  // Sets the origin of this node and of every node below it.
  void set_origin_recursive(const Origin& origin);

  // Scalars. text() of a non-scalar is empty.
  const std::string& text() const { return text_; }
  bool quoted() const { return quoted_; }

  // Maps and sequences: the children, in order. For a map child, key() is its key.
  const std::vector<Node>& children() const { return children_; }
  std::vector<Node>& children() { return children_; }
  const std::string& key() const { return key_; }
  size_t size() const { return children_.size(); }

  // Map access by one key (no dots). find() returns null when absent or when this is not a map.
  const Node* find(std::string_view key) const;
  Node* find(std::string_view key);
  // Inserts or replaces `key` (appended at the end when new). This node must be a map.
  Node& set(std::string_view key, Node value);
  bool erase(std::string_view key);
  std::vector<std::string> keys() const;

  // Sequences.
  void push_back(Node value);

  // Replaces this node's value (type, text, children, origin) and keeps its key in the parent.
  void replace_value(Node value);

  // Dotted paths: "training.lr". An empty path is this node.
  const Node* find_path(std::string_view path) const;
  Node* find_path(std::string_view path);
  // Sets the value at `path`, creating maps on the way (a non-map on the way is replaced by a
  // map whose origin is `value`'s).
  Node& set_path(std::string_view path, Node value);
  bool erase_path(std::string_view path);

  // Every path in the tree below this node (maps only; sequences are leaves), depth first,
  // e.g. {"training", "training.lr", ...}. Used for "did you mean" suggestions.
  std::vector<std::string> all_paths() const;

  // Structural equality: type, text, keys, children; quotedness only where it changes the type
  // (`'3'` differs from `3`, `'x'` equals `x`). Origins are ignored.
  bool same_value(const Node& other) const;

 private:
  Type type_ = Type::null;
  std::string text_;
  bool quoted_ = false;
  std::string key_;
  std::vector<Node> children_;
  Origin origin_;
};

// Merges `src` into `dst`, Hydra/OmegaConf style: maps merge recursively, later (src) wins;
// sequences, scalars and nulls replace whatever was there.
void merge_into(Node& dst, const Node& src);

// Adds to `dst` every key of `defaults` that `dst` lacks (recursively into maps both have).
// Existing values are never touched.
void fill_missing(Node& dst, const Node& defaults);

// True when an unquoted scalar with this text reads as null, a bool or a number (YAML 1.2 core
// schema plus the 1.1 booleans): such a string must be quoted to stay a string.
bool looks_like_non_string(std::string_view text);

// Splits "a.b.c" into {"a","b","c"}; an empty string gives {}.
std::vector<std::string> split_path(std::string_view path);
std::string join_path(std::string_view prefix, std::string_view key);

}  // namespace lf::config

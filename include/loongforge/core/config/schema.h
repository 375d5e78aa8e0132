// Typed configuration structs declared once. A struct lists its fields in one `visit` method
// (gemma.cpp's VisitFields); that list drives loading from a Node (with collected errors),
// writing defaults into the tree (so --dry-run shows every value), and documentation:
//
//   struct ParallelConfig {
//     int64_t tensor_model_parallel_size = 1;
//     template <class V> void visit(V& v) {
//       v("tensor_model_parallel_size", tensor_model_parallel_size, "TP size", Min{1});
//     }
//   };
//   auto p = lf::config::load<ParallelConfig>(*tree.find("parallel"), "parallel");
//
// Field types: bool, integers, double, std::string, std::vector<T>, std::optional<T>, and nested
// structs with their own visit. Enums are strings with OneOf{...}. Any layer can load its own
// struct from any subtree (model builders validate `model.*` this way). Not a YAML parser.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/node.h"

namespace lf::config {

// Field attributes, passed after the help text in any order.
struct Min { double value; };                 // numbers (each element of a list)
struct Max { double value; };
struct OneOf { std::vector<std::string> values; };  // strings: the allowed values
struct Required {};                           // must be present in the tree (no default)

// ---- scalar conversions (schema.cpp). They return false and set `why` on a mismatch. ----
namespace detail {
bool read_bool(const Node& n, bool& out);
bool read_int64(const Node& n, int64_t& out);
bool read_double(const Node& n, double& out);
bool read_string(const Node& n, std::string& out);
std::string format_double(double v);
std::string describe_value(const Node& n);  // "'abc'", "a map", "a list", "null"
}  // namespace detail

// FieldType<T>: the name shown in errors and docs, reading from a Node, writing a Node.
template <class T, class Enable = void>
struct FieldType;

template <>
struct FieldType<bool> {
  static std::string name() { return "bool"; }
  static bool read(const Node& n, bool& out) { return detail::read_bool(n, out); }
  static Node write(bool v, const Origin& o) { return Node::scalar(v ? "true" : "false", o); }
};

template <class T>
struct FieldType<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static std::string name() { return "int"; }
  static bool read(const Node& n, T& out) {
    int64_t v = 0;
    if (!detail::read_int64(n, v)) return false;
    if constexpr (std::is_unsigned_v<T>) {
      if (v < 0 || static_cast<uint64_t>(v) > std::numeric_limits<T>::max()) return false;
    } else if constexpr (sizeof(T) < sizeof(int64_t)) {
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) return false;
    }
    out = static_cast<T>(v);
    return true;
  }
  static Node write(T v, const Origin& o) { return Node::scalar(std::to_string(v), o); }
};

template <>
struct FieldType<double> {
  static std::string name() { return "float"; }
  static bool read(const Node& n, double& out) { return detail::read_double(n, out); }
  static Node write(double v, const Origin& o) { return Node::scalar(detail::format_double(v), o); }
};

template <>
struct FieldType<std::string> {
  static std::string name() { return "string"; }
  static bool read(const Node& n, std::string& out) { return detail::read_string(n, out); }
  static Node write(const std::string& v, const Origin& o) { return Node::scalar(v, o, true); }
};

template <class T>
struct FieldType<std::optional<T>> {
  static std::string name() { return FieldType<T>::name() + " or null"; }
  static bool read(const Node& n, std::optional<T>& out) {
    if (n.is_null()) {
      out.reset();
      return true;
    }
    T v{};
    if (!FieldType<T>::read(n, v)) return false;
    out = std::move(v);
    return true;
  }
  static Node write(const std::optional<T>& v, const Origin& o) {
    return v ? FieldType<T>::write(*v, o) : Node::null(o);
  }
};

template <class T>
struct FieldType<std::vector<T>> {
  static std::string name() { return "list of " + FieldType<T>::name(); }
  static bool read(const Node& n, std::vector<T>& out) {
    if (!n.is_sequence()) return false;
    std::vector<T> r;
    for (const Node& c : n.children()) {
      T v{};
      if (!FieldType<T>::read(c, v)) return false;
      r.push_back(std::move(v));
    }
    out = std::move(r);
    return true;
  }
  static Node write(const std::vector<T>& v, const Origin& o) {
    Node s = Node::sequence(o);
    for (const T& e : v) s.push_back(FieldType<T>::write(e, o));
    return s;
  }
};

// A struct with a `visit(V&)` template: a nested section.
struct VisitProbe {
  template <class T, class... A>
  void operator()(const char*, T&, const char*, const A&...) {}
};
template <class T>
concept Visitable = requires(T& t, VisitProbe& v) { t.visit(v); };

namespace detail {
// Applies f to the value(s) a constraint talks about: the value, the engaged optional's value,
// each element of a list.
template <class T, class F>
void for_each_value(const T& v, F&& f) {
  if constexpr (requires { v.has_value(); *v; }) {
    if (v) for_each_value(*v, f);
  } else if constexpr (requires { v.begin(); v.end(); } && !std::is_same_v<T, std::string>) {
    for (const auto& e : v) for_each_value(e, f);
  } else {
    f(v);
  }
}

std::string constraint_text(const Min& a);
std::string constraint_text(const Max& a);
std::string constraint_text(const OneOf& a);
std::string constraint_text(const Required& a);

template <class T>
void check_attr(const Min& a, const T& v, const std::string& key, const Origin& o, ErrorList& e) {
  for_each_value(v, [&](const auto& x) {
    using X = std::decay_t<decltype(x)>;
    if constexpr (std::is_arithmetic_v<X>) {
      if (static_cast<double>(x) < a.value)
        e.add(key, o, "value " + FieldType<X>::write(x, o).text() + " is below the minimum " +
                          format_double(a.value));
    }
  });
}
template <class T>
void check_attr(const Max& a, const T& v, const std::string& key, const Origin& o, ErrorList& e) {
  for_each_value(v, [&](const auto& x) {
    using X = std::decay_t<decltype(x)>;
    if constexpr (std::is_arithmetic_v<X>) {
      if (static_cast<double>(x) > a.value)
        e.add(key, o, "value " + FieldType<X>::write(x, o).text() + " is above the maximum " +
                          format_double(a.value));
    }
  });
}
void check_one_of(const OneOf& a, const std::string& v, const std::string& key, const Origin& o,
                  ErrorList& e);
template <class T>
void check_attr(const OneOf& a, const T& v, const std::string& key, const Origin& o, ErrorList& e) {
  for_each_value(v, [&](const auto& x) {
    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::string>) check_one_of(a, x, key, o, e);
  });
}
template <class T>
void check_attr(const Required&, const T&, const std::string&, const Origin&, ErrorList&) {}

void report_unknown_keys(const Node& node, const std::string& prefix,
                         const std::vector<std::string>& valid, ErrorList& errors);
void report_wrong_type(const Node& node, const std::string& key, const std::string& expected,
                       ErrorList& errors);
}  // namespace detail

// Reads a struct's fields from a map node, collecting every problem: unknown keys (with the
// nearest valid key), wrong types (file:line and the expected type), missing required fields,
// constraint violations. Fields absent from the node keep their current (default) values.
class Loader {
 public:
  // node may be null (the section is absent: only required fields are reported). parent_origin
  // is where a missing required key is reported (a file:line, or unknown).
  Loader(const Node* node, std::string prefix, Origin parent_origin, ErrorList& errors)
      : node_(node), prefix_(std::move(prefix)), parent_origin_(std::move(parent_origin)),
        errors_(errors) {}

  template <class T, class... A>
  void operator()(const char* name, T& field, const char* /*help*/, const A&... attrs) {
    valid_.emplace_back(name);
    const std::string key = join_path(prefix_, name);
    const Node* child = node_ && node_->is_map() ? node_->find(name) : nullptr;
    if constexpr (Visitable<T>) {
      if (child && !child->is_map() && !child->is_null()) {
        detail::report_wrong_type(*child, key, "map (section)", errors_);
        return;
      }
      Loader sub(child && child->is_map() ? child : nullptr, key,
                 child && child->origin().kind == Origin::Kind::file ? child->origin() : Origin{},
                 errors_);
      field.visit(sub);
      sub.finish();
    } else {
      constexpr bool required = (std::is_same_v<A, Required> || ...);
      if (!child) {
        if (required)
          errors_.add(key, parent_origin_, "required key '" + key + "' is missing",
                      "set it in a config file, with a flag or with ++" + key + "=VALUE");
        return;
      }
      T value{};
      if (!FieldType<T>::read(*child, value)) {
        detail::report_wrong_type(*child, key, FieldType<T>::name(), errors_);
        return;
      }
      (detail::check_attr(attrs, value, key, child->origin(), errors_), ...);
      field = std::move(value);
    }
  }

  // A key the node may hold that no field describes (JobConfig's `model`).
  void also_valid(std::string key) { valid_.push_back(std::move(key)); }

  // Reports keys of the node that no field claimed.
  void finish() {
    if (node_) detail::report_unknown_keys(*node_, prefix_, valid_, errors_);
  }

 private:
  const Node* node_;
  std::string prefix_;
  Origin parent_origin_;
  ErrorList& errors_;
  std::vector<std::string> valid_;
};

// Writes a struct's fields as a map node (every value with `origin`). Required fields are left
// out when include_required is false (they have no meaningful default).
class Writer {
 public:
  Writer(Node& out, Origin origin, bool include_required)
      : out_(out), origin_(std::move(origin)), include_required_(include_required) {}

  template <class T, class... A>
  void operator()(const char* name, T& field, const char*, const A&...) {
    if constexpr (Visitable<T>) {
      Node sub = Node::map(origin_);
      Writer w(sub, origin_, include_required_);
      field.visit(w);
      out_.set(name, std::move(sub));
    } else {
      constexpr bool required = (std::is_same_v<A, Required> || ...);
      if (required && !include_required_) return;
      out_.set(name, FieldType<T>::write(field, origin_));
    }
  }

 private:
  Node& out_;
  Origin origin_;
  bool include_required_;
};

// One documented field: for the configuration reference and --help.
struct FieldDoc {
  std::string key;          // dotted path
  std::string type;         // FieldType<T>::name()
  std::string default_text; // YAML text of the default; "(required)" for required fields
  std::string help;
  std::string constraints;  // ">= 1", "one of: a, b", ...
};

class Describer {
 public:
  Describer(std::vector<FieldDoc>& out, std::string prefix) : out_(out), prefix_(std::move(prefix)) {}

  template <class T, class... A>
  void operator()(const char* name, T& field, const char* help, const A&... attrs) {
    const std::string key = join_path(prefix_, name);
    if constexpr (Visitable<T>) {
      Describer d(out_, key);
      field.visit(d);
    } else {
      FieldDoc doc;
      doc.key = key;
      doc.type = FieldType<T>::name();
      constexpr bool required = (std::is_same_v<A, Required> || ...);
      doc.default_text = required ? "(required)" : short_yaml(FieldType<T>::write(field, {}));
      doc.help = help;
      ((append(doc.constraints, detail::constraint_text(attrs))), ...);
      out_.push_back(std::move(doc));
    }
  }

 private:
  static void append(std::string& s, const std::string& t) {
    if (t.empty()) return;
    if (!s.empty()) s += "; ";
    s += t;
  }
  static std::string short_yaml(const Node& n);  // one-line YAML of a default
  std::vector<FieldDoc>& out_;
  std::string prefix_;
};

// ---- entry points ----

// Loads `out` from `node` (a map, or null when the section is absent); `prefix` is the node's
// dotted path, used in messages. Problems go to `errors`.
template <class T>
void load_into(const Node* node, std::string_view prefix, T& out, ErrorList& errors) {
  if (node && !node->is_map() && !node->is_null()) {
    detail::report_wrong_type(*node, std::string(prefix), "map (section)", errors);
    return;
  }
  Loader l(node && node->is_map() ? node : nullptr, std::string(prefix),
           node && node->origin().kind == Origin::Kind::file ? node->origin() : Origin{}, errors);
  out.visit(l);
  l.finish();
}

// Loads a T, throwing ConfigError with every problem found.
template <class T>
T load(const Node& node, std::string_view prefix = "") {
  T out{};
  ErrorList errors;
  load_into(&node, prefix, out, errors);
  errors.throw_if_any();
  return out;
}

// The struct as a tree.
template <class T>
Node to_node(const T& value, const Origin& origin = Origin::from_default(),
             bool include_required = true) {
  T copy = value;  // visit() takes fields by non-const reference
  Node out = Node::map(origin);
  Writer w(out, origin, include_required);
  copy.visit(w);
  return out;
}

// The defaults of T (required fields left out), every value with Origin::from_default().
template <class T>
Node defaults_node() {
  return to_node(T{}, Origin::from_default(), /*include_required=*/false);
}

template <class T>
std::vector<FieldDoc> describe(std::string_view prefix = "") {
  std::vector<FieldDoc> docs;
  T value{};
  Describer d(docs, std::string(prefix));
  value.visit(d);
  return docs;
}

// Markdown table (key, type, default, constraints, help) of FieldDocs.
std::string fields_markdown(const std::vector<FieldDoc>& docs);

// One typed value at a dotted path below `root`; throws ConfigError (missing key, wrong type).
template <class T>
T get(const Node& root, std::string_view path) {
  ErrorList errors;
  const Node* n = root.find_path(path);
  T out{};
  if (!n) {
    errors.add(std::string(path), root.origin(), "required key '" + std::string(path) + "' is missing");
  } else if (!FieldType<T>::read(*n, out)) {
    detail::report_wrong_type(*n, std::string(path), FieldType<T>::name(), errors);
  }
  errors.throw_if_any();
  return out;
}

}  // namespace lf::config

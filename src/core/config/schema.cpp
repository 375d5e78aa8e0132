// The non-template half of the typed schema: scalar conversions (YAML 1.2 core types plus the
// 1.1 booleans people still write), error reports, and documentation tables.
#include "loongforge/core/config/schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "loongforge/core/config/yaml.h"

namespace lf::config {
namespace detail {

bool read_bool(const Node& n, bool& out) {
  if (!n.is_scalar() || n.quoted()) return false;
  std::string t = n.text();
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "true" || t == "yes" || t == "on") {
    out = true;
    return true;
  }
  if (t == "false" || t == "no" || t == "off") {
    out = false;
    return true;
  }
  return false;
}

bool read_int64(const Node& n, int64_t& out) {
  if (!n.is_scalar() || n.quoted()) return false;
  std::string_view t = n.text();
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  if (t.empty()) return false;
  auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
  return ec == std::errc() && ptr == t.data() + t.size();
}

bool read_double(const Node& n, double& out) {
  if (!n.is_scalar() || n.quoted()) return false;
  const std::string& t = n.text();
  if (t == ".inf" || t == "+.inf" || t == ".Inf" || t == "+.Inf") {
    out = HUGE_VAL;
    return true;
  }
  if (t == "-.inf" || t == "-.Inf") {
    out = -HUGE_VAL;
    return true;
  }
  if (t == ".nan" || t == ".NaN") {
    out = std::nan("");
    return true;
  }
  // Digits, sign, point and exponent only: strtod would also take "inf", "nan" and hex floats,
  // which YAML spells differently.
  if (t.empty() || t.find_first_not_of("0123456789+-.eE") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

bool read_string(const Node& n, std::string& out) {
  if (!n.is_scalar()) return false;
  out = n.text();
  return true;
}

std::string format_double(double v) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, v);
  if (ec != std::errc()) return std::to_string(v);
  std::string s(buf, ptr);
  if (s == "inf") return ".inf";
  if (s == "-inf") return "-.inf";
  if (s == "nan" || s == "-nan") return ".nan";
  return s;
}

std::string describe_value(const Node& n) {
  switch (n.type()) {
    case Node::Type::null: return "null";
    case Node::Type::map: return "a map";
    case Node::Type::sequence: return "a list";
    case Node::Type::scalar: break;
  }
  return "'" + n.text() + "'" + (n.quoted() ? " (a quoted string)" : "");
}

std::string constraint_text(const Min& a) { return ">= " + format_double(a.value); }
std::string constraint_text(const Max& a) { return "<= " + format_double(a.value); }
std::string constraint_text(const OneOf& a) {
  std::string s = "one of: ";
  for (size_t i = 0; i < a.values.size(); ++i) s += (i ? ", " : "") + a.values[i];
  return s;
}
std::string constraint_text(const Required&) { return ""; }

void check_one_of(const OneOf& a, const std::string& v, const std::string& key, const Origin& o,
                  ErrorList& e) {
  for (const std::string& x : a.values)
    if (x == v) return;
  std::string near = nearest(v, a.values);
  e.add(key, o, "value '" + v + "' is not allowed; " + constraint_text(a),
        near.empty() ? "" : "did you mean '" + near + "'?");
}

void report_unknown_keys(const Node& node, const std::string& prefix,
                         const std::vector<std::string>& valid, ErrorList& errors) {
  if (!node.is_map()) return;
  for (const Node& c : node.children()) {
    if (std::find(valid.begin(), valid.end(), c.key()) != valid.end()) continue;
    const std::string key = join_path(prefix, c.key());
    std::string near = nearest(c.key(), valid);
    std::string hint;
    if (!near.empty()) {
      hint = "did you mean '" + join_path(prefix, near) + "'?";
    } else {
      hint = "valid keys" + (prefix.empty() ? std::string() : " in '" + prefix + "'") + ": ";
      for (size_t i = 0; i < valid.size(); ++i) hint += (i ? ", " : "") + valid[i];
    }
    errors.add(key, c.origin(), "unknown key '" + key + "'", hint);
  }
}

void report_wrong_type(const Node& node, const std::string& key, const std::string& expected,
                       ErrorList& errors) {
  errors.add(key, node.origin(),
             "'" + key + "' expects " + expected + ", got " + describe_value(node));
}

}  // namespace detail

std::string Describer::short_yaml(const Node& n) {
  std::string s = to_yaml(n);
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

namespace {
std::string cell(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}
}  // namespace

std::string fields_markdown(const std::vector<FieldDoc>& docs) {
  std::string out = "| key | type | default | constraints | description |\n|---|---|---|---|---|\n";
  for (const FieldDoc& d : docs) {
    out += "| `" + cell(d.key) + "` | " + cell(d.type) + " | `" + cell(d.default_text) + "` | " +
           cell(d.constraints) + " | " + cell(d.help) + " |\n";
  }
  return out;
}

}  // namespace lf::config

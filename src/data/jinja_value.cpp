// Jinja values with Python semantics: truthiness, equality, str()/repr() and json.dumps as
// Python writes them (float repr, quote choice, separators, indentation).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "jinja_ast.h"

namespace lf::data::jinja {

Value::Value(List l, Seq kind) : v_(std::make_shared<List>(std::move(l))), seq_(kind) {}

Value Value::range(int64_t start, int64_t stop, int64_t step) {
  auto r = std::make_shared<RangeList>();
  r->start = start, r->stop = stop, r->step = step;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) r->emplace_back(k);
  return Value(ListPtr(std::move(r)), Seq::range);
}

List Value::consume() const {
  if (!is_generator()) return list();
  List out;
  out.swap(*std::get<ListPtr>(v_));
  return out;
}

bool Value::consume_first(Value& out) const {
  auto& l = *std::get<ListPtr>(v_);
  if (l.empty()) return false;
  out = l.front();
  if (is_generator()) l.erase(l.begin());
  return true;
}

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return std::get<int64_t>(v_);
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(v_);
  return static_cast<double>(as_int());
}

bool Value::truthy() const {
  return std::visit(
      [this](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, None>) return false;
        else if constexpr (std::is_same_v<T, bool>) return x;
        else if constexpr (std::is_same_v<T, int64_t>) return x != 0;
        else if constexpr (std::is_same_v<T, double>) return x != 0.0;
        else if constexpr (std::is_same_v<T, std::string>) return !x.empty();
        else if constexpr (std::is_same_v<T, ListPtr>) return seq_ == Seq::generator || !x->empty();
        else if constexpr (std::is_same_v<T, DictPtr>) return !x->items.empty();
        else return true;  // namespace, callable
      },
      v_);
}

std::string Value::type_name() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return markup_ ? "Markup" : "str";
  if (is_list()) {
    switch (seq_) {
      case Seq::list: return "list";
      case Seq::tuple: return "tuple";
      case Seq::generator: return "generator";
      case Seq::range: return "range";
      case Seq::dict_items: return "dict_items";
      case Seq::dict_keys: return "dict_keys";
      case Seq::dict_values: return "dict_values";
    }
  }
  if (is_dict()) return "dict";
  if (is_namespace()) return "Namespace";
  return callable().macro ? "Macro" : "function";
}

const Value* Dict::find(const Value& key) const {
  for (const auto& kv : items)
    if (equals(kv.first, key)) return &kv.second;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& kv : items)
    if (kv.first.is_string() && kv.first.str() == key) return &kv.second;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& kv : items)
    if (equals(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* Namespace::find(std::string_view name) const {
  for (const auto& kv : attrs)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

void Namespace::set(const std::string& name, Value value) {
  for (auto& kv : attrs)
    if (kv.first == name) {
      kv.second = std::move(value);
      return;
    }
  attrs.emplace_back(name, std::move(value));
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() == b.str();
  if (a.is_none() && b.is_none()) return true;
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_list() && b.is_list()) {
    if (a.seq() != b.seq()) return false;  // Python: [1] != (1,)
    if (a.is_generator()) return &a.list() == &b.list();  // identity
    const auto &x = a.list(), &y = b.list();
    if (x.size() != y.size()) return false;
    for (size_t k = 0; k < x.size(); ++k)
      if (!equals(x[k], y[k])) return false;
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    const auto &x = a.dict(), &y = b.dict();
    if (x.items.size() != y.items.size()) return false;
    for (const auto& kv : x.items) {
      const Value* o = y.find(kv.first);
      if (!o || !equals(kv.second, *o)) return false;
    }
    return true;
  }
  if (a.is_namespace() && b.is_namespace()) return &a.ns() == &b.ns();
  if (a.is_callable() && b.is_callable()) return &a.callable() == &b.callable();
  return false;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Python's repr: the shortest round-trip digits, fixed notation when the decimal exponent is
  // in [-4, 16), else scientific with at least two exponent digits ("1e+16", "1.5e-05").
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  size_t epos = sci.find('e');
  int exp = std::stoi(sci.substr(epos + 1));
  if (exp >= -4 && exp < 16) {
    r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::fixed);
    std::string fixed(buf, r.ptr);
    if (fixed.find('.') == std::string::npos) fixed += ".0";
    return fixed;
  }
  return sci;  // to_chars writes "e+16" / "e-05" as Python does
}

namespace {

void repr_string(const std::string& s, std::string& out) {
  // Python picks single quotes unless the string holds ' and no ".
  char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  out += q;
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(q) || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
}

void repr_into(const Value& v, std::string& out) {
  if (v.is_markup()) {  // markupsafe: Markup('...')
    out += "Markup(";
    repr_string(v.str(), out);
    out += ")";
    return;
  }
  if (v.is_string()) return repr_string(v.str(), out);
  if (v.is_list()) {
    if (v.is_generator()) {
      out += "<generator object>";  // Python adds the function and an address
      return;
    }
    if (v.seq() == Seq::range) {
      const auto& r = v.range_list();
      out += "range(" + std::to_string(r.start) + ", " + std::to_string(r.stop);
      if (r.step != 1) out += ", " + std::to_string(r.step);
      out += ")";
      return;
    }
    const auto& l = v.list();
    bool view = v.seq() == Seq::dict_items || v.seq() == Seq::dict_keys || v.seq() == Seq::dict_values;
    if (view) out += v.type_name() + "(";
    out += v.is_tuple() ? '(' : '[';
    for (size_t k = 0; k < l.size(); ++k) {
      if (k) out += ", ";
      repr_into(l[k], out);
    }
    if (v.is_tuple() && l.size() == 1) out += ',';
    out += v.is_tuple() ? ')' : ']';
    if (view) out += ")";
    return;
  }
  if (v.is_dict()) {
    out += '{';
    bool first = true;
    for (const auto& kv : v.dict().items) {
      if (!first) out += ", ";
      first = false;
      repr_into(kv.first, out);
      out += ": ";
      repr_into(kv.second, out);
    }
    out += '}';
    return;
  }
  if (v.is_undefined()) {
    out += "Undefined";
    return;
  }
  out += py_str(v);
}

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char buf[16];
    if (c < 0x20) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else if (c >= 0x80 && ensure_ascii) {
      // Decode the code point and write \uXXXX (surrogate pairs above the BMP), as Python does.
      uint32_t cp = 0;
      int n = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : 1;
      cp = c & (0x3f >> n);
      for (int k = 0; k < n && i + 1 < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[++i]) & 0x3f);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

struct JsonWriter {
  const JsonOptions& o;
  std::string item_sep, key_sep, unit;
  std::string bad;

  bool write(const Value& v, int depth, std::string& out) {
    if (v.is_none()) out += "null";
    else if (v.is_bool()) out += v.as_bool() ? "true" : "false";
    else if (v.is_int()) out += std::to_string(v.as_int());
    else if (v.is_float()) {
      double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float_repr(d);
    } else if (v.is_string()) json_string(v.str(), o.ensure_ascii, out);
    else if (v.is_list() && (v.seq() == Seq::list || v.seq() == Seq::tuple)) {
      const auto& l = v.list();
      if (l.empty()) return out += "[]", true;
      out += '[';
      for (size_t k = 0; k < l.size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1, out);
        if (!write(l[k], depth + 1, out)) return false;
      }
      newline(depth, out);
      out += ']';
    } else if (v.is_dict()) {
      if (v.dict().items.empty()) return out += "{}", true;
      std::vector<std::pair<std::string, const Value*>> kv;
      for (const auto& [k, val] : v.dict().items) {
        std::string key;
        if (k.is_string()) key = k.str();
        else if (k.is_bool()) key = k.as_bool() ? "true" : "false";
        else if (k.is_int()) key = std::to_string(k.as_int());
        else if (k.is_float()) key = py_float_repr(k.as_double());
        else if (k.is_none()) key = "null";
        else return bad = "dict key of type " + k.type_name(), false;
        kv.emplace_back(std::move(key), &val);
      }
      if (o.sort_keys)
        std::stable_sort(kv.begin(), kv.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t k = 0; k < kv.size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1, out);
        json_string(kv[k].first, o.ensure_ascii, out);
        out += key_sep;
        if (!write(*kv[k].second, depth + 1, out)) return false;
      }
      newline(depth, out);
      out += '}';
    } else {
      bad = v.type_name();
      return false;
    }
    return true;
  }
  void newline(int depth, std::string& out) const {
    if (!o.has_indent) return;
    out += '\n';
    for (int k = 0; k < depth; ++k) out += unit;
  }
};

}  // namespace

std::string py_str(const Value& v) {
  if (v.is_string()) return v.str();
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_bool() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return py_float_repr(v.as_double());
  if (v.is_namespace()) return "<Namespace>";
  if (v.is_callable()) return "<" + std::string(v.callable().macro ? "Macro" : "function") + " '" + v.callable().name + "'>";
  std::string out;
  repr_into(v, out);
  return out;
}

std::string py_repr(const Value& v) {
  std::string out;
  repr_into(v, out);
  return out;
}

bool to_json(const Value& v, const JsonOptions& o, std::string& out, std::string& bad_type) {
  JsonWriter w{o, o.item_sep, o.key_sep, {}, {}};
  if (!o.custom_separators) w.item_sep = o.has_indent ? "," : ", ", w.key_sep = ": ";
  w.unit = !o.indent_str.empty() ? o.indent_str : std::string(static_cast<size_t>(std::max(0, o.indent)), ' ');
  if (!w.write(v, 0, out)) {
    bad_type = w.bad;
    return false;
  }
  return true;
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return None{};
    case nlohmann::ordered_json::value_t::boolean: return j.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer: return j.get<int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(u);
      return static_cast<double>(u);
    }
    case nlohmann::ordered_json::value_t::number_float: return j.get<double>();
    case nlohmann::ordered_json::value_t::string: return j.get<std::string>();
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& x : j) l.push_back(from_json(x));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      d->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d->items.emplace_back(Value(it.key()), from_json(it.value()));
      return Value(std::move(d));
    }
    default: return None{};  // binary / discarded: not produced by the JSON parser
  }
}

}  // namespace lf::data::jinja

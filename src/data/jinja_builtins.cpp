// Jinja builtins as jinja2 + transformers define them: filters, tests, str/dict methods and the
// globals (range, namespace, dict, raise_exception, strftime_now). String case mapping is ASCII
// only (docs/data.md); everything else follows Python.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>

#include "jinja_ast.h"

namespace lf::data::jinja {

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

List iterate(Renderer& r, const Value& v, Pos pos) {
  if (v.is_undefined()) return {};
  if (v.is_list()) return v.consume();
  if (v.is_dict()) {
    List keys;
    for (const auto& kv : v.dict().items) keys.push_back(kv.first);
    return keys;
  }
  if (v.is_string()) {
    List l;
    for (auto& c : utf8_chars(v.str())) l.push_back(std::move(c));
    return l;
  }
  r.fail(pos, "'" + v.type_name() + "' object is not iterable");
}

namespace {

using Fn = Value (*)(Renderer&, const Value&, const CallArgs&, Pos);

// Argument access by position or keyword, as Python binds them.
struct Args {
  Renderer& r;
  const CallArgs& a;
  Pos pos;
  const char* fn;
  std::vector<const char*> names;  // parameter names after the subject

  const Value* get(size_t k) const {
    if (k < a.pos.size()) return &a.pos[k];
    return k < names.size() ? a.kwarg(names[k]) : nullptr;
  }
  Value get_or(size_t k, Value def) const {
    const Value* v = get(k);
    return v ? *v : def;
  }
  void check() const {
    if (a.pos.size() > names.size())
      r.fail(pos, std::string(fn) + "() takes at most " + std::to_string(names.size()) + " argument(s), got " +
                      std::to_string(a.pos.size()));
    for (const auto& [k, v] : a.kw)
      if (std::find_if(names.begin(), names.end(), [&](const char* n) { return k == n; }) == names.end())
        r.fail(pos, std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
  }
};

Args args(Renderer& r, const CallArgs& a, Pos pos, const char* fn, std::vector<const char*> names) {
  Args x{r, a, pos, fn, std::move(names)};
  x.check();
  return x;
}

const std::string& need_str(Renderer& r, const Value& v, Pos pos, const char* what) {
  if (!v.is_string()) {
    if (v.is_undefined()) r.fail(pos, v.undefined().hint.empty() ? "an undefined value was used" : v.undefined().hint);
    r.fail(pos, std::string(what) + " expects a string, got " + v.type_name());
  }
  return v.str();
}

int64_t need_int(Renderer& r, const Value& v, Pos pos, const char* what) {
  if (!v.is_int() && !v.is_bool()) r.fail(pos, std::string(what) + " expects an integer, got " + v.type_name());
  return v.as_int();
}

bool is_py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

// str.strip/lstrip/rstrip: chars = None strips whitespace (ASCII, plus U+0085/U+00A0 and other
// Unicode spaces are kept as non-space: documented).
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<std::string> set;
  bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) set = utf8_chars(chars.str());
  auto cs = utf8_chars(s);
  size_t b = 0, e = cs.size();
  auto strip_char = [&](const std::string& c) {
    if (ws) return c.size() == 1 && is_py_space(static_cast<unsigned char>(c[0]));
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  if (left)
    while (b < e && strip_char(cs[b])) ++b;
  if (right)
    while (e > b && strip_char(cs[e - 1])) --e;
  std::string out;
  for (size_t k = b; k < e; ++k) out += cs[k];
  return out;
}

std::string ascii_lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string ascii_upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

List split(Renderer& r, const std::string& s, const Value& sep, int64_t maxsplit, Pos pos) {
  List out;
  if (sep.is_none() || sep.is_undefined()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && is_py_space(static_cast<unsigned char>(s[i]))) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = s.size();
        while (e > i && is_py_space(static_cast<unsigned char>(s[e - 1]))) --e;
        out.push_back(s.substr(i, e - i));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_py_space(static_cast<unsigned char>(s[j]))) ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = need_str(r, sep, pos, "split");
  if (d.empty()) r.fail(pos, "split: empty separator");
  size_t i = 0;
  for (;;) {
    size_t j = s.find(d, i);
    if (j == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) {
      out.push_back(s.substr(i));
      return out;
    }
    out.push_back(s.substr(i, j - i));
    i = j + d.size();
  }
}

std::string replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts repl between characters
    auto cs = utf8_chars(s);
    int64_t n = 0;
    for (size_t k = 0; k <= cs.size(); ++k) {
      if (count < 0 || n < count) out += repl, ++n;
      if (k < cs.size()) out += cs[k];
    }
    return out;
  }
  size_t i = 0;
  int64_t n = 0;
  for (;;) {
    size_t j = s.find(old, i);
    if (j == std::string::npos || (count >= 0 && n >= count)) break;
    out.append(s, i, j - i);
    out += repl;
    i = j + old.size();
    ++n;
  }
  out.append(s, i, std::string::npos);
  return out;
}

int64_t count_chars(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

Value length(Renderer& r, const Value& v, Pos pos) {
  if (v.is_string()) return count_chars(v.str());
  if (v.is_list() && !v.is_generator()) return static_cast<int64_t>(v.list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.dict().items.size());
  if (v.is_undefined()) return int64_t{0};
  r.fail(pos, "object of type '" + v.type_name() + "' has no len()");
}

// Attribute path "a.b.0" as jinja's make_attrgetter resolves it.
Value attr_path(Renderer& r, const Value& v, const std::string& path, Pos pos) {
  Value cur = v;
  size_t i = 0;
  for (;;) {
    size_t j = path.find('.', i);
    std::string part = path.substr(i, j == std::string::npos ? std::string::npos : j - i);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    cur = digits ? r.getitem(cur, Value(static_cast<int64_t>(std::stoll(part))), pos) : r.getitem(cur, Value(part), pos);
    if (j == std::string::npos) return cur;
    i = j + 1;
  }
}

// Sort key comparison; strings compare case-insensitively unless case_sensitive (jinja's
// ignore_case).
bool less(Renderer& r, const Value& a, const Value& b, bool case_sensitive, Pos pos) {
  if (!case_sensitive && a.is_string() && b.is_string()) return ascii_lower(a.str()) < ascii_lower(b.str());
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list()) {
    const auto &x = a.list(), &y = b.list();
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (less(r, x[k], y[k], case_sensitive, pos)) return true;
      if (less(r, y[k], x[k], case_sensitive, pos)) return false;
    }
    return x.size() < y.size();
  }
  r.fail(pos, "'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value tojson(Renderer& r, const Value& v, const CallArgs& a, Pos pos) {
  // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
  auto x = args(r, a, pos, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = x.get_or(0, false).truthy();
  Value indent = x.get_or(1, None{});
  if (indent.is_string()) o.has_indent = true, o.indent_str = indent.str();
  else if (!indent.is_none()) o.has_indent = true, o.indent = static_cast<int>(need_int(r, indent, pos, "tojson indent"));
  Value seps = x.get_or(2, None{});
  if (!seps.is_none()) {
    if (!seps.is_list() || seps.list().size() != 2 || !seps.list()[0].is_string() || !seps.list()[1].is_string())
      r.fail(pos, "tojson separators must be a pair of strings, e.g. (',', ': ')");
    o.custom_separators = true;
    o.item_sep = seps.list()[0].str();
    o.key_sep = seps.list()[1].str();
  }
  o.sort_keys = x.get_or(3, false).truthy();
  std::string out, bad;
  if (!to_json(v, o, out, bad)) r.fail(pos, "tojson: Object of type " + bad + " is not JSON serializable");
  return out;
}

Value select_like(Renderer& r, const Value& seq, const CallArgs& a, Pos pos, bool attr, bool keep) {
  // select(test, args...), selectattr(attr, test, args...): without a test, truthiness.
  List out;
  size_t first = attr ? 1 : 0;
  if (attr && a.pos.empty()) r.fail(pos, "selectattr/rejectattr need an attribute name");
  std::string test = a.pos.size() > first ? need_str(r, a.pos[first], pos, "select test") : "";
  if (!test.empty() && !has_test(test)) r.fail(pos, "no test named '" + test + "'");
  CallArgs targs;
  for (size_t k = first + 1; k < a.pos.size(); ++k) targs.pos.push_back(a.pos[k]);
  targs.kw = a.kw;
  for (const auto& item : iterate(r, seq, pos)) {
    Value subject = attr ? attr_path(r, item, need_str(r, a.pos[0], pos, "attribute"), pos) : item;
    bool ok = test.empty() ? subject.truthy() : call_test(r, test, subject, targs, pos);
    if (ok == keep) out.push_back(item);
  }
  return Value(std::move(out), Seq::generator);
}

Value map_filter(Renderer& r, const Value& seq, const CallArgs& a, Pos pos) {
  List out;
  if (const Value* attr = a.kwarg("attribute")) {
    const Value* def = a.kwarg("default");
    for (const auto& item : iterate(r, seq, pos)) {
      Value v = attr_path(r, item, need_str(r, *attr, pos, "map attribute"), pos);
      out.push_back(v.is_undefined() && def ? *def : v);
    }
    return Value(std::move(out), Seq::generator);
  }
  if (a.pos.empty()) r.fail(pos, "map needs a filter name or attribute=");
  std::string f = need_str(r, a.pos[0], pos, "map filter");
  if (!has_filter(f)) r.fail(pos, "no filter named '" + f + "'");
  CallArgs fargs;
  fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
  fargs.kw = a.kw;
  for (const auto& item : iterate(r, seq, pos)) out.push_back(call_filter(r, f, item, fargs, pos));
  return Value(std::move(out), Seq::generator);
}

Value sort_filter(Renderer& r, const Value& seq, const CallArgs& a, Pos pos) {
  auto x = args(r, a, pos, "sort", {"reverse", "case_sensitive", "attribute"});
  bool reverse = x.get_or(0, false).truthy(), cs = x.get_or(1, false).truthy();
  Value attribute = x.get_or(2, None{});
  List items = iterate(r, seq, pos);
  auto key = [&](const Value& v) { return attribute.is_none() ? v : attr_path(r, v, py_str(attribute), pos); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& p, const Value& q) {
    return reverse ? less(r, key(q), key(p), cs, pos) : less(r, key(p), key(q), cs, pos);
  });
  return Value(std::move(items));
}

Value minmax(Renderer& r, const Value& seq, const CallArgs& a, Pos pos, bool want_max) {
  auto x = args(r, a, pos, want_max ? "max" : "min", {"case_sensitive", "attribute"});
  bool cs = x.get_or(0, false).truthy();
  Value attribute = x.get_or(1, None{});
  List items = iterate(r, seq, pos);
  if (items.empty()) return Undefined{"No aggregated item, sequence was empty."};
  auto key = [&](const Value& v) { return attribute.is_none() ? v : attr_path(r, v, py_str(attribute), pos); };
  size_t best = 0;
  for (size_t k = 1; k < items.size(); ++k) {
    bool better = want_max ? less(r, key(items[best]), key(items[k]), cs, pos) : less(r, key(items[k]), key(items[best]), cs, pos);
    if (better) best = k;
  }
  return items[best];
}

Value round_filter(Renderer& r, const Value& v, const CallArgs& a, Pos pos) {
  auto x = args(r, a, pos, "round", {"precision", "method"});
  int64_t prec = need_int(r, x.get_or(0, int64_t{0}), pos, "round precision");
  std::string method = py_str(x.get_or(1, "common"));
  if (!v.is_number()) r.fail(pos, "round expects a number, got " + v.type_name());
  double d = v.as_double();
  if (method == "common") {
    if (!v.is_float()) return v.is_bool() ? Value(v.as_int()) : v;  // jinja: round(int, 0) -> int
    // Python's round(): correctly rounded, ties to even, on the exact binary value.
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::clamp<int64_t>(prec, 0, 300)), d);
    double rounded = std::strtod(buf, nullptr);
    if (prec < 0) {
      double m = std::pow(10.0, static_cast<double>(-prec));
      rounded = std::nearbyint(d / m) * m;
    }
    return rounded;
  }
  if (method != "ceil" && method != "floor") r.fail(pos, "round method must be 'common', 'ceil' or 'floor', got '" + method + "'");
  double m = std::pow(10.0, static_cast<double>(prec));
  return (method == "ceil" ? std::ceil(d * m) : std::floor(d * m)) / m;
}

Value indent_filter(Renderer& r, const Value& v, const CallArgs& a, Pos pos) {
  auto x = args(r, a, pos, "indent", {"width", "first", "blank"});
  Value w = x.get_or(0, int64_t{4});
  std::string ind = w.is_string() ? w.str() : std::string(static_cast<size_t>(std::max<int64_t>(0, need_int(r, w, pos, "indent width"))), ' ');
  bool first = x.get_or(1, false).truthy(), blank = x.get_or(2, false).truthy();
  std::string s = py_str(v) + "\n";
  std::vector<std::string> lines;  // str.splitlines on \n, \r\n, \r
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find_first_of("\r\n", i);
    if (j == std::string::npos) {
      lines.push_back(s.substr(i));
      break;
    }
    lines.push_back(s.substr(i, j - i));
    i = j + ((s[j] == '\r' && j + 1 < s.size() && s[j + 1] == '\n') ? 2 : 1);
  }
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) out += "\n" + ((blank || !lines[k].empty()) ? ind : std::string());
    out += lines[k];
  }
  if (first) out = ind + out;
  return out;
}

Value int_filter(Renderer& r, const Value& v, const CallArgs& a, Pos pos) {
  auto x = args(r, a, pos, "int", {"default", "base"});
  Value def = x.get_or(0, int64_t{0});
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_float()) return static_cast<int64_t>(v.as_double());
  if (v.is_string()) {
    std::string s = strip(v.str(), None{}, true, true);
    try {
      size_t used = 0;
      int64_t n = std::stoll(s, &used, static_cast<int>(x.get_or(1, int64_t{10}).as_int()));
      if (used == s.size()) return n;
      double d = std::stod(s, &used);
      if (used == s.size()) return static_cast<int64_t>(d);
    } catch (const std::exception&) {
    }
  }
  return def;
}

Value float_filter(Renderer& r, const Value& v, const CallArgs& a, Pos pos) {
  auto x = args(r, a, pos, "float", {"default"});
  if (v.is_number()) return v.as_double();
  if (v.is_string()) {
    std::string s = strip(v.str(), None{}, true, true);
    try {
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return d;
    } catch (const std::exception&) {
    }
  }
  return x.get_or(0, 0.0);
}

Value title(const std::string& s) {
  // jinja's do_title: words begin after runs of - whitespace ( { [ <.
  std::string out;
  bool start = true;
  for (char c : s) {
    bool sep = c == '-' || is_py_space(static_cast<unsigned char>(c)) || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out += c;
      start = true;
    } else {
      out += static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
      start = false;
    }
  }
  return out;
}

const std::map<std::string, Fn>& filters() {
  static const std::map<std::string, Fn> f = [] {
    std::map<std::string, Fn> m;
    m["tojson"] = tojson;
    m["trim"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      auto x = args(r, a, pos, "trim", {"chars"});
      return strip(py_str(v), x.get_or(0, None{}), true, true);
    };
    m["length"] = m["count"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "length", {});
      return length(r, v, pos);
    };
    m["default"] = m["d"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      auto x = args(r, a, pos, "default", {"default_value", "boolean"});
      bool boolean = x.get_or(1, false).truthy();
      if (v.is_undefined() || (boolean && !v.truthy())) return x.get_or(0, "");
      return v;
    };
    m["join"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      auto x = args(r, a, pos, "join", {"d", "attribute"});
      std::string sep = py_str(x.get_or(0, "")), out;
      Value attribute = x.get_or(1, None{});
      bool first = true;
      for (const auto& item : iterate(r, v, pos)) {
        if (!first) out += sep;
        first = false;
        out += py_str(attribute.is_none() ? item : attr_path(r, item, py_str(attribute), pos));
      }
      return out;
    };
    m["selectattr"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos p) { return select_like(r, v, a, p, true, true); };
    m["rejectattr"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos p) { return select_like(r, v, a, p, true, false); };
    m["select"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos p) { return select_like(r, v, a, p, false, true); };
    m["reject"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos p) { return select_like(r, v, a, p, false, false); };
    m["map"] = map_filter;
    m["first"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "first", {});
      Value first;
      if (v.is_list()) return v.consume_first(first) ? first : Value(Undefined{"No first item, sequence was empty."});
      List l = iterate(r, v, pos);
      return l.empty() ? Value(Undefined{"No first item, sequence was empty."}) : l.front();
    };
    m["last"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "last", {});
      if (v.is_generator()) r.fail(pos, "last: 'generator' object is not reversible");
      List l = iterate(r, v, pos);
      return l.empty() ? Value(Undefined{"No last item, sequence was empty."}) : l.back();
    };
    m["list"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "list", {});
      return Value(iterate(r, v, pos));
    };
    m["upper"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "upper", {});
      return ascii_upper(py_str(v));
    };
    m["lower"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "lower", {});
      return ascii_lower(py_str(v));
    };
    m["title"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "title", {});
      return title(py_str(v));
    };
    m["capitalize"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "capitalize", {});
      return capitalize(py_str(v));
    };
    m["replace"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      auto x = args(r, a, pos, "replace", {"old", "new", "count"});
      if (!x.get(0) || !x.get(1)) r.fail(pos, "replace needs the old and new strings");
      Value cnt = x.get_or(2, None{});
      return replace(py_str(v), py_str(*x.get(0)), py_str(*x.get(1)), cnt.is_none() ? -1 : need_int(r, cnt, pos, "replace count"));
    };
    m["string"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "string", {});
      return py_str(v);
    };
    m["safe"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "safe", {});
      return py_str(v);
    };
    m["escape"] = m["e"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "escape", {});
      return html_escape(py_str(v));
    };
    m["int"] = int_filter;
    m["float"] = float_filter;
    m["items"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "items", {});
      if (v.is_undefined()) return Value(List{}, Seq::generator);
      if (!v.is_dict()) r.fail(pos, "items expects a mapping, got " + v.type_name());
      List out;
      for (const auto& [k, val] : v.dict().items) out.push_back(Value(List{k, val}, Seq::tuple));
      return Value(std::move(out), Seq::generator);
    };
    m["dictsort"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      auto x = args(r, a, pos, "dictsort", {"case_sensitive", "by", "reverse"});
      if (!v.is_dict()) r.fail(pos, "dictsort expects a mapping, got " + v.type_name());
      bool cs = x.get_or(0, false).truthy(), rev = x.get_or(2, false).truthy();
      std::string by = py_str(x.get_or(1, "key"));
      if (by != "key" && by != "value") r.fail(pos, "dictsort: by must be 'key' or 'value'");
      size_t k = by == "key" ? 0 : 1;
      List out;
      for (const auto& [key, val] : v.dict().items) out.push_back(Value(List{key, val}, Seq::tuple));
      std::stable_sort(out.begin(), out.end(), [&](const Value& p, const Value& q) {
        return rev ? less(r, q.list()[k], p.list()[k], cs, pos) : less(r, p.list()[k], q.list()[k], cs, pos);
      });
      return Value(std::move(out));
    };
    m["unique"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      auto x = args(r, a, pos, "unique", {"case_sensitive", "attribute"});
      bool cs = x.get_or(0, false).truthy();
      Value attribute = x.get_or(1, None{});
      List out, seen;
      for (const auto& item : iterate(r, v, pos)) {
        Value key = attribute.is_none() ? item : attr_path(r, item, py_str(attribute), pos);
        if (!cs && key.is_string()) key = ascii_lower(key.str());
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
          seen.push_back(key);
          out.push_back(item);
        }
      }
      return Value(std::move(out), Seq::generator);
    };
    m["reverse"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "reverse", {});
      if (v.is_string()) {
        auto cs = utf8_chars(v.str());
        std::string out;
        for (size_t k = cs.size(); k-- > 0;) out += cs[k];
        return out;
      }
      // reversed(x) for sequences (an iterator); a generator becomes a reversed list.
      bool was_generator = v.is_generator();
      List l = iterate(r, v, pos);
      std::reverse(l.begin(), l.end());
      return Value(std::move(l), was_generator ? Seq::list : Seq::generator);
    };
    m["sort"] = sort_filter;
    m["sum"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      auto x = args(r, a, pos, "sum", {"attribute", "start"});
      Value attribute = x.get_or(0, None{});
      Value acc = x.get_or(1, int64_t{0});
      for (const auto& item : iterate(r, v, pos)) {
        Value t = attribute.is_none() ? item : attr_path(r, item, py_str(attribute), pos);
        if (!acc.is_number() || !t.is_number()) r.fail(pos, "sum: unsupported operand types '" + acc.type_name() + "' and '" + t.type_name() + "'");
        if (acc.is_float() || t.is_float()) acc = acc.as_double() + t.as_double();
        else acc = acc.as_int() + t.as_int();
      }
      return acc;
    };
    m["min"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos p) { return minmax(r, v, a, p, false); };
    m["max"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos p) { return minmax(r, v, a, p, true); };
    m["abs"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "abs", {});
      if (v.is_float()) return std::fabs(v.as_double());
      if (v.is_number()) return v.as_int() < 0 ? -v.as_int() : v.as_int();
      r.fail(pos, "bad operand type for abs(): '" + v.type_name() + "'");
    };
    m["round"] = round_filter;
    m["indent"] = indent_filter;
    return m;
  }();
  return f;
}

using TestFn = bool (*)(Renderer&, const Value&, const CallArgs&, Pos);

const Value& test_arg(Renderer& r, const CallArgs& a, Pos pos, const char* name) {
  if (a.pos.empty()) r.fail(pos, std::string("the test '") + name + "' needs an argument");
  return a.pos[0];
}

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> t = [] {
    std::map<std::string, TestFn> m;
    m["defined"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return !v.is_undefined(); };
    m["undefined"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_undefined(); };
    m["none"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_none(); };
    m["string"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_string(); };
    m["number"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_number(); };
    m["integer"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_int(); };
    m["float"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_float(); };
    m["boolean"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_bool(); };
    m["true"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_bool() && v.as_bool(); };
    m["false"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_bool() && !v.as_bool(); };
    m["mapping"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_dict(); };
    // Python: iter() works on strings, lists, dicts and jinja's Undefined.
    m["iterable"] = [](Renderer&, const Value& v, const CallArgs&, Pos) {
      return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
    };
    // Python: len() and __getitem__ (not generators or dict views).
    m["sequence"] = [](Renderer&, const Value& v, const CallArgs&, Pos) {
      return v.is_string() || v.is_indexable() || v.is_dict() || v.is_undefined();
    };
    m["callable"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_callable(); };
    m["odd"] = [](Renderer& r, const Value& v, const CallArgs&, Pos p) { return (need_int(r, v, p, "odd") & 1) != 0; };
    m["even"] = [](Renderer& r, const Value& v, const CallArgs&, Pos p) { return (need_int(r, v, p, "even") & 1) == 0; };
    m["divisibleby"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos p) {
      int64_t d = need_int(r, test_arg(r, a, p, "divisibleby"), p, "divisibleby");
      if (d == 0) r.fail(p, "divisibleby 0");
      return need_int(r, v, p, "divisibleby") % d == 0;
    };
    m["equalto"] = m["=="] = m["eq"] = m["sameas"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos p) {
      return equals(v, test_arg(r, a, p, "=="));
    };
    m["!="] = m["ne"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos p) { return !equals(v, test_arg(r, a, p, "!=")); };
    m["in"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos p) {
      const Value& c = test_arg(r, a, p, "in");
      for (const auto& x : iterate(r, c, p))
        if (c.is_string() ? (v.is_string() && c.str().find(v.str()) != std::string::npos) : equals(x, v)) return true;
      return false;
    };
    m["lower"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_string() && ascii_lower(v.str()) == v.str(); };
    m["upper"] = [](Renderer&, const Value& v, const CallArgs&, Pos) { return v.is_string() && ascii_upper(v.str()) == v.str(); };
    return m;
  }();
  return t;
}

Value make_builtin(std::string name, std::function<Value(Renderer&, const CallArgs&, Pos)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->builtin = std::move(fn);
  return Value(Value::CallablePtr(std::move(c)));
}

Value string_method(const Value& self, const std::string& name) {
  const std::string s = self.str();
  auto method = [&](auto fn) { return make_builtin(name, [s, fn](Renderer& r, const CallArgs& a, Pos p) { return fn(r, s, a, p); }); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", rt = name != "lstrip";
    return method([l, rt, name](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value {
      auto x = args(r, a, p, name.c_str(), {"chars"});
      Value chars = x.get_or(0, None{});
      if (!chars.is_none()) need_str(r, chars, p, name.c_str());
      return strip(str, chars, l, rt);
    });
  }
  if (name == "split")
    return method([](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value {
      auto x = args(r, a, p, "split", {"sep", "maxsplit"});
      return Value(split(r, str, x.get_or(0, None{}), need_int(r, x.get_or(1, int64_t{-1}), p, "maxsplit"), p));
    });
  if (name == "startswith" || name == "endswith") {
    bool start = name == "startswith";
    return method([start, name](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value {
      auto x = args(r, a, p, name.c_str(), {"prefix"});
      if (!x.get(0)) r.fail(p, name + "() takes at least 1 argument");
      List options = x.get(0)->is_tuple() ? x.get(0)->list() : List{*x.get(0)};
      for (const auto& o : options) {
        const std::string& q = need_str(r, o, p, name.c_str());
        if (q.size() <= str.size() && (start ? str.compare(0, q.size(), q) == 0 : str.compare(str.size() - q.size(), q.size(), q) == 0))
          return true;
      }
      return false;
    });
  }
  if (name == "replace")
    return method([](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value {
      auto x = args(r, a, p, "replace", {"old", "new", "count"});
      if (!x.get(0) || !x.get(1)) r.fail(p, "replace() needs the old and new strings");
      return replace(str, need_str(r, *x.get(0), p, "replace"), need_str(r, *x.get(1), p, "replace"),
                     need_int(r, x.get_or(2, int64_t{-1}), p, "replace count"));
    });
  if (name == "upper") return method([](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value { args(r, a, p, "upper", {}); return ascii_upper(str); });
  if (name == "lower") return method([](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value { args(r, a, p, "lower", {}); return ascii_lower(str); });
  if (name == "capitalize") return method([](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value { args(r, a, p, "capitalize", {}); return capitalize(str); });
  if (name == "title")
    return method([](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value {
      args(r, a, p, "title", {});
      std::string out;  // Python's str.title: a letter after a non-letter starts a word
      bool prev_letter = false;
      for (char c : str) {
        bool letter = std::isalpha(static_cast<unsigned char>(c));
        out += static_cast<char>(letter ? (prev_letter ? std::tolower(static_cast<unsigned char>(c)) : std::toupper(static_cast<unsigned char>(c))) : c);
        prev_letter = letter;
      }
      return out;
    });
  if (name == "find" || name == "count")
    return method([name](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value {
      auto x = args(r, a, p, name.c_str(), {"sub"});
      if (!x.get(0)) r.fail(p, name + "() takes at least 1 argument");
      const std::string& sub = need_str(r, *x.get(0), p, name.c_str());
      if (name == "find") {
        size_t k = str.find(sub);
        return k == std::string::npos ? int64_t{-1} : count_chars(str.substr(0, k));
      }
      if (sub.empty()) return count_chars(str) + 1;
      int64_t n = 0;
      for (size_t k = str.find(sub); k != std::string::npos; k = str.find(sub, k + sub.size())) ++n;
      return n;
    });
  if (name == "join")
    return method([](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value {
      auto x = args(r, a, p, "join", {"iterable"});
      if (!x.get(0)) r.fail(p, "join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const auto& item : iterate(r, *x.get(0), p)) {
        if (!first) out += str;
        first = false;
        out += need_str(r, item, p, "join");
      }
      return out;
    });
  if (name == "format")
    return method([](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value {
      // "{}" / "{0}" / "{name}" replacement fields without format specs; "{{" and "}}" escape.
      std::string out;
      size_t next = 0;
      for (size_t i = 0; i < str.size(); ++i) {
        char c = str[i];
        if ((c == '{' || c == '}') && i + 1 < str.size() && str[i + 1] == c) {
          out += c;
          ++i;
          continue;
        }
        if (c != '{') {
          if (c == '}') r.fail(p, "format(): single '}' encountered in the format string");
          out += c;
          continue;
        }
        size_t e = str.find('}', i);
        if (e == std::string::npos) r.fail(p, "format(): single '{' encountered in the format string");
        std::string field = str.substr(i + 1, e - i - 1);
        if (field.find_first_of(":!") != std::string::npos) r.fail(p, "format(): format specs and conversions are not supported");
        const Value* v = nullptr;
        if (field.empty()) {
          if (next >= a.pos.size()) r.fail(p, "format(): not enough positional arguments");
          v = &a.pos[next++];
        } else if (std::all_of(field.begin(), field.end(), [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
          size_t k = std::stoul(field);
          if (k >= a.pos.size()) r.fail(p, "format(): replacement index " + field + " out of range");
          v = &a.pos[k];
        } else {
          v = a.kwarg(field);
          if (!v) r.fail(p, "format(): no keyword argument '" + field + "'");
        }
        out += py_str(*v);
        i = e;
      }
      return out;
    });
  static const std::map<std::string, int (*)(int)> predicates = {
      {"isdigit", std::isdigit}, {"isalpha", std::isalpha}, {"isalnum", std::isalnum}, {"isspace", std::isspace}};
  if (auto it = predicates.find(name); it != predicates.end()) {
    auto pred = it->second;
    return method([pred, name](Renderer& r, const std::string& str, const CallArgs& a, Pos p) -> Value {
      args(r, a, p, name.c_str(), {});
      return !str.empty() && std::all_of(str.begin(), str.end(), [pred](char c) { return pred(static_cast<unsigned char>(c)) != 0; });
    });
  }
  return Undefined{};
}

Value dict_method(const Value& self, const std::string& name) {
  Value owner = self;
  if (name == "items" || name == "keys" || name == "values")
    return make_builtin(name, [owner, name](Renderer& r, const CallArgs& a, Pos p) -> Value {
      args(r, a, p, name.c_str(), {});
      List out;
      for (const auto& [k, v] : owner.dict().items)
        out.push_back(name == "items" ? Value(List{k, v}, Seq::tuple) : name == "keys" ? k : v);
      return Value(std::move(out), name == "items" ? Seq::dict_items : name == "keys" ? Seq::dict_keys : Seq::dict_values);
    });
  if (name == "get")
    return make_builtin(name, [owner](Renderer& r, const CallArgs& a, Pos p) -> Value {
      auto x = args(r, a, p, "get", {"key", "default"});
      if (!x.get(0)) r.fail(p, "get() takes at least 1 argument");
      const Value* v = owner.dict().find(*x.get(0));
      return v ? *v : x.get_or(1, None{});
    });
  static const char* mutating[] = {"pop", "popitem", "update", "clear", "setdefault"};
  for (const char* m : mutating)
    if (name == m) return Undefined{"access to attribute '" + name + "' of 'dict' object is unsafe (templates cannot modify their inputs)"};
  return Undefined{};
}

}  // namespace

Value bound_method(const Value& self, const std::string& name) {
  if (self.is_string()) return string_method(self, name);
  if (self.is_dict()) return dict_method(self, name);
  if (self.is_list()) {
    static const char* mutating[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
    for (const char* m : mutating)
      if (name == m) return Undefined{"access to attribute '" + name + "' of 'list' object is unsafe (templates cannot modify their inputs)"};
  }
  return Undefined{};
}

bool has_filter(const std::string& name) { return filters().count(name) > 0; }
bool has_test(const std::string& name) { return tests().count(name) > 0; }

Value call_filter(Renderer& r, const std::string& name, const Value& subject, const CallArgs& args, Pos pos) {
  auto it = filters().find(name);
  if (it == filters().end()) r.fail(pos, "no filter named '" + name + "'");
  return it->second(r, subject, args, pos);
}

bool call_test(Renderer& r, const std::string& name, const Value& subject, const CallArgs& args, Pos pos) {
  auto it = tests().find(name);
  if (it == tests().end()) r.fail(pos, "no test named '" + name + "'");
  return it->second(r, subject, args, pos);
}

void add_globals(Variables& g) {
  g.emplace_back("range", make_builtin("range", [](Renderer& r, const CallArgs& a, Pos p) -> Value {
    if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty()) r.fail(p, "range() takes 1 to 3 positional arguments");
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) stop = need_int(r, a.pos[0], p, "range");
    else start = need_int(r, a.pos[0], p, "range"), stop = need_int(r, a.pos[1], p, "range");
    if (a.pos.size() == 3) step = need_int(r, a.pos[2], p, "range");
    if (step == 0) r.fail(p, "range() arg 3 must not be zero");
    int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                         : (start > stop ? (start - stop - step - 1) / -step : 0);
    if (n > 100000) r.fail(p, "range() is too big (jinja's sandbox limit is 100000 items)");
    return Value::range(start, stop, step);
  }));
  g.emplace_back("namespace", make_builtin("namespace", [](Renderer& r, const CallArgs& a, Pos p) -> Value {
    auto ns = std::make_shared<Namespace>();
    for (const auto& v : a.pos) {
      if (!v.is_dict()) r.fail(p, "namespace() takes keyword arguments or a dict, got " + v.type_name());
      for (const auto& [k, x] : v.dict().items) ns->set(py_str(k), x);
    }
    for (const auto& [k, v] : a.kw) {
      if (!k.empty() && k[0] == '_') r.fail(p, "namespace attributes cannot start with \"_\" (\"" + k + "\")");
      ns->set(k, v);
    }
    return Value(std::move(ns));
  }));
  g.emplace_back("dict", make_builtin("dict", [](Renderer& r, const CallArgs& a, Pos p) -> Value {
    auto d = std::make_shared<Dict>();
    for (const auto& v : a.pos) {
      if (v.is_dict()) {
        for (const auto& [k, x] : v.dict().items) d->set(k, x);
      } else {
        for (const auto& kv : iterate(r, v, p)) {
          if (!kv.is_list() || kv.list().size() != 2) r.fail(p, "dict() needs a mapping or (key, value) pairs");
          d->set(kv.list()[0], kv.list()[1]);
        }
      }
    }
    for (const auto& [k, v] : a.kw) d->set(Value(k), v);
    return Value(std::move(d));
  }));
  g.emplace_back("raise_exception", make_builtin("raise_exception", [](Renderer& r, const CallArgs& a, Pos p) -> Value {
    std::string msg = a.pos.empty() ? "" : py_str(a.pos[0]);
    r.fail(p, "the template raised an error: " + msg);
  }));
  g.emplace_back("strftime_now", make_builtin("strftime_now", [](Renderer& r, const CallArgs& a, Pos p) -> Value {
    if (a.pos.size() != 1 || !a.pos[0].is_string()) r.fail(p, "strftime_now(format) takes one string");
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, a.pos[0].str().c_str(), &tm);
    return std::string(buf, n);
  }));
}

}  // namespace lf::data::jinja

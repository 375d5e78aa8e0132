// Jinja builtins as jinja2 + transformers define them, except filters and tests
// (jinja_filters.cpp): iteration, str and dict methods, the globals (range, namespace, dict,
// raise_exception, strftime_now) and the helpers both files share. String case mapping is
// ASCII only (docs/data.md); everything else follows Python.
#include "jinja_builtins.h"

#include <algorithm>
#include <set>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>

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

namespace detail {

const Value* Args::get(size_t k) const {
  if (k < a.pos.size()) return &a.pos[k];
  return k < names.size() ? a.kwarg(names[k]) : nullptr;
}

Value Args::get_or(size_t k, Value def) const {
  const Value* v = get(k);
  return v ? *v : def;
}

void Args::check() const {
  if (a.pos.size() > names.size())
    r.fail(pos, std::string(fn) + "() takes at most " + std::to_string(names.size()) + " argument(s), got " +
                    std::to_string(a.pos.size()));
  for (const auto& [k, v] : a.kw)
    if (std::find_if(names.begin(), names.end(), [&](const char* n) { return k == n; }) == names.end())
      r.fail(pos, std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
}

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

Value make_builtin(std::string name, std::function<Value(Renderer&, const CallArgs&, Pos)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->builtin = std::move(fn);
  return Value(Value::CallablePtr(std::move(c)));
}

}  // namespace detail

namespace {

using namespace detail;

Value plain_string_method(const Value& self, const std::string& name) {
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

// A Markup's methods as markupsafe 3 defines them: the string results are Markup again (split's
// items too); replace escapes its replacement, join its items, format every argument.
Value string_method(const Value& self, const std::string& name) {
  Value m = plain_string_method(self, name);
  static const std::set<std::string> markup_results = {"strip", "lstrip", "rstrip", "upper", "lower", "capitalize",
                                                       "title", "replace", "split", "join", "format"};
  if (!self.is_markup() || !m.is_callable() || !markup_results.count(name)) return m;
  return make_builtin(name, [m, name](Renderer& r, const CallArgs& a, Pos p) -> Value {
    CallArgs escaped = a;
    if (name == "format") {
      for (auto& v : escaped.pos) v = Value(markup_text(v));
      for (auto& kv : escaped.kw) kv.second = Value(markup_text(kv.second));
    } else if (name == "replace") {  // escape(new) of any value, as markupsafe
      if (escaped.pos.size() > 1) escaped.pos[1] = Value(markup_text(escaped.pos[1]));
      for (auto& kv : escaped.kw)
        if (kv.first == "new") kv.second = Value(markup_text(kv.second));
    } else if (name == "join" && !escaped.pos.empty()) {  // map(escape, iterable)
      List items = iterate(r, escaped.pos[0], p);
      for (auto& item : items) item = Value(markup_text(item));
      escaped.pos[0] = Value(std::move(items));
    }
    Value out = r.call(m, escaped, p);
    if (out.is_string()) return Value::markup(out.str());
    if (!out.is_list()) return out;
    List items = out.list();
    for (auto& item : items)
      if (item.is_string()) item = Value::markup(item.str());
    return Value(std::move(items), out.seq());
  });
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
    if (name == m) return Undefined{"access to attribute '" + name + "' of 'dict' object is unsafe. (Templates cannot modify their inputs.)"};
  return Undefined{};
}

}  // namespace

Value bound_method(const Value& self, const std::string& name) {
  if (self.is_string()) return string_method(self, name);
  if (self.is_dict()) return dict_method(self, name);
  if (self.is_list()) {
    static const char* mutating[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
    for (const char* m : mutating)
      if (name == m) return Undefined{"access to attribute '" + name + "' of 'list' object is unsafe. (Templates cannot modify their inputs.)"};
  }
  return Undefined{};
}

void add_globals(Variables& g) {
  using namespace detail;
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

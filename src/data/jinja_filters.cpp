// Jinja filters and tests as jinja2 defines them, tojson as transformers overrides it.
#include <algorithm>
#include <cmath>
#include <map>

#include "jinja_builtins.h"

namespace lf::data::jinja {

std::string detail::html_escape(const std::string& s) {
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

std::string detail::markup_text(const Value& v) { return v.is_markup() ? v.str() : html_escape(py_str(v)); }

Value detail::same_kind(const Value& like, std::string s) {
  return like.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
}

namespace {

using namespace detail;
using Fn = Value (*)(Renderer&, const Value&, const CallArgs&, Pos);

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
  // jinja2 looks at nothing (not even the arguments) when the value is falsy: none | select(...)
  // is empty.
  if (!seq.truthy()) return Value(std::move(out), Seq::generator);
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
  if (!seq.truthy()) return Value(std::move(out), Seq::generator);  // as select: none | map(...) is empty
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
  if (!has_filter(f)) r.fail(pos, "No filter named '" + f + "' found.");
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
  return same_kind(v, std::move(out));
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
      return same_kind(v, strip(py_str(v), x.get_or(0, None{}), true, true));
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
      return same_kind(v, ascii_upper(py_str(v)));
    };
    m["lower"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "lower", {});
      return same_kind(v, ascii_lower(py_str(v)));
    };
    m["title"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "title", {});
      return title(py_str(v));
    };
    m["capitalize"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "capitalize", {});
      return same_kind(v, capitalize(py_str(v)));
    };
    m["replace"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      auto x = args(r, a, pos, "replace", {"old", "new", "count"});
      if (!x.get(0) || !x.get(1)) r.fail(pos, "replace needs the old and new strings");
      Value cnt = x.get_or(2, None{});
      return replace(py_str(v), py_str(*x.get(0)), py_str(*x.get(1)), cnt.is_none() ? -1 : need_int(r, cnt, pos, "replace count"));
    };
    m["string"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "string", {});
      return v.is_markup() ? v : Value(py_str(v));  // soft_str keeps a Markup
    };
    m["safe"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "safe", {});
      return Value::markup(py_str(v));
    };
    m["escape"] = m["e"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "escape", {});
      return Value::markup(markup_text(v));  // a Markup is not escaped twice
    };
    m["int"] = int_filter;
    m["float"] = float_filter;
    m["items"] = [](Renderer& r, const Value& v, const CallArgs& a, Pos pos) -> Value {
      args(r, a, pos, "items", {});
      if (v.is_undefined()) return Value(List{}, Seq::generator);
      if (!v.is_dict()) r.fail(pos, "items: Can only get item pairs from a mapping. (got " + v.type_name() + ")");
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
        return same_kind(v, std::move(out));
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

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) > 0; }
bool has_test(const std::string& name) { return tests().count(name) > 0; }

Value call_filter(Renderer& r, const std::string& name, const Value& subject, const CallArgs& args, Pos pos) {
  auto it = filters().find(name);
  if (it == filters().end()) r.fail(pos, "No filter named '" + name + "' found.");
  return it->second(r, subject, args, pos);
}

bool call_test(Renderer& r, const std::string& name, const Value& subject, const CallArgs& args, Pos pos) {
  auto it = tests().find(name);
  if (it == tests().end()) r.fail(pos, "no test named '" + name + "'");
  return it->second(r, subject, args, pos);
}

}  // namespace lf::data::jinja

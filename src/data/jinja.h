// A Jinja2 subset for chat templates (internal to the data layer): lexer, parser to an AST and
// an evaluator with the semantics of Python jinja2 as transformers configures it
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, {% generation %}).
// Values are Python-like (ints vs floats, tuples, insertion-ordered dicts, Undefined). Not a
// general Jinja: no inheritance, includes, autoescape or Markup; docs/data.md lists the subset.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace lf::data::jinja {

class Value;
struct Dict;
struct Namespace;
struct Callable;
using List = std::vector<Value>;

// Jinja's Undefined; hint says why it is undefined ("'dict object' has no attribute 'x'").
struct Undefined {
  std::string hint;
};
struct None {};

// What a sequence value is in Python: its str(), len(), subscripting and JSON differ by kind.
// Generators (select, map, items, unique, reverse ...) are consumed by iteration, as in Python.
enum class Seq : uint8_t { list, tuple, generator, range, dict_items, dict_keys, dict_values };

// The storage of a range(): its items plus what str() prints.
struct RangeList : std::vector<Value> {
  int64_t start = 0, stop = 0, step = 1;
};

class Value {
 public:
  using ListPtr = std::shared_ptr<List>;
  using DictPtr = std::shared_ptr<Dict>;
  using NsPtr = std::shared_ptr<Namespace>;
  using CallablePtr = std::shared_ptr<const Callable>;
  using Storage = std::variant<Undefined, None, bool, int64_t, double, std::string, ListPtr,
                               DictPtr, NsPtr, CallablePtr>;

  Value() = default;
  Value(Undefined u) : v_(std::move(u)) {}
  Value(None) : v_(None{}) {}
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(double f) : v_(f) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  explicit Value(List l, Seq kind = Seq::list);
  Value(ListPtr l, Seq kind) : v_(std::move(l)), seq_(kind) {}
  static Value range(int64_t start, int64_t stop, int64_t step);
  Value(DictPtr d) : v_(std::move(d)) {}
  Value(NsPtr n) : v_(std::move(n)) {}
  Value(CallablePtr c) : v_(std::move(c)) {}
  // markupsafe's Markup: a string marked safe (the `safe` and `escape` filters). Concatenated with
  // `+` to a plain string, the plain one is HTML-escaped first; see jinja_ast.h's markup helpers.
  static Value markup(std::string s) {
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  bool is_markup() const { return markup_ && is_string(); }

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }  // not bool
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is int
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_list() const { return std::holds_alternative<ListPtr>(v_); }  // any Seq kind
  bool is_tuple() const { return is_list() && seq_ == Seq::tuple; }
  // A list, tuple or range: len(), subscripts and slices work.
  bool is_indexable() const { return is_list() && (seq_ == Seq::list || seq_ == Seq::tuple || seq_ == Seq::range); }
  bool is_generator() const { return is_list() && seq_ == Seq::generator; }
  Seq seq() const { return seq_; }
  bool is_dict() const { return std::holds_alternative<DictPtr>(v_); }
  bool is_namespace() const { return std::holds_alternative<NsPtr>(v_); }
  bool is_callable() const { return std::holds_alternative<CallablePtr>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const;  // int or bool
  double as_double() const;  // any number
  const std::string& str() const { return std::get<std::string>(v_); }
  const List& list() const { return *std::get<ListPtr>(v_); }
  // A generator's remaining items, taken out (iteration consumes it); other kinds are copied.
  List consume() const;
  // A generator's first remaining item taken out (nullptr-like Undefined when exhausted).
  bool consume_first(Value& out) const;
  const RangeList& range_list() const { return static_cast<const RangeList&>(list()); }
  const Dict& dict() const { return *std::get<DictPtr>(v_); }
  Namespace& ns() const { return *std::get<NsPtr>(v_); }
  const Callable& callable() const { return *std::get<CallablePtr>(v_); }
  const Undefined& undefined() const { return std::get<Undefined>(v_); }

  // Python's bool(x); Undefined is false.
  bool truthy() const;
  // Python's type name as jinja's messages show it ("str", "dict object" uses type_name() + ").
  std::string type_name() const;

 private:
  Storage v_;
  Seq seq_ = Seq::list;
  bool markup_ = false;
};

struct Dict {
  std::vector<std::pair<Value, Value>> items;  // insertion order, unique keys
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

struct Namespace {
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value value);
};

// Python semantics used by the evaluator and the builtins.
bool equals(const Value& a, const Value& b);  // ==, with 1 == 1.0 == True
std::string py_str(const Value& v);            // str(x); Undefined -> ""
std::string py_repr(const Value& v);           // repr(x)
std::string py_float_repr(double d);           // repr(float)
// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as Python writes it.
struct JsonOptions {
  bool has_indent = false;  // indent=None when false
  int indent = 0;           // spaces per level
  std::string indent_str;   // used instead when indent was given as a string
  bool custom_separators = false;  // else Python's defaults: ", " ": " (",", ": " with indent)
  std::string item_sep, key_sep;
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Returns false and sets bad_type when v holds something JSON cannot (Undefined, callables).
bool to_json(const Value& v, const JsonOptions& o, std::string& out, std::string& bad_type);

Value from_json(const nlohmann::ordered_json& j);

// A variable of the render context.
using Variables = std::vector<std::pair<std::string, Value>>;

struct RenderResult {
  std::string text;
  // Byte spans [begin, end) of each {% generation %} block's output, in order of completion,
  // measured as transformers does: from the top-level output written before the block.
  std::vector<std::pair<size_t, size_t>> generation;
};

struct TemplateAst;  // jinja_ast.h

class Template {
 public:
  // Parses source; name appears in every error ("chat template <name> line L, column C: ...").
  // Throws lf::Error on a syntax error or a construct outside the subset.
  Template(std::string source, std::string name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the given variables (transformers' globals are built in). Throws lf::Error on
  // a runtime error, naming the position; raise_exception's message is included verbatim.
  RenderResult render(const Variables& variables) const;
  const std::string& name() const;

 private:
  std::unique_ptr<TemplateAst> ast_;
};

}  // namespace lf::data::jinja

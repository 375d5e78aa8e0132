// The Jinja subset's syntax tree, callables and the evaluator's interface to the builtins
// (internal to jinja_*.cpp). Nodes carry their template line and column for error messages.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "jinja.h"

namespace lf::data::jinja {

struct Pos {
  int line = 1, col = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class Op {
  add, sub, mul, div, floordiv, mod, pow, concat,          // binary arithmetic and ~
  eq, ne, lt, le, gt, ge, in, not_in,                        // comparisons
  and_, or_, not_, neg, pos                                  // logic and unary
};

struct Expr {
  enum class Kind {
    literal, name, list, tuple, dict, unary, binary, compare, cond, getattr, getitem, slice, call,
    filter, test
  };
  Kind kind;
  Pos pos;
  Value value;                // literal
  std::string name;           // name; getattr attribute; filter or test name
  std::vector<Op> ops;        // unary/binary: ops[0]; compare: one per operand after the first
  bool negated = false;       // test: "is not"
  // Children: binary [a, b]; compare [a, b, c...]; cond [then, test, else?]; getattr [obj];
  // getitem [obj, key]; slice [obj, start?, stop?, step?] (null when absent); call [callee,
  // args...]; filter/test [subject, args...]; list/tuple items; dict [k0, v0, k1, v1, ...].
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // call, filter, test
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind { text, output, if_, for_, set, set_block, filter_block, macro, generation, break_, continue_, with };
  Kind kind;
  Pos pos;
  std::string text;                 // text; set_block/macro name; set namespace attribute
  ExprPtr expr;                     // output; for iterable; set value
  ExprPtr filter;                   // for ... if filter; set_block / filter_block: the filter chain,
                                    // applied to the name kBlockSubject (the rendered body)
  std::vector<std::string> targets; // for/set names (several: tuple unpacking); set ns.attr: [ns]
  std::vector<std::pair<ExprPtr, Body>> branches;  // if/elif
  Body body, else_body;             // for/macro/set_block/generation/with body; if/for else
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro params (default or null); with
};

// The name under which a {% filter %} block or a filtered {% set %} block finds its rendered body
// (not an identifier, so no template variable can shadow it).
inline constexpr const char* kBlockSubject = " block";

struct TemplateAst {
  std::string name;
  Body body;
};

// Parses a template (jinja_parser.cpp).
std::unique_ptr<TemplateAst> parse_template(const std::string& source, const std::string& name);

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(std::string_view name) const;
};

class Renderer;
struct Callable {
  std::string name;
  // A builtin (global, bound method, loop.cycle) or a macro defined by the template.
  std::function<Value(Renderer&, const CallArgs&, Pos)> builtin;
  const Node* macro = nullptr;
  std::shared_ptr<struct Frame> closure;
};

// What builtins may ask of the renderer.
class Renderer {
 public:
  explicit Renderer(const std::string& template_name) : template_name_(template_name) {}
  virtual ~Renderer() = default;
  // Throws lf::Error "chat template <name> line L, column C: message".
  [[noreturn]] void fail(Pos pos, const std::string& message) const;
  virtual Value call(const Value& callee, const CallArgs& args, Pos pos) = 0;
  virtual Value apply_filter(const std::string& name, const Value& subject, const CallArgs& args,
                             Pos pos) = 0;
  virtual bool apply_test(const std::string& name, const Value& subject, const CallArgs& args,
                          Pos pos) = 0;
  virtual Value getattr(const Value& obj, const std::string& attr, Pos pos) = 0;
  virtual Value getitem(const Value& obj, const Value& key, Pos pos) = 0;

 private:
  std::string template_name_;
};

// jinja_builtins.cpp
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value call_filter(Renderer& r, const std::string& name, const Value& subject, const CallArgs& args,
                  Pos pos);
bool call_test(Renderer& r, const std::string& name, const Value& subject, const CallArgs& args,
               Pos pos);
// A bound method of a str or dict (nullptr-valued Callable when there is none).
Value bound_method(const Value& self, const std::string& name);
// Globals: range, namespace, dict, raise_exception, strftime_now.
void add_globals(Variables& globals);
// Iteration as Python's iter(): list items, dict keys, string characters; Undefined is empty.
List iterate(Renderer& r, const Value& v, Pos pos);
// Python string helpers on UTF-8 (code point indexing).
std::vector<std::string> utf8_chars(const std::string& s);

}  // namespace lf::data::jinja

// Jinja evaluator: statements with jinja2's scoping (a for-loop iteration, a macro call and a
// with block are scopes; if is not), Python operator semantics, attribute/item lookup with
// Undefined, macros, and {% generation %} spans measured on the top-level output.
#include <algorithm>
#include <cmath>

#include "jinja_ast.h"
#include "jinja_builtins.h"
#include "loongforge/core/error.h"

namespace lf::data::jinja {

struct Frame {
  Variables vars;
  std::shared_ptr<Frame> parent;

  const Value* find(const std::string& name) const {
    for (const Frame* f = this; f; f = f->parent.get())
      for (const auto& kv : f->vars)
        if (kv.first == name) return &kv.second;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& kv : vars)
      if (kv.first == name) {
        kv.second = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

const Value* CallArgs::kwarg(std::string_view name) const {
  for (const auto& kv : kw)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

void Renderer::fail(Pos pos, const std::string& message) const {
  LF_FAIL("chat template ", template_name_, " line ", pos.line, ", column ", pos.col, ": ", message);
}

namespace {

enum class Flow { normal, break_, continue_ };
constexpr int kMaxCallDepth = 256;

std::string object_name(const Value& v) {
  if (v.is_none()) return "None";
  return "'" + v.type_name() + " object'";
}

class Evaluator final : public Renderer {
 public:
  Evaluator(const TemplateAst& ast, RenderResult& result) : Renderer(ast.name), ast_(ast), result_(result) {
    out_ = &result_.text;
  }

  void run(const Variables& variables) {
    auto root = std::make_shared<Frame>();
    add_globals(root->vars);
    for (const auto& [k, v] : variables) root->set(k, v);
    auto top = std::make_shared<Frame>();
    top->parent = root;
    exec_body(ast_.body, top);
  }

  Value call(const Value& callee, const CallArgs& args, Pos pos) override {
    if (callee.is_undefined()) fail(pos, undefined_message(callee) + " (it was called)");
    if (!callee.is_callable()) fail(pos, "'" + callee.type_name() + "' object is not callable");
    const Callable& c = callee.callable();
    if (c.builtin) return c.builtin(*this, args, pos);
    return call_macro(c, args, pos);
  }

  Value apply_filter(const std::string& name, const Value& subject, const CallArgs& args, Pos pos) override {
    return call_filter(*this, name, subject, args, pos);
  }
  bool apply_test(const std::string& name, const Value& subject, const CallArgs& args, Pos pos) override {
    return call_test(*this, name, subject, args, pos);
  }

  Value getattr(const Value& obj, const std::string& attr, Pos pos) override {
    if (obj.is_undefined()) fail(pos, undefined_message(obj));
    if (obj.is_dict()) {
      Value m = bound_method(obj, attr);
      if (!m.is_undefined() || !m.undefined().hint.empty()) return m;
      if (const Value* v = obj.dict().find(std::string_view(attr))) return *v;
      return Undefined{"'dict object' has no attribute '" + attr + "'"};
    }
    if (obj.is_namespace()) {
      if (const Value* v = obj.ns().find(attr)) return *v;
      return Undefined{"'Namespace object' has no attribute '" + attr + "'"};
    }
    Value m = bound_method(obj, attr);
    if (!m.is_undefined() || !m.undefined().hint.empty()) return m;
    return Undefined{object_name(obj) + " has no attribute '" + attr + "'"};
  }

  Value getitem(const Value& obj, const Value& key, Pos pos) override {
    if (obj.is_undefined()) fail(pos, undefined_message(obj));
    if (obj.is_dict()) {
      if (const Value* v = obj.dict().find(key)) return *v;
    } else if ((obj.is_indexable() || obj.is_string()) && (key.is_int() || key.is_bool())) {
      int64_t n = obj.is_list() ? static_cast<int64_t>(obj.list().size()) : -1;
      if (obj.is_string()) {
        auto chars = utf8_chars(obj.str());
        n = static_cast<int64_t>(chars.size());
        int64_t k = key.as_int() < 0 ? key.as_int() + n : key.as_int();
        if (k >= 0 && k < n) return detail::same_kind(obj, chars[static_cast<size_t>(k)]);
      } else {
        int64_t k = key.as_int() < 0 ? key.as_int() + n : key.as_int();
        if (k >= 0 && k < n) return obj.list()[static_cast<size_t>(k)];
      }
      return Undefined{object_name(obj) + " has no element " + py_str(key)};
    }
    if (key.is_string()) {
      // jinja2 falls back to the attribute for string keys (d['items'] is the method).
      if (obj.is_namespace() || !obj.is_dict()) return getattr(obj, key.str(), pos);
      Value m = bound_method(obj, key.str());
      if (!m.is_undefined()) return m;
      return Undefined{"'dict object' has no attribute '" + key.str() + "'"};
    }
    return Undefined{object_name(obj) + " has no element " + py_repr(key)};
  }

 private:
  const TemplateAst& ast_;
  RenderResult& result_;
  std::string* out_;
  int depth_ = 0;

  static std::string undefined_message(const Value& v) {
    const auto& h = v.undefined().hint;
    return h.empty() ? "an undefined value was used" : h;
  }

  // Renders body into a fresh string (set blocks, macros, generation blocks).
  std::string capture(const Body& body, const std::shared_ptr<Frame>& frame, Flow* flow = nullptr) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    try {
      Flow f = exec_body(body, frame);
      if (flow) *flow = f;
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return buf;
  }

  Flow exec_body(const Body& body, const std::shared_ptr<Frame>& frame) {
    for (const auto& n : body) {
      Flow f = exec(*n, frame);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  void assign(Frame& frame, const std::vector<std::string>& targets, const Value& v, Pos pos) {
    if (targets.size() == 1) return frame.set(targets[0], v);
    if (!v.is_list() && !v.is_string() && !v.is_dict())
      fail(pos, "cannot unpack a value of type " + v.type_name() + " into " + std::to_string(targets.size()) + " names");
    List items = iterate(*this, v, pos);
    if (items.size() != targets.size())
      fail(pos, (items.size() < targets.size() ? "not enough" : "too many") + std::string(" values to unpack (expected ") +
                    std::to_string(targets.size()) + ", got " + std::to_string(items.size()) + ")");
    for (size_t k = 0; k < targets.size(); ++k) frame.set(targets[k], items[k]);
  }

  Flow exec(const Node& n, const std::shared_ptr<Frame>& frame) {
    switch (n.kind) {
      case Node::Kind::text: *out_ += n.text; return Flow::normal;
      case Node::Kind::output: {
        Value v = eval(*n.expr, frame);
        *out_ += py_str(v);
        return Flow::normal;
      }
      case Node::Kind::if_:
        for (const auto& [cond, body] : n.branches)
          if (eval(*cond, frame).truthy()) return exec_body(body, frame);
        return exec_body(n.else_body, frame);
      case Node::Kind::for_: return exec_for(n, frame);
      case Node::Kind::set: {
        Value v = eval(*n.expr, frame);
        if (!n.text.empty()) {  // ns.attr = v
          const Value* target = frame->find(n.targets[0]);
          if (!target || !target->is_namespace())
            fail(n.pos, "cannot assign attribute \"" + n.text + "\" on \"" + n.targets[0] +
                            "\", which is not a namespace() object");
          if (!n.text.empty() && n.text[0] == '_')
            fail(n.pos, "namespace attributes cannot start with \"_\" (\"" + n.text + "\")");
          target->ns().set(n.text, std::move(v));
          return Flow::normal;
        }
        assign(*frame, n.targets, v, n.pos);
        return Flow::normal;
      }
      case Node::Kind::set_block: {  // the body renders in an inner scope, as in jinja2
        auto inner = std::make_shared<Frame>();
        inner->parent = frame;
        Flow flow = Flow::normal;
        Value v = capture(n.body, inner, &flow);
        if (flow != Flow::normal) return flow;  // a loop's break/continue: no assignment, as in jinja2
        if (n.filter) {
          inner->set(kBlockSubject, std::move(v));
          v = eval(*n.filter, inner);
        }
        frame->set(n.text, std::move(v));
        return Flow::normal;
      }
      case Node::Kind::filter_block: {
        auto inner = std::make_shared<Frame>();
        inner->parent = frame;
        Flow flow = Flow::normal;
        std::string body = capture(n.body, inner, &flow);
        if (flow != Flow::normal) return flow;  // a loop's break/continue: the block prints nothing
        inner->set(kBlockSubject, std::move(body));
        *out_ += py_str(eval(*n.filter, inner));
        return Flow::normal;
      }
      case Node::Kind::macro: {
        auto c = std::make_shared<Callable>();
        c->name = n.text;
        c->macro = &n;
        c->closure = frame;
        frame->set(n.text, Value(Value::CallablePtr(std::move(c))));
        return Flow::normal;
      }
      case Node::Kind::generation: {
        std::string body = capture(n.body, frame);
        size_t start = result_.text.size();
        result_.generation.emplace_back(start, start + body.size());
        *out_ += body;
        return Flow::normal;
      }
      case Node::Kind::break_: return Flow::break_;
      case Node::Kind::continue_: return Flow::continue_;
      case Node::Kind::with: {
        auto inner = std::make_shared<Frame>();
        inner->parent = frame;
        for (const auto& [name, e] : n.params) inner->set(name, eval(*e, frame));
        return exec_body(n.body, inner);
      }
    }
    return Flow::normal;
  }

  Flow exec_for(const Node& n, const std::shared_ptr<Frame>& frame) {
    Value seq = eval(*n.expr, frame);
    if (!seq.is_undefined() && !seq.is_list() && !seq.is_dict() && !seq.is_string())
      fail(n.expr->pos, "'" + seq.type_name() + "' object is not iterable");
    List items = iterate(*this, seq, n.expr->pos);
    if (n.filter) {
      List kept;
      for (auto& item : items) {
        auto f = std::make_shared<Frame>();
        f->parent = frame;
        assign(*f, n.targets, item, n.pos);
        if (eval(*n.filter, f).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      auto f = std::make_shared<Frame>();
      f->parent = frame;
      auto loop = std::make_shared<Dict>();
      loop->set("index0", k);
      loop->set("index", k + 1);
      loop->set("revindex0", len - k - 1);
      loop->set("revindex", len - k);
      loop->set("first", k == 0);
      loop->set("last", k == len - 1);
      loop->set("length", len);
      loop->set("depth", int64_t{1});
      loop->set("depth0", int64_t{0});
      loop->set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value(Undefined{"there is no previous item"}));
      loop->set("nextitem", k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value(Undefined{"there is no next item"}));
      auto cycle = std::make_shared<Callable>();
      cycle->name = "loop.cycle";
      cycle->builtin = [k](Renderer& r, const CallArgs& a, Pos p) -> Value {
        if (a.pos.empty()) r.fail(p, "loop.cycle() needs at least one argument");
        return a.pos[static_cast<size_t>(k) % a.pos.size()];
      };
      loop->set("cycle", Value(Value::CallablePtr(std::move(cycle))));
      f->set("loop", Value(Value::DictPtr(std::move(loop))));
      assign(*f, n.targets, items[static_cast<size_t>(k)], n.pos);
      Flow fl = exec_body(n.body, f);
      if (fl == Flow::break_) break;
    }
    if (len == 0) return exec_body(n.else_body, frame);
    return Flow::normal;
  }

  Value call_macro(const Callable& c, const CallArgs& args, Pos pos) {
    const Node& m = *c.macro;
    if (args.pos.size() > m.params.size())
      fail(pos, "macro '" + c.name + "' takes not more than " + std::to_string(m.params.size()) +
                    " argument(s), got " + std::to_string(args.pos.size()));
    if (++depth_ > kMaxCallDepth) {
      --depth_;
      fail(pos, "macro calls nested deeper than " + std::to_string(kMaxCallDepth) + " (runaway recursion?)");
    }
    auto f = std::make_shared<Frame>();
    f->parent = c.closure;
    for (const auto& [k, v] : args.kw) {
      bool known = std::any_of(m.params.begin(), m.params.end(), [&](const auto& p) { return p.first == k; });
      if (!known) {
        --depth_;
        fail(pos, "macro '" + c.name + "' takes no keyword argument '" + k + "'");
      }
    }
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      if (i < args.pos.size()) f->set(name, args.pos[i]);
      else if (const Value* v = args.kwarg(name)) f->set(name, *v);
      else if (def) f->set(name, eval(*def, f));
      else f->set(name, Undefined{"parameter '" + name + "' was not provided"});
    }
    std::string out;
    try {
      out = capture(m.body, f);
    } catch (...) {
      --depth_;
      throw;
    }
    --depth_;
    return out;
  }

  // Python arithmetic on ints (64-bit, overflow is an error) and floats.
  Value arith(Op op, const Value& a, const Value& b, Pos pos) {
    static const char* names[] = {"+", "-", "*", "/", "//", "%", "**"};
    auto type_error = [&]() -> Value {
      fail(pos, std::string("unsupported operand type(s) for ") + names[static_cast<int>(op)] + ": '" +
                    a.type_name() + "' and '" + b.type_name() + "'");
    };
    if (a.is_undefined()) fail(pos, undefined_message(a));
    if (b.is_undefined()) fail(pos, undefined_message(b));
    if (op == Op::add) {
      if (a.is_string() && b.is_string()) {
        // Markup + str and str + Markup escape the plain side and give a Markup (markupsafe).
        if (a.is_markup() || b.is_markup()) return Value::markup(detail::markup_text(a) + detail::markup_text(b));
        return a.str() + b.str();
      }
      if (a.is_list() && b.is_list() && a.seq() == b.seq() && (a.seq() == Seq::list || a.seq() == Seq::tuple)) {
        List l = a.list();
        l.insert(l.end(), b.list().begin(), b.list().end());
        return Value(std::move(l), a.seq());
      }
      // Python's message when a str, list or tuple is on the left and b is not addable to it.
      if (!a.is_markup() && (a.is_string() || (a.is_list() && (a.seq() == Seq::list || a.seq() == Seq::tuple)))) {
        const std::string t = a.type_name();
        fail(pos, "can only concatenate " + t + " (not \"" + b.type_name() + "\") to " + t);
      }
    }
    if (op == Op::mul) {
      auto repeatable = [](const Value& v) { return v.is_string() || (v.is_list() && (v.seq() == Seq::list || v.seq() == Seq::tuple)); };
      const Value* seq = repeatable(a) ? &a : repeatable(b) ? &b : nullptr;
      const Value* cnt = seq == &a ? &b : &a;
      if (seq && (cnt->is_int() || cnt->is_bool())) {
        int64_t n = std::max<int64_t>(0, cnt->as_int());
        if (seq->is_string()) {
          std::string s;
          for (int64_t k = 0; k < n; ++k) s += seq->str();
          return detail::same_kind(*seq, std::move(s));
        }
        List l;
        for (int64_t k = 0; k < n; ++k) l.insert(l.end(), seq->list().begin(), seq->list().end());
        return Value(std::move(l), seq->seq());
      }
    }
    if (op == Op::mod && a.is_string()) return percent_format(a.str(), b, pos, a.is_markup());
    if (!a.is_number() || !b.is_number()) type_error();
    bool ints = !a.is_float() && !b.is_float();
    if (ints) {
      int64_t x = a.as_int(), y = b.as_int(), r = 0;
      auto overflow = [&]() -> Value {
        fail(pos, "integer overflow in " + std::to_string(x) + " " + names[static_cast<int>(op)] + " " +
                      std::to_string(y) + " (integers are 64-bit here)");
      };
      switch (op) {
        case Op::add: if (__builtin_add_overflow(x, y, &r)) overflow(); return r;
        case Op::sub: if (__builtin_sub_overflow(x, y, &r)) overflow(); return r;
        case Op::mul: if (__builtin_mul_overflow(x, y, &r)) overflow(); return r;
        case Op::div:
          if (y == 0) fail(pos, "division by zero");
          return static_cast<double>(x) / static_cast<double>(y);
        case Op::floordiv: {
          if (y == 0) fail(pos, "integer division or modulo by zero");
          int64_t q = x / y;
          if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
          return q;
        }
        case Op::mod: {
          if (y == 0) fail(pos, "integer division or modulo by zero");
          int64_t m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) m += y;
          return m;
        }
        case Op::pow: {
          if (y < 0) return std::pow(static_cast<double>(x), static_cast<double>(y));
          int64_t acc = 1;
          for (int64_t k = 0; k < y; ++k)
            if (__builtin_mul_overflow(acc, x, &acc)) overflow();
          return acc;
        }
        default: break;
      }
    }
    double x = a.as_double(), y = b.as_double();
    switch (op) {
      case Op::add: return x + y;
      case Op::sub: return x - y;
      case Op::mul: return x * y;
      case Op::div:
        if (y == 0) fail(pos, "float division by zero");
        return x / y;
      case Op::floordiv:
        if (y == 0) fail(pos, "float floor division by zero");
        return std::floor(x / y);
      case Op::mod: {
        if (y == 0) fail(pos, "float modulo");
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return m;
      }
      case Op::pow: return std::pow(x, y);
      default: break;
    }
    return type_error();
  }

  // Python's printf-style "fmt % args" for %s, %r, %d, %i, %f and %%.
  // fmt % args; a Markup format escapes what %s and %r insert and gives a Markup (markupsafe).
  Value percent_format(const std::string& fmt, const Value& args, Pos pos, bool markup) {
    List items = args.is_tuple() ? args.list() : List{args};
    size_t next = 0;
    std::string out;
    for (size_t i = 0; i < fmt.size(); ++i) {
      if (fmt[i] != '%') {
        out += fmt[i];
        continue;
      }
      if (++i >= fmt.size()) fail(pos, "incomplete format: a trailing '%'");
      char c = fmt[i];
      if (c == '%') {
        out += '%';
        continue;
      }
      if (next >= items.size()) fail(pos, "not enough arguments for format string");
      const Value& v = items[next++];
      if (c == 's') out += markup ? detail::markup_text(v) : py_str(v);
      else if (c == 'r') out += markup ? detail::html_escape(py_repr(v)) : py_repr(v);
      else if (c == 'd' || c == 'i') {
        if (!v.is_number()) fail(pos, std::string("%") + c + " format: a real number is required, not " + v.type_name());
        out += std::to_string(v.is_float() ? static_cast<int64_t>(v.as_double()) : v.as_int());
      } else if (c == 'f') {
        if (!v.is_number()) fail(pos, "%f format: a real number is required, not " + v.type_name());
        char buf[64];
        std::snprintf(buf, sizeof buf, "%f", v.as_double());
        out += buf;
      } else {
        fail(pos, std::string("the %") + c + " format (or flags and widths) is not supported; use %s, %r, %d, %i, %f");
      }
    }
    if (next < items.size()) fail(pos, "not all arguments converted during string formatting");
    return markup ? Value::markup(std::move(out)) : Value(std::move(out));
  }

  // <, <=, >, >= as Python orders numbers, strings (code points) and lists.
  int order(const Value& a, const Value& b, const char* op, Pos pos) {
    if (a.is_number() && b.is_number()) {
      if (!a.is_float() && !b.is_float()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y;
    }
    if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() != b.str();
    if (a.is_indexable() && b.is_indexable() && a.seq() == b.seq() && a.seq() != Seq::range) {
      const auto &x = a.list(), &y = b.list();
      for (size_t k = 0; k < x.size() && k < y.size(); ++k)
        if (!equals(x[k], y[k])) return order(x[k], y[k], op, pos);
      return x.size() < y.size() ? -1 : x.size() > y.size();
    }
    if (a.is_undefined()) fail(pos, undefined_message(a));
    if (b.is_undefined()) fail(pos, undefined_message(b));
    fail(pos, std::string("'") + op + "' not supported between instances of '" + a.type_name() + "' and '" +
                  b.type_name() + "'");
  }

  bool contains(const Value& container, const Value& item, Pos pos) {
    if (container.is_string()) {
      if (!item.is_string())
        fail(pos, "'in <string>' requires string as left operand, not " + item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    }
    if (container.is_list()) {
      if (container.seq() == Seq::dict_items && !item.is_tuple()) return false;
      if (container.is_generator()) {  // consumes up to the match, as Python's iteration does
        for (Value x; container.consume_first(x);)
          if (equals(x, item)) return true;
        return false;
      }
      for (const auto& x : container.list())
        if (equals(x, item)) return true;
      return false;
    }
    if (container.is_dict()) return container.dict().find(item) != nullptr;
    if (container.is_undefined()) return false;  // iterating Undefined yields nothing
    fail(pos, "argument of type '" + container.type_name() + "' is not iterable");
  }

  Value slice(const Value& obj, const Expr& e, const std::shared_ptr<Frame>& frame) {
    if (obj.is_undefined()) fail(e.pos, undefined_message(obj));
    auto opt = [&](size_t k) -> std::optional<int64_t> {
      if (!e.args[k]) return std::nullopt;
      Value v = eval(*e.args[k], frame);
      if (v.is_none()) return std::nullopt;
      if (!v.is_int() && !v.is_bool()) fail(e.args[k]->pos, "slice indices must be integers or None, not " + v.type_name());
      return v.as_int();
    };
    auto start = opt(1), stop = opt(2), step_o = opt(3);
    int64_t step = step_o.value_or(1);
    if (step == 0) fail(e.pos, "slice step cannot be zero");
    std::vector<std::string> chars;
    int64_t n;
    if (obj.is_string()) {
      chars = utf8_chars(obj.str());
      n = static_cast<int64_t>(chars.size());
    } else if (obj.is_indexable()) {
      n = static_cast<int64_t>(obj.list().size());
    } else if (obj.is_list()) {
      return Undefined{object_name(obj) + " has no element slice"};
    } else {
      fail(e.pos, "'" + obj.type_name() + "' object is not subscriptable");
    }
    // Python's slice.indices().
    auto norm = [&](std::optional<int64_t> v, int64_t def) {
      if (!v) return def;
      int64_t x = *v < 0 ? *v + n : *v;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    int64_t b = norm(start, step > 0 ? 0 : n - 1), en = norm(stop, step > 0 ? n : -1);
    std::string s;
    List l;
    for (int64_t k = b; step > 0 ? k < en : k > en; k += step) {
      if (obj.is_string()) s += chars[static_cast<size_t>(k)];
      else l.push_back(obj.list()[static_cast<size_t>(k)]);
    }
    if (obj.is_string()) return detail::same_kind(obj, std::move(s));
    if (obj.seq() == Seq::range) {  // a range again, as Python's range slicing
      const auto& r = obj.range_list();
      return Value::range(r.start + b * r.step, r.start + en * r.step, r.step * step);
    }
    return Value(std::move(l), obj.seq());
  }

  CallArgs eval_args(const Expr& e, size_t first, const std::shared_ptr<Frame>& frame) {
    CallArgs a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], frame));
    for (const auto& [name, x] : e.kwargs) a.kw.emplace_back(name, eval(*x, frame));
    return a;
  }

  Value eval(const Expr& e, const std::shared_ptr<Frame>& frame) {
    switch (e.kind) {
      case Expr::Kind::literal: return e.value;
      case Expr::Kind::name: {
        if (const Value* v = frame->find(e.name)) return *v;
        return Undefined{"'" + e.name + "' is undefined"};
      }
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        List l;
        for (const auto& x : e.args) l.push_back(eval(*x, frame));
        return Value(std::move(l), e.kind == Expr::Kind::tuple ? Seq::tuple : Seq::list);
      }
      case Expr::Kind::dict: {
        auto d = std::make_shared<Dict>();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k], frame);
          if (key.is_list() && !key.is_tuple() && key.seq() != Seq::range)
            fail(e.args[k]->pos, "unhashable type: '" + key.type_name() + "'");
          if (key.is_dict()) fail(e.args[k]->pos, "unhashable type: 'dict'");
          d->set(std::move(key), eval(*e.args[k + 1], frame));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::unary: {
        Value v = eval(*e.args[0], frame);
        if (e.ops[0] == Op::not_) return !v.truthy();
        if (v.is_undefined()) fail(e.pos, undefined_message(v));
        if (!v.is_number()) fail(e.pos, std::string("bad operand type for unary ") + (e.ops[0] == Op::neg ? "-" : "+") + ": '" + v.type_name() + "'");
        if (e.ops[0] == Op::pos) return v.is_bool() ? Value(v.as_int()) : v;
        if (v.is_float()) return -v.as_double();
        if (v.as_int() == INT64_MIN) fail(e.pos, "integer overflow in unary -");
        return -v.as_int();
      }
      case Expr::Kind::binary: {
        Op op = e.ops[0];
        Value a = eval(*e.args[0], frame);
        if (op == Op::and_) return a.truthy() ? eval(*e.args[1], frame) : a;
        if (op == Op::or_) return a.truthy() ? a : eval(*e.args[1], frame);
        Value b = eval(*e.args[1], frame);
        if (op == Op::concat) return py_str(a) + py_str(b);
        return arith(op, a, b, e.pos);
      }
      case Expr::Kind::compare: {
        Value a = eval(*e.args[0], frame);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value b = eval(*e.args[k + 1], frame);
          bool ok;
          switch (e.ops[k]) {
            case Op::eq: ok = equals(a, b); break;
            case Op::ne: ok = !equals(a, b); break;
            case Op::lt: ok = order(a, b, "<", e.pos) < 0; break;
            case Op::le: ok = order(a, b, "<=", e.pos) <= 0; break;
            case Op::gt: ok = order(a, b, ">", e.pos) > 0; break;
            case Op::ge: ok = order(a, b, ">=", e.pos) >= 0; break;
            case Op::in: ok = contains(b, a, e.pos); break;
            default: ok = !contains(b, a, e.pos); break;
          }
          if (!ok) return false;
          a = std::move(b);
        }
        return true;
      }
      case Expr::Kind::cond: {
        if (eval(*e.args[1], frame).truthy()) return eval(*e.args[0], frame);
        if (e.args.size() > 2) return eval(*e.args[2], frame);
        return Undefined{"the inline if expression on line " + std::to_string(e.pos.line) +
                         " evaluated to false and no else section was defined"};
      }
      case Expr::Kind::getattr: return getattr(eval(*e.args[0], frame), e.name, e.pos);
      case Expr::Kind::getitem: {
        Value obj = eval(*e.args[0], frame);
        return getitem(obj, eval(*e.args[1], frame), e.pos);
      }
      case Expr::Kind::slice: return slice(eval(*e.args[0], frame), e, frame);
      case Expr::Kind::call: {
        Value callee = eval(*e.args[0], frame);
        return call(callee, eval_args(e, 1, frame), e.pos);
      }
      case Expr::Kind::filter: {
        Value subject = eval(*e.args[0], frame);
        if (!has_filter(e.name)) fail(e.pos, "No filter named '" + e.name + "' found. (docs/data.md lists the supported filters)");
        return call_filter(*this, e.name, subject, eval_args(e, 1, frame), e.pos);
      }
      case Expr::Kind::test: {
        Value subject = eval(*e.args[0], frame);
        if (!has_test(e.name)) fail(e.pos, "no test named '" + e.name + "' (docs/data.md lists the supported tests)");
        bool r = call_test(*this, e.name, subject, eval_args(e, 1, frame), e.pos);
        return e.negated ? !r : r;
      }
    }
    fail(e.pos, "internal: unknown expression kind");
  }
};

}  // namespace

Template::Template(std::string source, std::string name) : ast_(parse_template(source, name)) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;
const std::string& Template::name() const { return ast_->name; }

RenderResult Template::render(const Variables& variables) const {
  RenderResult r;
  Evaluator ev(*ast_, r);
  ev.run(variables);
  return r;
}

}  // namespace lf::data::jinja

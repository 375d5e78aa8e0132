// Jinja parser: tokens (jinja_lexer.h) -> TemplateAst, with jinja2's grammar and precedence
// (filters and tests bind tighter than arithmetic; "not" looser than comparisons). The source's
// newlines are normalized to "\n" and one trailing newline is dropped (keep_trailing_newline=False).
#include <cstring>
#include <set>

#include "jinja_ast.h"
#include "jinja_lexer.h"
#include "loongforge/core/error.h"

namespace lf::data::jinja {
namespace {

std::unique_ptr<Node> new_node(Node::Kind kind, Pos pos) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->pos = pos;
  return n;
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name) : t_(std::move(tokens)), name_(name) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, end);
    return b;
  }

 private:
  std::vector<Token> t_;
  size_t i_ = 0;
  const std::string& name_;

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Token::Type::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Token::Type::name && cur().text == n; }
  [[noreturn]] void fail(const Token& t, const std::string& what) const {
    LF_FAIL("chat template ", name_, " line ", t.pos.line, ", column ", t.pos.col, ": ", what);
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Token::Type::eof: return "the end of the template";
      case Token::Type::block_end: return "the end of the tag";
      case Token::Type::var_end: return "\"}}\"";
      case Token::Type::string: return "a string";
      case Token::Type::integer: case Token::Type::floating: return "a number";
      default: return "\"" + t.text + "\"";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(cur(), std::string("expected \"") + op + "\", found " + describe(cur()));
    ++i_;
  }
  std::string expect_name(const char* what) {
    if (cur().type != Token::Type::name) fail(cur(), std::string("expected ") + what + ", found " + describe(cur()));
    return t_[i_++].text;
  }
  void expect_block_end(const std::string& tag) {
    if (cur().type != Token::Type::block_end)
      fail(cur(), "expected the end of the \"" + tag + "\" tag, found " + describe(cur()));
    ++i_;
  }

  // Statements until one of end_tags ({% name %}); the tag name found is returned in `end`
  // (its block begin and name consumed, the rest of the tag not).
  Body parse_body(const std::set<std::string>& end_tags, std::string& end) {
    Body body;
    for (;;) {
      const Token& t = cur();
      if (t.type == Token::Type::eof) {
        if (!end_tags.empty()) {
          std::string want;
          for (const auto& e : end_tags) want += (want.empty() ? "" : " or ") + std::string("{% ") + e + " %}";
          fail(t, "unexpected end of the template, expected " + want);
        }
        return body;
      }
      if (t.type == Token::Type::text) {
        auto n = new_node(Node::Kind::text, t.pos);
        n->text = t.text;
        body.push_back(std::move(n));
        ++i_;
      } else if (t.type == Token::Type::var_begin) {
        ++i_;
        auto n = new_node(Node::Kind::output, t.pos);
        n->expr = parse_expression();
        if (cur().type != Token::Type::var_end) fail(cur(), "expected \"}}\", found " + describe(cur()));
        ++i_;
        body.push_back(std::move(n));
      } else if (t.type == Token::Type::block_begin) {
        ++i_;
        const Token& nt = cur();
        if (nt.type != Token::Type::name) fail(nt, "expected a tag name after \"{%\", found " + describe(nt));
        if (end_tags.count(nt.text)) {
          end = nt.text;
          ++i_;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        fail(t, "unexpected " + describe(t));
      }
    }
  }

  std::unique_ptr<Node> parse_statement() {
    DepthGuard guard(*this);
    const Token& t = cur();
    std::string tag = t.text;
    ++i_;
    auto node = new_node(Node::Kind::text, t.pos);
    std::string end;
    if (tag == "if") {
      node->kind = Node::Kind::if_;
      ExprPtr cond = parse_expression();
      for (;;) {
        expect_block_end(tag);
        Body b = parse_body({"elif", "else", "endif"}, end);
        node->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "elif") {
          cond = parse_expression();
          continue;
        }
        if (end == "else") {
          expect_block_end("else");
          node->else_body = parse_body({"endif"}, end);
        }
        expect_block_end(end);
        break;
      }
    } else if (tag == "for") {
      node->kind = Node::Kind::for_;
      node->targets = parse_targets();
      if (!is_name("in")) fail(cur(), "expected \"in\" in the for tag, found " + describe(cur()));
      ++i_;
      node->expr = parse_ternary(false);
      if (is_name("if")) {
        ++i_;
        node->filter = parse_ternary(true);
      }
      if (is_name("recursive")) fail(cur(), "recursive for loops are not supported");
      expect_block_end(tag);
      node->body = parse_body({"else", "endfor"}, end);
      if (end == "else") {
        expect_block_end("else");
        node->else_body = parse_body({"endfor"}, end);
      }
      expect_block_end(end);
    } else if (tag == "set") {
      std::string first = expect_name("a variable name");
      if (is_op(".")) {
        ++i_;
        node->kind = Node::Kind::set;
        node->targets = {first};
        node->text = expect_name("an attribute name");
        expect_op("=");
        node->expr = parse_tuple_expression();
        expect_block_end(tag);
      } else if (cur().type == Token::Type::block_end || is_op("|")) {
        // {% set name %}...{% endset %}, or {% set name | filter(args) | ... %}...{% endset %}
        node->kind = Node::Kind::set_block;
        node->text = first;
        if (is_op("|")) node->filter = parse_block_filters(block_subject(cur().pos), false);
        expect_block_end(tag);
        node->body = parse_body({"endset"}, end);
        expect_block_end(end);
      } else {
        node->kind = Node::Kind::set;
        node->targets = {first};
        while (is_op(",")) {
          ++i_;
          node->targets.push_back(expect_name("a variable name"));
        }
        expect_op("=");
        node->expr = parse_tuple_expression();
        expect_block_end(tag);
      }
    } else if (tag == "macro") {
      node->kind = Node::Kind::macro;
      node->text = expect_name("a macro name");
      expect_op("(");
      while (!is_op(")")) {
        if (!node->params.empty()) expect_op(",");
        if (is_op(")")) break;
        std::string p = expect_name("a parameter name");
        ExprPtr def;
        if (is_op("=")) {
          ++i_;
          def = parse_expression();
        }
        node->params.emplace_back(p, std::move(def));
      }
      ++i_;
      expect_block_end(tag);
      node->body = parse_body({"endmacro"}, end);
      expect_block_end(end);
    } else if (tag == "generation") {
      node->kind = Node::Kind::generation;
      expect_block_end(tag);
      node->body = parse_body({"endgeneration"}, end);
      expect_block_end(end);
    } else if (tag == "filter") {
      // {% filter name(args) | name2 %}...{% endfilter %}: the rendered body through the filters.
      node->kind = Node::Kind::filter_block;
      node->filter = parse_block_filters(block_subject(cur().pos), true);
      expect_block_end(tag);
      node->body = parse_body({"endfilter"}, end);
      expect_block_end(end);
    } else if (tag == "break" || tag == "continue") {
      node->kind = tag == "break" ? Node::Kind::break_ : Node::Kind::continue_;
      expect_block_end(tag);
    } else if (tag == "with") {
      node->kind = Node::Kind::with;
      while (cur().type != Token::Type::block_end) {
        if (!node->params.empty()) expect_op(",");
        std::string n = expect_name("a variable name");
        expect_op("=");
        node->params.emplace_back(n, parse_expression());
      }
      expect_block_end(tag);
      node->body = parse_body({"endwith"}, end);
      expect_block_end(end);
    } else {
      static const std::set<std::string> known_unsupported = {
          "include", "import", "from", "extends", "block", "call", "raw", "do", "autoescape", "trans"};
      if (known_unsupported.count(tag))
        fail(t, "the {% " + tag + " %} tag is not supported by LoongForge's Jinja subset (docs/data.md lists it)");
      fail(t, "unknown tag \"" + tag + "\"");
    }
    return node;
  }

  // The filters of a {% filter %} block (its first without "|") or a filtered {% set %} block:
  // `name(args) | name2 ...` and nothing else (no tests or calls), as jinja2's parse_filter.
  ExprPtr parse_block_filters(ExprPtr e, bool first_without_bar) {
    for (bool first = first_without_bar; first || is_op("|"); first = false) {
      if (!first) ++i_;
      e = parse_one_filter(std::move(e), "a filter name");
    }
    return e;
  }

  // `name(args)` (the "|" consumed) applied to e.
  ExprPtr parse_one_filter(ExprPtr e, const char* what) {
    auto f = make(Expr::Kind::filter, cur().pos);
    f->name = expect_name(what);
    while (is_op(".")) {
      ++i_;
      f->name += "." + expect_name("a filter name");
    }
    f->args.push_back(std::move(e));
    if (is_op("(")) parse_call_args(*f);
    return f;
  }

  ExprPtr block_subject(Pos p) {
    auto e = make(Expr::Kind::name, p);
    e->name = kBlockSubject;
    return e;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = is_op("(");
    if (paren) ++i_;
    names.push_back(expect_name("a loop variable"));
    while (is_op(",")) {
      ++i_;
      names.push_back(expect_name("a loop variable"));
    }
    if (paren) expect_op(")");
    return names;
  }

  ExprPtr make(Expr::Kind k, Pos p) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = p;
    return e;
  }

  // "a, b" without parentheses is a tuple (set statements).
  ExprPtr parse_tuple_expression() {
    Pos p = cur().pos;
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::tuple, p);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().type == Token::Type::block_end) break;
      t->args.push_back(parse_expression());
    }
    return t;
  }

  ExprPtr parse_expression() { return parse_ternary(true); }

  // Bounds the recursion of nested expressions and blocks (a stack overflow on a hostile template).
  struct DepthGuard {
    Parser& p;
    DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxDepth) p.fail(p.cur(), "expressions or blocks nested deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    ~DepthGuard() { --p.depth_; }
  };
  static constexpr int kMaxDepth = 200;
  int depth_ = 0;

  ExprPtr parse_ternary(bool with_cond) {
    DepthGuard guard(*this);
    ExprPtr e = parse_or();
    while (with_cond && is_name("if")) {
      Pos p = cur().pos;
      ++i_;
      auto c = make(Expr::Kind::cond, p);
      ExprPtr test = parse_or();
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(test));
      if (is_name("else")) {
        ++i_;
        c->args.push_back(parse_ternary(true));
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Op op, ExprPtr a, ExprPtr b, Pos p) {
    auto e = make(Expr::Kind::binary, p);
    e->ops = {op};
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      Pos p = cur().pos;
      ++i_;
      e = binary(Op::or_, std::move(e), parse_and(), p);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      Pos p = cur().pos;
      ++i_;
      e = binary(Op::and_, std::move(e), parse_not(), p);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      Pos p = cur().pos;
      ++i_;
      auto e = make(Expr::Kind::unary, p);
      e->ops = {Op::not_};
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    Pos p = cur().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    for (;;) {
      Op op;
      if (is_op("==")) op = Op::eq;
      else if (is_op("!=")) op = Op::ne;
      else if (is_op("<")) op = Op::lt;
      else if (is_op("<=")) op = Op::le;
      else if (is_op(">")) op = Op::gt;
      else if (is_op(">=")) op = Op::ge;
      else if (is_name("in")) op = Op::in;
      else if (is_name("not") && peek().type == Token::Type::name && peek().text == "in") {
        op = Op::not_in;
        ++i_;
      } else break;
      ++i_;
      if (!cmp) {
        cmp = make(Expr::Kind::compare, p);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      Pos p = cur().pos;
      Op op = is_op("+") ? Op::add : Op::sub;
      ++i_;
      e = binary(op, std::move(e), parse_concat(), p);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      Pos p = cur().pos;
      ++i_;
      e = binary(Op::concat, std::move(e), parse_math2(), p);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    for (;;) {
      Op op;
      if (is_op("*")) op = Op::mul;
      else if (is_op("/")) op = Op::div;
      else if (is_op("//")) op = Op::floordiv;
      else if (is_op("%")) op = Op::mod;
      else break;
      Pos p = cur().pos;
      ++i_;
      e = binary(op, std::move(e), parse_pow(), p);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      Pos p = cur().pos;
      ++i_;
      e = binary(Op::pow, std::move(e), parse_unary(true), p);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      Pos p = cur().pos;
      Op op = is_op("-") ? Op::neg : Op::pos;
      ++i_;
      e = make(Expr::Kind::unary, p);
      e->ops = {op};
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    Pos p = t.pos;
    switch (t.type) {
      case Token::Type::name: {
        ++i_;
        auto e = make(Expr::Kind::literal, p);
        if (t.text == "true" || t.text == "True") e->value = true;
        else if (t.text == "false" || t.text == "False") e->value = false;
        else if (t.text == "none" || t.text == "None") e->value = None{};
        else {
          e->kind = Expr::Kind::name;
          e->name = t.text;
        }
        return e;
      }
      case Token::Type::string: {
        std::string s;
        while (cur().type == Token::Type::string) s += t_[i_++].text;  // adjacent literals join
        auto e = make(Expr::Kind::literal, p);
        e->value = s;
        return e;
      }
      case Token::Type::integer: {
        ++i_;
        auto e = make(Expr::Kind::literal, p);
        e->value = t.i;
        return e;
      }
      case Token::Type::floating: {
        ++i_;
        auto e = make(Expr::Kind::literal, p);
        e->value = t.f;
        return e;
      }
      case Token::Type::op:
        if (t.text == "(") {
          ++i_;
          if (is_op(")")) {
            ++i_;
            return make(Expr::Kind::tuple, p);
          }
          ExprPtr first = parse_expression();
          if (is_op(")")) {
            ++i_;
            return first;
          }
          auto tup = make(Expr::Kind::tuple, p);
          tup->args.push_back(std::move(first));
          while (is_op(",")) {
            ++i_;
            if (is_op(")")) break;
            tup->args.push_back(parse_expression());
          }
          expect_op(")");
          return tup;
        }
        if (t.text == "[") {
          ++i_;
          auto l = make(Expr::Kind::list, p);
          while (!is_op("]")) {
            if (!l->args.empty()) expect_op(",");
            if (is_op("]")) break;
            l->args.push_back(parse_expression());
          }
          ++i_;
          return l;
        }
        if (t.text == "{") {
          ++i_;
          auto d = make(Expr::Kind::dict, p);
          while (!is_op("}")) {
            if (!d->args.empty()) expect_op(",");
            if (is_op("}")) break;
            d->args.push_back(parse_expression());
            expect_op(":");
            d->args.push_back(parse_expression());
          }
          ++i_;
          return d;
        }
        [[fallthrough]];
      default: fail(t, "expected an expression, found " + describe(t));
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      Pos p = cur().pos;
      if (is_op(".")) {
        ++i_;
        if (cur().type == Token::Type::integer) {
          auto g = make(Expr::Kind::getitem, p);
          auto k = make(Expr::Kind::literal, cur().pos);
          k->value = cur().i;
          ++i_;
          g->args.push_back(std::move(e));
          g->args.push_back(std::move(k));
          e = std::move(g);
          continue;
        }
        auto g = make(Expr::Kind::getattr, p);
        g->name = expect_name("an attribute name after \".\"");
        g->args.push_back(std::move(e));
        e = std::move(g);
      } else if (is_op("[")) {
        ++i_;
        e = parse_subscript(std::move(e), p);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, Pos p) {
    ExprPtr parts[3];
    int colons = 0;
    for (;;) {
      if (is_op("]")) break;
      if (is_op(":")) {
        if (++colons > 2) fail(cur(), "a slice has at most two \":\"");
        ++i_;
        continue;
      }
      if (parts[colons]) fail(cur(), "expected \":\" or \"]\", found " + describe(cur()));
      parts[colons] = parse_expression();
    }
    ++i_;
    if (colons == 0) {
      if (!parts[0]) fail(cur(), "empty subscript \"[]\"");
      auto g = make(Expr::Kind::getitem, p);
      g->args.push_back(std::move(obj));
      g->args.push_back(std::move(parts[0]));
      return g;
    }
    auto s = make(Expr::Kind::slice, p);
    s->args.push_back(std::move(obj));
    for (auto& x : parts) s->args.push_back(std::move(x));
    return s;
  }

  // Arguments "(a, b, key=c)" into e->args (after any already there) and e->kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail(cur(), "*args and **kwargs in calls are not supported");
      if (cur().type == Token::Type::name && peek().type == Token::Type::op && peek().text == "=") {
        std::string k = t_[i_].text;
        i_ += 2;
        e.kwargs.emplace_back(k, parse_expression());
      } else {
        if (!e.kwargs.empty()) fail(cur(), "a positional argument follows a keyword argument");
        e.args.push_back(parse_expression());
      }
    }
    ++i_;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = make(Expr::Kind::call, cur().pos);
    c->args.push_back(std::move(callee));
    parse_call_args(*c);
    return c;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++i_;
        e = parse_one_filter(std::move(e), "a filter name after \"|\"");
      } else if (is_name("is")) {
        ++i_;
        Pos p = cur().pos;
        auto t = make(Expr::Kind::test, p);
        if (is_name("not")) {
          t->negated = true;
          ++i_;
        }
        // Tests named by operators ("==", "!=") are only valid in select/reject; here names.
        t->name = expect_name("a test name after \"is\"");
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == Token::Type::name || cur().type == Token::Type::string ||
                    cur().type == Token::Type::integer || cur().type == Token::Type::floating ||
                    is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail(cur(), "tests cannot be chained with \"is\"");
          ExprPtr arg = parse_postfix(parse_primary());
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }
};

}  // namespace

std::unique_ptr<TemplateAst> parse_template(const std::string& source, const std::string& name) {
  // Newlines normalized to "\n"; one trailing newline dropped (jinja's keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  auto ast = std::make_unique<TemplateAst>();
  ast->name = name;
  Parser parser(lex_template(src, name), name);
  ast->body = parser.parse_all();
  return ast;
}

}  // namespace lf::data::jinja

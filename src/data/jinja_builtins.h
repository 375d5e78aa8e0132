// Helpers shared by the Jinja builtins (internal to jinja_builtins.cpp and jinja_filters.cpp):
// Python-style argument binding and the str operations filters and methods both use.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "jinja_ast.h"

namespace lf::data::jinja::detail {

// Binds a builtin's arguments by position or keyword, as Python does; unknown keywords and
// surplus positionals are errors naming the function.
struct Args {
  Renderer& r;
  const CallArgs& a;
  Pos pos;
  const char* fn;
  std::vector<const char*> names;  // parameter names after the subject

  const Value* get(size_t k) const;
  Value get_or(size_t k, Value def) const;
  void check() const;
};
Args args(Renderer& r, const CallArgs& a, Pos pos, const char* fn, std::vector<const char*> names);

const std::string& need_str(Renderer& r, const Value& v, Pos pos, const char* what);
int64_t need_int(Renderer& r, const Value& v, Pos pos, const char* what);
bool is_py_space(unsigned char c);
// str.strip/lstrip/rstrip; chars None or Undefined: whitespace.
std::string strip(const std::string& s, const Value& chars, bool left, bool right);
std::string ascii_lower(std::string s);
std::string ascii_upper(std::string s);
std::string capitalize(const std::string& s);
List split(Renderer& r, const std::string& s, const Value& sep, int64_t maxsplit, Pos pos);
std::string replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count);
int64_t count_chars(const std::string& s);  // code points
Value length(Renderer& r, const Value& v, Pos pos);
// Attribute path "a.b.0" as jinja's make_attrgetter resolves it.
Value attr_path(Renderer& r, const Value& v, const std::string& path, Pos pos);
// Sort order; strings compare case-insensitively unless case_sensitive (jinja's ignore_case).
bool less(Renderer& r, const Value& a, const Value& b, bool case_sensitive, Pos pos);
Value make_builtin(std::string name, std::function<Value(Renderer&, const CallArgs&, Pos)> fn);

// markupsafe: escape() of & < > " ' (what the `escape` filter and Markup's operators apply).
std::string html_escape(const std::string& s);
// The text of v inside a Markup: a Markup's own text, anything else str(v) escaped.
std::string markup_text(const Value& v);
// s as a Markup when `like` is one (Markup's string methods return Markup), else plain.
Value same_kind(const Value& like, std::string s);

}  // namespace lf::data::jinja::detail

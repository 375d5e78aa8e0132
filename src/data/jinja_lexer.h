// The Jinja lexer (internal to jinja_parser.cpp): template text -> text and tag tokens, with
// jinja2's whitespace control under trim_blocks and lstrip_blocks ("-" strips all whitespace,
// "+" keeps it, a block or comment tag eats the newline after it and the indentation before it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "jinja_ast.h"

namespace lf::data::jinja {

struct Token {
  enum class Type { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };
  Type type;
  std::string text;  // text data, name, decoded string, operator
  Pos pos;
  int64_t i = 0;
  double f = 0;
};

// Tokens of src (newlines already normalized), ending with an eof token; throws lf::Error naming
// the template, line and column of an unclosed tag, comment or string, or a stray character.
std::vector<Token> lex_template(const std::string& src, const std::string& name);

}  // namespace lf::data::jinja

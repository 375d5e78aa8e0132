// Jinja lexer: tags and their tokens, whitespace control, Python string literal escapes.
#include "jinja_lexer.h"

#include <cctype>
#include <cstring>

#include "loongforge/core/error.h"

namespace lf::data::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name) : s_(src), name_(name) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < s_.size()) {
      size_t k = find_tag(pos);
      if (k == std::string::npos) {
        emit_text(pos, s_.size());
        break;
      }
      char kind = s_[k + 1];  // '{', '%' or '#'
      char sign = k + 2 < s_.size() ? s_[k + 2] : 0;
      size_t text_end = k;
      if (sign == '-') {
        while (text_end > pos && is_space(s_[text_end - 1])) --text_end;
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop the indentation between the line start and the tag.
        size_t nl = k > pos ? s_.rfind('\n', k - 1) : std::string::npos;
        bool has_nl = nl != std::string::npos && nl >= pos;
        size_t l_pos = has_nl ? nl + 1 : pos;
        bool only_ws = l_pos < k;
        for (size_t q = l_pos; q < k; ++q) only_ws = only_ws && is_space(s_[q]);
        if ((has_nl || line_starting) && only_ws) text_end = l_pos;
      }
      emit_text(pos, text_end);
      size_t start = k + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      char close_sign = 0;
      size_t after;
      if (kind == '#') {
        size_t e = s_.find("#}", start);
        if (e == std::string::npos) fail(k, "the comment is not closed (missing \"#}\")");
        close_sign = (e > start && (s_[e - 1] == '-' || s_[e - 1] == '+')) ? s_[e - 1] : 0;
        after = e + 2;
      } else {
        Token b{kind == '{' ? Token::Type::var_begin : Token::Type::block_begin, "", pos_of(k)};
        tokens_.push_back(b);
        after = lex_tag(start, kind == '{' ? '}' : '%', close_sign);
      }
      if (close_sign == '-') {
        while (after < s_.size() && is_space(s_[after])) ++after;
      } else if (kind != '{' && close_sign != '+' && after < s_.size() && s_[after] == '\n') {
        ++after;  // trim_blocks
      }
      line_starting = after > 0 && s_[after - 1] == '\n';
      pos = after;
    }
    tokens_.push_back({Token::Type::eof, "", pos_of(s_.size())});
    return std::move(tokens_);
  }

 private:
  const std::string& s_;
  const std::string& name_;
  std::vector<Token> tokens_;
  mutable size_t memo_off_ = 0;
  mutable Pos memo_pos_;

  // Line and column (in code points) of a byte offset; offsets mostly increase, so the scan
  // resumes from the last answer.
  Pos pos_of(size_t off) const {
    if (off < memo_off_) memo_off_ = 0, memo_pos_ = Pos{};
    for (; memo_off_ < off && memo_off_ < s_.size(); ++memo_off_) {
      if (s_[memo_off_] == '\n') ++memo_pos_.line, memo_pos_.col = 1;
      else if ((static_cast<unsigned char>(s_[memo_off_]) & 0xc0) != 0x80) ++memo_pos_.col;
    }
    return memo_pos_;
  }
  [[noreturn]] void fail(size_t off, const std::string& what) const {
    Pos p = pos_of(off);
    LF_FAIL("chat template ", name_, " line ", p.line, ", column ", p.col, ": ", what);
  }

  size_t find_tag(size_t pos) const {
    for (size_t k = s_.find('{', pos); k != std::string::npos; k = s_.find('{', k + 1))
      if (k + 1 < s_.size() && (s_[k + 1] == '{' || s_[k + 1] == '%' || s_[k + 1] == '#')) return k;
    return std::string::npos;
  }

  void emit_text(size_t b, size_t e) {
    if (e <= b) return;
    tokens_.push_back({Token::Type::text, s_.substr(b, e - b), pos_of(b)});
  }

  // Tokens of a {{ }} or {% %} tag from pos; returns the offset after the closing delimiter.
  size_t lex_tag(size_t pos, char close, char& close_sign) {
    int depth = 0;  // brackets: a "}}" inside {...} does not end the tag
    for (;;) {
      while (pos < s_.size() && is_space(s_[pos])) ++pos;
      if (pos >= s_.size()) fail(pos, std::string("the tag is not closed (missing \"") + close + "}\")");
      if (depth == 0) {
        for (char sg : {'-', '+', '\0'}) {
          size_t q = pos + (sg ? 1 : 0);
          if ((sg == 0 || s_[pos] == sg) && q + 1 < s_.size() && s_[q] == close && s_[q + 1] == '}') {
            close_sign = sg;
            tokens_.push_back({close == '}' ? Token::Type::var_end : Token::Type::block_end, "", pos_of(pos)});
            return q + 2;
          }
        }
      }
      size_t start = pos;
      char c = s_[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        while (pos < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos])) || s_[pos] == '_')) ++pos;
        tokens_.push_back({Token::Type::name, s_.substr(start, pos - start), pos_of(start)});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number(pos);
      } else if (c == '\'' || c == '"') {
        lex_string(pos);
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                    "]", "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
        const char* hit = nullptr;
        for (const char* op : ops)
          if (s_.compare(pos, std::strlen(op), op) == 0) {
            hit = op;
            break;
          }
        if (!hit) {
          size_t n = 1;  // the whole UTF-8 sequence, so the message stays valid UTF-8
          while (pos + n < s_.size() && (static_cast<unsigned char>(s_[pos + n]) & 0xc0) == 0x80) ++n;
          fail(pos, "unexpected character '" + s_.substr(pos, n) + "' in a tag");
        }
        std::string op(hit);
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        pos += op.size();
        tokens_.push_back({Token::Type::op, op, pos_of(start)});
      }
    }
  }

  void lex_number(size_t& pos) {
    size_t start = pos;
    auto digits = [&] {
      while (pos < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos])) || s_[pos] == '_')) ++pos;
    };
    digits();
    bool is_float = false;
    if (pos + 1 < s_.size() && s_[pos] == '.' && std::isdigit(static_cast<unsigned char>(s_[pos + 1]))) {
      is_float = true;
      ++pos;
      digits();
    }
    if (pos < s_.size() && (s_[pos] == 'e' || s_[pos] == 'E')) {
      size_t q = pos + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) {
        is_float = true;
        pos = q;
        digits();
      }
    }
    std::string text;
    for (size_t q = start; q < pos; ++q)
      if (s_[q] != '_') text += s_[q];
    Token t{is_float ? Token::Type::floating : Token::Type::integer, text, pos_of(start)};
    try {
      if (is_float) t.f = std::stod(text);
      else t.i = std::stoll(text);
    } catch (const std::exception&) {
      fail(start, "number " + text + " is out of range");
    }
    tokens_.push_back(t);
  }

  // Python string literal escapes (jinja decodes literals with unicode-escape).
  void lex_string(size_t& pos) {
    size_t start = pos;
    char q = s_[pos++];
    std::string out;
    for (;;) {
      if (pos >= s_.size()) fail(start, "the string literal is not closed");
      char c = s_[pos++];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos >= s_.size()) fail(start, "the string literal is not closed");
      char e = s_[pos++];
      auto hex = [&](int n) {
        uint32_t cp = 0;
        for (int k = 0; k < n; ++k) {
          if (pos >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[pos])))
            fail(pos, std::string("bad \\") + e + " escape in a string literal");
          char h = s_[pos++];
          cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return cp;
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;  // line continuation
        case 'x': append_utf8(out, hex(2)); break;
        case 'u': append_utf8(out, hex(4)); break;
        case 'U': append_utf8(out, hex(8)); break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && pos < s_.size() && s_[pos] >= '0' && s_[pos] <= '7'; ++k)
              cp = cp * 8 + static_cast<uint32_t>(s_[pos++] - '0');
            append_utf8(out, cp);
          } else {
            out += '\\';  // Python keeps unknown escapes
            out += e;
          }
      }
    }
    tokens_.push_back({Token::Type::string, out, pos_of(start)});
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) out += static_cast<char>(cp);
    else if (cp < 0x800) out += static_cast<char>(0xc0 | (cp >> 6)), out += static_cast<char>(0x80 | (cp & 0x3f));
    else if (cp < 0x10000)
      out += static_cast<char>(0xe0 | (cp >> 12)), out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f)),
          out += static_cast<char>(0x80 | (cp & 0x3f));
    else
      out += static_cast<char>(0xf0 | (cp >> 18)), out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f)),
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f)), out += static_cast<char>(0x80 | (cp & 0x3f));
  }
};

}  // namespace

std::vector<Token> lex_template(const std::string& src, const std::string& name) {
  Lexer lexer(src, name);
  return lexer.run();
}

}  // namespace lf::data::jinja

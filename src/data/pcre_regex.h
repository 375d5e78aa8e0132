// A PCRE2 pattern compiled once (UTF + UCP, JIT when available) and a per-thread matcher.
// Internal to the tokenizers; tokenizer.json regexes are written for Oniguruma, whose syntax
// for what they use (\p{L}, \p{N}, (?i:...), (?!...)) PCRE2 shares.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace lf::data {

class CompiledRegex {
 public:
  // literal: match the text as is (tokenizer.json's {"String": ...} patterns).
  CompiledRegex(const std::string& pattern, bool literal, const std::string& where);
  ~CompiledRegex();
  void* code() const { return code_; }
  bool jit() const { return jit_; }
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

class RegexMatcher {
 public:
  explicit RegexMatcher(std::shared_ptr<const CompiledRegex> regex);
  ~RegexMatcher();
  RegexMatcher(const RegexMatcher&) = delete;
  RegexMatcher& operator=(const RegexMatcher&) = delete;
  // Finds the first match at or after `start` in valid UTF-8 text; [begin, end) on success.
  bool find(std::string_view text, size_t start, size_t& begin, size_t& end);

 private:
  std::shared_ptr<const CompiledRegex> regex_;
  void* match_data_ = nullptr;  // pcre2_match_data_8*
  void* context_ = nullptr;     // pcre2_match_context_8*
  void* jit_stack_ = nullptr;   // pcre2_jit_stack_8*
};

}  // namespace lf::data

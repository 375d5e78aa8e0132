// PCRE2 wrapper for the tokenizer Split regexes.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "pcre_regex.h"

#include <pcre2.h>

#include "loongforge/core/error.h"

namespace lf::data {
namespace {
std::string pcre_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}
}  // namespace

CompiledRegex::CompiledRegex(const std::string& pattern, bool literal, const std::string& where)
    : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2_LITERAL takes no PCRE2_UCP (a literal has no character classes).
  uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &err, &offset, nullptr);
  LF_CHECK(code != nullptr, where, ": cannot compile the regex ", pattern, " at offset ", offset,
           ": ", pcre_message(err),
           lf::hint("the pattern uses Oniguruma syntax PCRE2 lacks; please report it"));
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

CompiledRegex::~CompiledRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

RegexMatcher::RegexMatcher(std::shared_ptr<const CompiledRegex> regex) : regex_(std::move(regex)) {
  match_data_ = pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(regex_->code()), nullptr);
  context_ = pcre2_match_context_create(nullptr);
  if (regex_->jit()) {
    // Long runs (a megabyte of spaces) need more than the default 32 KiB JIT stack.
    jit_stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(static_cast<pcre2_match_context*>(context_), nullptr, jit_stack_);
  }
}

RegexMatcher::~RegexMatcher() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
  if (jit_stack_) pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
}

bool RegexMatcher::find(std::string_view text, size_t start, size_t& begin, size_t& end) {
  auto* code = static_cast<pcre2_code*>(regex_->code());
  auto* md = static_cast<pcre2_match_data*>(match_data_);
  auto* ctx = static_cast<pcre2_match_context*>(context_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = regex_->jit() ? pcre2_jit_match(code, subject, text.size(), start, 0, md, ctx)
                         : pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, ctx);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  LF_CHECK(rc >= 0, "regex ", regex_->pattern(), " failed on a ", text.size(),
           "-byte piece: ", pcre_message(rc));
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  begin = ov[0];
  end = ov[1];
  return true;
}

}  // namespace lf::data

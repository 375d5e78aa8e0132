// Errors: lf::Error and the LF_CHECK family. A failed check throws with file:line, the rank,
// the offending values and a hint; library code never exits the process (tools/ turn errors
// into messages and exit codes). Not a logging facility; see core/logging.h.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace lf {

// A remedy printed after the message as "HINT: ...". Pass it anywhere in an LF_CHECK's values.
struct Hint {
  std::string text;
};
inline Hint hint(std::string text) { return Hint{std::move(text)}; }

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string message, std::string hint, std::string file, int line)
      : std::runtime_error(std::move(what)), message_(std::move(message)),
        hint_(std::move(hint)), file_(std::move(file)), line_(line) {}
  // The message without location or hint.
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_, hint_, file_;
  int line_;
};

// Builds a message from any streamable values; lf::Hint values are collected separately.
class MessageBuilder {
 public:
  template <class T>
  MessageBuilder& operator<<(const T& v) {
    if constexpr (std::is_same_v<T, Hint>) {
      hint_ += v.text;
    } else {
      os_ << v;
    }
    return *this;
  }
  std::string message() const { return os_.str(); }
  const std::string& hint_text() const { return hint_; }

 private:
  std::ostringstream os_;
  std::string hint_;
};

template <class... A>
std::string str(const A&... a) {
  MessageBuilder b;
  (b << ... << a);
  return b.message();
}

// The rank shown in error messages and log lines (-1: not a distributed process). Identity of
// this process for diagnostics only; parallel groups live in dist::ParallelContext.
void set_diagnostic_rank(int rank);
int diagnostic_rank();

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const char* condition,
                              const MessageBuilder& b);
template <class... A>
[[noreturn]] void fail(const char* file, int line, const char* condition, const A&... a) {
  MessageBuilder b;
  (b << ... << a);
  throw_error(file, line, condition, b);
}
}  // namespace detail
}  // namespace lf

// LF_CHECK(cond, values...): throws lf::Error naming file:line, the rank, the values and any
// lf::hint(...) among them, when cond is false.
#define LF_CHECK(cond, ...)                                                       \
  do {                                                                            \
    if (!(cond)) [[unlikely]]                                                     \
      ::lf::detail::fail(__FILE__, __LINE__, #cond __VA_OPT__(, ) __VA_ARGS__);   \
  } while (0)

// LF_FAIL(values...): unconditional error.
#define LF_FAIL(...) ::lf::detail::fail(__FILE__, __LINE__, nullptr __VA_OPT__(, ) __VA_ARGS__)

// Internal invariants: checked in debug builds only.
#ifdef NDEBUG
#define LF_DCHECK(cond, ...) \
  do {                       \
  } while (0)
#else
#define LF_DCHECK(cond, ...) LF_CHECK(cond, "internal invariant: " __VA_OPT__(, ) __VA_ARGS__)
#endif

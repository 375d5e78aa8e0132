#include "loongforge/core/error.h"

#include <atomic>

namespace lf {
namespace {
std::atomic<int> g_diagnostic_rank{-1};

std::string_view basename_after_src(std::string_view file) {
  // Show paths relative to the repository (src/..., include/...), not the build machine's.
  for (std::string_view marker : {"/src/", "/include/", "/tests/", "/tools/", "/backends/"}) {
    auto pos = file.rfind(marker);
    if (pos != std::string_view::npos) return file.substr(pos + 1);
  }
  return file;
}
}  // namespace

void set_diagnostic_rank(int rank) { g_diagnostic_rank.store(rank); }
int diagnostic_rank() { return g_diagnostic_rank.load(); }

namespace detail {
void throw_error(const char* file, int line, const char* condition, const MessageBuilder& b) {
  std::string where(basename_after_src(file));
  std::ostringstream os;
  int rank = diagnostic_rank();
  if (rank >= 0) os << "[rank " << rank << "] ";
  std::string msg = b.message();
  os << msg;
  if (msg.empty() && condition) os << "check failed: " << condition;
  os << " (" << where << ":" << line << ")";
  if (!b.hint_text().empty()) os << "\n  HINT: " << b.hint_text();
  throw Error(os.str(), msg, b.hint_text(), where, line);
}
}  // namespace detail
}  // namespace lf

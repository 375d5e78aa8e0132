// Logging with a rank prefix: rank 0 to the terminal, every rank to its own file when one is
// configured. Implemented on spdlog in a translation unit that never sees LibTorch headers
// (LibTorch bundles its own fmt), so any TU may include this header. Not for errors: throw.
#pragma once

#include <string>
#include <string_view>

#include "loongforge/core/error.h"

namespace lf::log {

enum class Level { trace = 0, debug = 1, info = 2, warn = 3, error = 4, off = 6 };

struct Options {
  int rank = -1;              // -1: single process, no prefix
  int world_size = 1;
  bool terminal = true;       // when false only the file gets lines (ranks != 0 by default)
  std::string file;           // empty: no log file
  Level level = Level::info;
};

// Reconfigures the process logger (idempotent). Also sets lf::set_diagnostic_rank.
void init(const Options& options);
// Options for a rank from the environment: LOONGFORGE_LOG_LEVEL, LOONGFORGE_LOG_DIR
// (file rank<N>.log there); terminal only on rank 0 unless LOONGFORGE_LOG_ALL_RANKS=1.
Options options_from_env(int rank, int world_size);
bool enabled(Level level);
void write(Level level, std::string_view message);
void flush();
Level parse_level(std::string_view name);  // throws lf::Error on an unknown name

}  // namespace lf::log

#define LF_LOG_(level, ...)                                                   \
  do {                                                                        \
    if (::lf::log::enabled(level)) ::lf::log::write(level, ::lf::str(__VA_ARGS__)); \
  } while (0)
#define LF_DEBUG(...) LF_LOG_(::lf::log::Level::debug, __VA_ARGS__)
#define LF_INFO(...) LF_LOG_(::lf::log::Level::info, __VA_ARGS__)
#define LF_WARN(...) LF_LOG_(::lf::log::Level::warn, __VA_ARGS__)
#define LF_ERROR(...) LF_LOG_(::lf::log::Level::error, __VA_ARGS__)

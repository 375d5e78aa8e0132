// spdlog lives here and only here: this TU never includes LibTorch headers, so spdlog and the
// fmt it was built with (Debian's libfmt) never meet LibTorch's bundled fmt headers.
#include "loongforge/core/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>

namespace lf::log {
namespace {
std::mutex g_mutex;
std::shared_ptr<spdlog::logger> g_logger;
std::atomic<int> g_level{static_cast<int>(Level::info)};

spdlog::level::level_enum to_spd(Level l) {
  switch (l) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

std::shared_ptr<spdlog::logger> make_logger(const Options& o) {
  std::vector<spdlog::sink_ptr> sinks;
  if (o.terminal) sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (!o.file.empty()) {
    auto parent = std::filesystem::path(o.file).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(o.file, false));
  }
  auto logger = std::make_shared<spdlog::logger>("loongforge", sinks.begin(), sinks.end());
  std::string prefix = o.rank >= 0 ? "[rank " + std::to_string(o.rank) + "] " : "";
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ " + prefix + "%v");
  logger->set_level(to_spd(o.level));
  logger->flush_on(spdlog::level::warn);
  return logger;
}

std::shared_ptr<spdlog::logger> logger() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_logger) {
    Options o;
    if (const char* lvl = std::getenv("LOONGFORGE_LOG_LEVEL")) o.level = parse_level(lvl);
    g_level = static_cast<int>(o.level);
    g_logger = make_logger(o);
  }
  return g_logger;
}
}  // namespace

Level parse_level(std::string_view name) {
  if (name == "trace") return Level::trace;
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warn" || name == "warning") return Level::warn;
  if (name == "error") return Level::error;
  if (name == "off") return Level::off;
  LF_FAIL("unknown log level '", name, "'",
          lf::hint("use one of trace, debug, info, warn, error, off (LOONGFORGE_LOG_LEVEL)"));
}

void init(const Options& options) {
  set_diagnostic_rank(options.rank);
  auto l = make_logger(options);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_logger) g_logger->flush();
  g_logger = std::move(l);
  g_level = static_cast<int>(options.level);
}

Options options_from_env(int rank, int world_size) {
  Options o;
  o.rank = world_size > 1 || rank > 0 ? rank : -1;
  o.world_size = world_size;
  if (const char* lvl = std::getenv("LOONGFORGE_LOG_LEVEL")) o.level = parse_level(lvl);
  const char* all = std::getenv("LOONGFORGE_LOG_ALL_RANKS");
  o.terminal = rank <= 0 || (all && std::string_view(all) == "1");
  if (const char* dir = std::getenv("LOONGFORGE_LOG_DIR"); dir && *dir)
    o.file = (std::filesystem::path(dir) / ("rank" + std::to_string(rank < 0 ? 0 : rank) + ".log")).string();
  return o;
}

bool enabled(Level level) { return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed); }

void write(Level level, std::string_view message) {
  logger()->log(to_spd(level), "{}", message);
}

void flush() { logger()->flush(); }

}  // namespace lf::log

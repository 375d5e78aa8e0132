// The Python oracles of the tests (tests/*/*_oracle.py, run with the project's .venv): each writes
// its models and expected tensors once into a directory cached in the build tree under a name
// keyed by the script's text (ctest runs every case in its own process, and an oracle takes
// seconds). One process makes a cache while the others wait on a lock file beside it; it writes to
// a temporary directory renamed into place. Header-only and LibTorch-free (program tests use it);
// tests/models/cached_oracle.h adds the tensor reader.
#pragma once

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "multiprocess.h"

namespace lf::testing {

inline std::string venv_python() { return source_dir() + "/.venv/bin/python"; }
// The VLA oracles' own venvs (tools/install-deps): LeRobot 0.6 needs Python >= 3.12, and
// openpi-client pins numpy < 2.
inline std::string lerobot_python() { return source_dir() + "/.venv-lerobot/bin/python"; }
inline std::string openpi_client_python() { return source_dir() + "/.venv-openpi-client/bin/python"; }

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Skips (rather than fails) only when Python or transformers is genuinely missing.
inline bool missing_python(const std::string& output) {
  return output.find("No module named 'transformers'") != std::string::npos ||
         output.find("No module named 'torch'") != std::string::npos;
}

// The text of a script and of the project's Python modules it imports, recursively (a module is
// local when tests/<any dir>/<module>.py exists: the oracles put those directories on sys.path),
// so that a change to a shared oracle module renews every cache built from it.
inline std::string oracle_sources(const std::string& script) {
  namespace fs = std::filesystem;
  std::string all;
  std::vector<std::string> todo{script}, seen;
  while (!todo.empty()) {
    const std::string file = todo.back();
    todo.pop_back();
    if (std::find(seen.begin(), seen.end(), file) != seen.end()) continue;
    seen.push_back(file);
    const std::string text = read_text(file);
    all += file + "\n" + text;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      static const std::regex import_re(R"(^\s*(?:from|import)\s+([A-Za-z_][A-Za-z0-9_]*))");
      if (!std::regex_search(line, m, import_re)) continue;
      for (const auto& dir : fs::directory_iterator(source_dir() + "/tests")) {
        const fs::path module = dir.path() / (m[1].str() + ".py");
        if (dir.is_directory() && fs::exists(module)) todo.push_back(module.string());
      }
    }
  }
  return all;
}

// `python script make DIR` (python: the project's .venv unless given), cached as <build>/test-cache/<name>-<hash of the script and the local modules it imports>; `done_file` (relative)
// marks a complete cache. "" when Python or transformers is unavailable; a failed run is a test
// failure (and returns the partial directory).
inline std::string cached_oracle(const std::string& script, const std::string& name, const std::string& done_file,
                                 const std::string& python = venv_python()) {
  namespace fs = std::filesystem;
  if (!fs::exists(python)) return "";
  const std::string key = std::to_string(std::hash<std::string>{}(oracle_sources(script)));
  const std::string cache = binary_dir() + "/test-cache/" + name + "-" + key;
  if (fs::exists(cache + "/" + done_file)) return cache;
  // One process makes a cache while the others (ctest -j) wait for it: on a 2-core machine two
  // oracles at once only double the time, and contention has made a third-party oracle abort.
  fs::create_directories(binary_dir() + "/test-cache");
  const int lock = ::open((cache + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock >= 0) ::flock(lock, LOCK_EX);  // released when the fd closes (also if this process dies)
  struct Unlock {
    int fd;
    ~Unlock() { if (fd >= 0) ::close(fd); }
  } unlock{lock};
  if (fs::exists(cache + "/" + done_file)) return cache;
  const std::string tmp = cache + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  auto r = run_command({python, script, "make", tmp}, {}, std::chrono::seconds(240));
  if (!r.ok() && missing_python(r.output)) return "";
  EXPECT_TRUE(r.ok()) << r.output;
  if (!r.ok()) return tmp;
  fs::rename(tmp, cache, ec);  // fails harmlessly when another process got there first
  if (ec) fs::remove_all(tmp, ec);
  return cache;
}

}  // namespace lf::testing

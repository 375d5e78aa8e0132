// The Python oracles of the tests (tests/*/*_oracle.py, run with the project's .venv): each writes
// its models and expected tensors once into a directory cached in the build tree under a name
// keyed by the script's text (ctest runs every case in its own process, and an oracle takes
// seconds), written to a temporary directory and renamed into place, so concurrent test processes
// either win the rename or use the winner's. Header-only and LibTorch-free (program tests use it);
// tests/models/cached_oracle.h adds the tensor reader.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

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

// `python script make DIR` (python: the project's .venv unless given), cached as <build>/test-cache/<name>-<hash of the script>; `done_file` (relative)
// marks a complete cache. "" when Python or transformers is unavailable; a failed run is a test
// failure (and returns the partial directory).
inline std::string cached_oracle(const std::string& script, const std::string& name, const std::string& done_file,
                                 const std::string& python = venv_python()) {
  namespace fs = std::filesystem;
  if (!fs::exists(python)) return "";
  const std::string key = std::to_string(std::hash<std::string>{}(read_text(script)));
  const std::string cache = binary_dir() + "/test-cache/" + name + "-" + key;
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

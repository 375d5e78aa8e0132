// Helpers for the config tests: small YAML trees written into temp dirs.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "loongforge/core/config/config_error.h"
#include "multiprocess.h"

namespace lf::config::testing {

// Writes `text` to dir/rel (creating directories) and returns the full path.
inline std::string write_file(const std::string& dir, const std::string& rel, const std::string& text) {
  std::filesystem::path p = std::filesystem::path(dir) / rel;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
  return p.string();
}

// Runs f, expecting a ConfigError; returns it (or fails the test).
template <class F>
ConfigError expect_config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "expected a ConfigError";
  return ConfigError({});
}

}  // namespace lf::config::testing

// Helpers of the HF conversion tests (test_hf_parity.cpp, test_hf_fp8.cpp): edit a model
// directory's config.json, and the error read_hf gives for a broken directory.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "loongforge/core/error.h"
#include "loongforge/models/hf_adapter.h"

namespace lf::testing {

inline void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j;
  std::ifstream(dir + "/config.json") >> j;
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump(2);
}

// The lf::Error message of read_hf(dir); fails the test when it does not throw.
inline std::string read_error(const std::string& dir) {
  try {
    lf::models::hf::read_hf(dir);
  } catch (const lf::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "read_hf(" << dir << ") did not throw";
  return "";
}

}  // namespace lf::testing

#define EXPECT_MENTIONS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << "expected '" << (part) << "' in: " << (text)

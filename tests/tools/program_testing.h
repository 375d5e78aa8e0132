// Helpers for program-level tests: paths of the built programs, and reading the fp32
// safetensors parameter dump loongforge-train writes when LOONGFORGE_DUMP_PARAMS is set (TP
// shards gathered into full tensors). Header-only, shared by tests/tools/*.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "multiprocess.h"

namespace lf::testing {

inline std::string bin(const std::string& name) { return lf::testing::binary_dir() + "/bin/" + name; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// name -> values, from the fp32 safetensors file loongforge-train writes at the end of training
// when LOONGFORGE_DUMP_PARAMS is set (TP shards gathered into full tensors).
inline std::map<std::string, std::vector<float>> read_params(const std::string& path) {
  std::string bytes = read_file(path);
  EXPECT_GE(bytes.size(), 8u) << path;
  if (bytes.size() < 8) return {};
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  const std::string header = bytes.substr(8, n);
  const char* data = bytes.data() + 8 + n;
  std::map<std::string, std::vector<float>> out;
  std::regex entry(R"re("([^"]+)":\{"dtype":"F32","shape":\[[0-9,]*\],"data_offsets":\[(\d+),(\d+)\]\})re");
  for (std::sregex_iterator it(header.begin(), header.end(), entry), end; it != end; ++it) {
    const size_t a = std::stoull((*it)[2]), b = std::stoull((*it)[3]);
    std::vector<float> v((b - a) / 4);
    std::memcpy(v.data(), data + a, b - a);
    out[(*it)[1]] = std::move(v);
  }
  return out;
}

inline double max_abs_diff(const std::map<std::string, std::vector<float>>& a,
                    const std::map<std::string, std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  EXPECT_FALSE(a.empty());
  double worst = 0;
  for (const auto& [name, va] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << "missing " << name;
      continue;
    }
    EXPECT_EQ(va.size(), it->second.size()) << name;
    for (size_t i = 0; i < std::min(va.size(), it->second.size()); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(va[i]) - it->second[i]));
  }
  return worst;
}

}  // namespace lf::testing

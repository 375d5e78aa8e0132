// Helpers of the HF conversion tests (test_hf_parity.cpp, test_hf_fp8.cpp, test_qwen3_vl.cpp): edit
// a model directory's config.json, write its FP8 / fp32 weights, and the error read_hf gives for a
// broken directory.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/models/hf_adapter.h"

namespace lf::testing {

inline void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j;
  std::ifstream(dir + "/config.json") >> j;
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump(2);
}

// Writes `tensors` as one safetensors file: float8_e4m3fn tensors as F8_E4M3, the rest as F32
// (converted), as the FP8 checkpoint tests build their directories.
inline void write_fp8_or_f32(const std::string& file, const std::map<std::string, at::Tensor>& tensors) {
  lf::safetensors::Writer out;
  std::vector<at::Tensor> held;  // alive until the write
  held.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    const bool fp8 = t.scalar_type() == at::kFloat8_e4m3fn;
    held.push_back((fp8 ? t : t.to(at::kFloat)).contiguous());
    out.add(name, fp8 ? lf::safetensors::DType::F8_E4M3 : lf::safetensors::DType::F32, t.sizes().vec(),
            held.back().data_ptr());
  }
  out.write(file);
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

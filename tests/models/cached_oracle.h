// The model tests' oracle harness: the cached Python oracles (tests/support/oracle_cache.h) and a
// reader of the safetensors files they write. Header-only, for tests that link LibTorch.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "loongforge/core/safetensors.h"
#include "oracle_cache.h"

namespace lf::testing {

// Every tensor of an oracle's safetensors file (F32 -> float, I64 -> long, U8 -> byte, BOOL -> bool,
// F8_E4M3 / F8_E5M2 -> the FP8 dtypes, other floating dtypes -> float).
inline std::map<std::string, at::Tensor> read_safetensors(const std::string& file) {
  using lf::safetensors::DType;
  auto r = lf::safetensors::Reader::open(file);
  std::map<std::string, at::Tensor> out;
  for (const auto& info : r.tensors()) {
    auto dtype = info.dtype == DType::I64       ? at::kLong
                 : info.dtype == DType::U8      ? at::kByte
                 : info.dtype == DType::BOOL    ? at::kBool
                 : info.dtype == DType::F8_E4M3 ? at::kFloat8_e4m3fn
                 : info.dtype == DType::F8_E5M2 ? at::kFloat8_e5m2
                 : info.dtype == DType::BF16    ? at::kBFloat16
                 : info.dtype == DType::F16     ? at::kHalf
                 : info.dtype == DType::F64     ? at::kDouble
                                                : at::kFloat;
    auto t = at::empty(info.shape, at::TensorOptions().dtype(dtype));
    std::memcpy(t.data_ptr(), r.data(info), info.end - info.begin);
    const bool widen = dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kDouble;
    out[info.name] = widen ? t.to(at::kFloat) : t;
  }
  return out;
}

// The tensors of `got_file` are those of `want_file`: the same names, each bit for bit
// (lf2hf(hf2lf(x)) round trips).
inline void expect_same_safetensors(const std::string& want_file, const std::string& got_file) {
  const auto want = read_safetensors(want_file), got = read_safetensors(got_file);
  EXPECT_EQ(want.size(), got.size()) << got_file;
  for (const auto& [name, t] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name << " is missing from " << got_file;
    EXPECT_TRUE(at::equal(t, it->second)) << name;
  }
}

}  // namespace lf::testing

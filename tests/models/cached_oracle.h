// The model tests' oracle harness: the cached Python oracles (tests/support/oracle_cache.h) and a
// reader of the safetensors files they write. Header-only, for tests that link LibTorch.
#pragma once

#include <ATen/ATen.h>

#include <cstring>
#include <map>
#include <string>

#include "loongforge/core/safetensors.h"
#include "oracle_cache.h"

namespace lf::testing {

// Every tensor of an oracle's safetensors file (F32 -> float, I64 -> long, U8 -> byte, BOOL -> bool).
inline std::map<std::string, at::Tensor> read_safetensors(const std::string& file) {
  using lf::safetensors::DType;
  auto r = lf::safetensors::Reader::open(file);
  std::map<std::string, at::Tensor> out;
  for (const auto& info : r.tensors()) {
    auto dtype = info.dtype == DType::I64  ? at::kLong
                 : info.dtype == DType::U8 ? at::kByte
                 : info.dtype == DType::BOOL ? at::kBool
                                             : at::kFloat;
    auto t = at::empty(info.shape, at::TensorOptions().dtype(dtype));
    std::memcpy(t.data_ptr(), r.data(info), info.end - info.begin);
    out[info.name] = t;
  }
  return out;
}

}  // namespace lf::testing

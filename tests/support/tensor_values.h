// A tensor's elements as doubles, in order: for EXPECT_EQ against hand-computed vectors.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace lf::testing {

inline std::vector<double> values(const at::Tensor& t) {
  at::Tensor d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

}  // namespace lf::testing

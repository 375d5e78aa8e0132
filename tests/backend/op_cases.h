// The op harness's case table: every fused op of backend/op_table.h, with shapes, dtypes and
// mask kinds, each as a function that runs forward and backward on any OpTable and returns the
// named results. The harness (test_op_harness.cpp) runs each case on every available backend
// and compares with the CPU reference. Adding a kernel means adding a case here.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "loongforge/backend/op_table.h"

namespace lf::testing {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct OpCase {
  std::string name;  // gtest-safe: letters, digits, underscores
  // Tolerances for comparing a backend with the CPU reference, with the reason in op_cases.cpp.
  double atol = 1e-5;
  double rtol = 1e-5;
  // Builds the inputs on the CPU, deterministically (fixed seed per case).
  std::function<std::vector<at::Tensor>()> make_inputs;
  // Runs forward, then backward with the cotangents among the inputs; inputs already on the
  // backend's device. In-place ops (adamw) must work on clones.
  std::function<NamedTensors(const backend::OpTable&, const std::vector<at::Tensor>&)> run;
};

const std::vector<OpCase>& op_cases();

// Max |a - e| and whether every element satisfies |a - e| <= atol + rtol |e| (NaN/inf must
// match exactly). `a` may live on any device.
struct Closeness {
  bool ok = true;
  double max_abs = 0;
  std::string detail;
};
Closeness compare(const at::Tensor& actual, const at::Tensor& expected, double atol, double rtol);

}  // namespace lf::testing

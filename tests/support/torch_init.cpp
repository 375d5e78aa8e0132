// Linked into every LibTorch test binary (loongforge_add_test ... TORCH): MKL's vector math is
// initialised from the main thread before main(), as the engine's programs do when they pick a
// backend (lf::backend::init_cpu_math explains why). LF_TEST_NO_CPU_MATH_INIT=1 leaves it to the
// code under test (CpuMath.* checks that the backend registry does it).
#include <cstdlib>

#include "loongforge/backend/registry.h"

namespace {

const bool initialised = [] {
  const char* skip = std::getenv("LF_TEST_NO_CPU_MATH_INIT");
  if (skip == nullptr || *skip == '\0') lf::backend::init_cpu_math();
  return true;
}();

}  // namespace

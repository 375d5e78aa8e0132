// LoongForge gloo shim (see README.md): gloo::Context is only held through std::shared_ptr.
// ProcessGroupGloo::setTimeout (inline in c10d's header) names one member function, so the
// class is declared with that member and nothing else. It cannot be constructed here: every
// Context lives inside libtorch_cpu.so, built with gloo's real definition.
#pragma once
#include <chrono>

namespace gloo {
class Context {
 public:
  Context() = delete;
  Context(const Context&) = delete;
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo

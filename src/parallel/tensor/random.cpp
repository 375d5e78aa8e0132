// RngTracker and dropout (parallel/tensor/random.h).
#include "loongforge/parallel/tensor/random.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <mutex>

#include "loongforge/core/error.h"

namespace lf::parallel {

RngTracker::RngTracker(uint64_t seed, int tp_rank, int pp_rank) {
  const uint64_t base = seed + 100 * static_cast<uint64_t>(pp_rank);
  add(kDefault, base);
  add(kModelParallel, base + kModelParallelOffset + static_cast<uint64_t>(tp_rank));
}

void RngTracker::add(const std::string& name, uint64_t seed) {
  LF_CHECK(!has(name), "RNG stream '", name, "' already exists");
  for (const auto& [other, s] : streams_)
    LF_CHECK(s.seed != seed, "RNG stream '", name, "' would reuse seed ", seed, " of stream '",
             other, "'", lf::hint("every stream needs its own seed"));
  streams_.emplace(name, Stream{seed, at::make_generator<at::CPUGeneratorImpl>(seed)});
}

at::Generator& RngTracker::get(const std::string& name) {
  auto it = streams_.find(name);
  LF_CHECK(it != streams_.end(), "no RNG stream '", name, "'");
  return it->second.gen;
}

uint64_t RngTracker::seed(const std::string& name) const {
  auto it = streams_.find(name);
  LF_CHECK(it != streams_.end(), "no RNG stream '", name, "'");
  return it->second.seed;
}

std::map<std::string, at::Tensor> RngTracker::state() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, s] : streams_) {
    // Generators are shared handles: get_state reads under the generator's lock.
    at::Generator g = s.gen;
    std::lock_guard<std::mutex> lock(g.mutex());
    out.emplace(name, g.get_state());
  }
  return out;
}

void RngTracker::set_state(const std::map<std::string, at::Tensor>& state) {
  LF_CHECK(state.size() == streams_.size(), "RNG state has ", state.size(), " streams, this rank has ",
           streams_.size(), lf::hint("the state was saved by a different configuration"));
  for (auto& [name, s] : streams_) {
    auto it = state.find(name);
    LF_CHECK(it != state.end(), "RNG state lacks stream '", name, "'",
             lf::hint("the state was saved by a different configuration"));
    std::lock_guard<std::mutex> lock(s.gen.mutex());
    s.gen.set_state(it->second);
  }
}

at::Tensor dropout(const at::Tensor& x, double p, at::Generator& gen) {
  if (p == 0.0) return x;
  LF_CHECK(p > 0.0 && p < 1.0, "dropout probability must be in [0, 1), got ", p);
  // Drawn on the CPU (the stream is a CPU generator, which ATen locks while drawing) so that the
  // mask does not depend on the device, then moved.
  at::Tensor keep =
      at::bernoulli(at::full(x.sizes(), 1.0 - p, at::TensorOptions().dtype(at::kFloat)), gen);
  return x * keep.to(x.options()) * (1.0 / (1.0 - p));
}

}  // namespace lf::parallel

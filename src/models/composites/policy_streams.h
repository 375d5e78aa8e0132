// What the flow-matching VLA policies (pi05.cpp, groot.cpp) draw per sample: draws keyed by
// (seed, step, sample index), so every layout (DP, TP) draws the same for a sample, and a resumed
// run, at any layout, repeats an uninterrupted one (the step is the iteration: Model::resume_at).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "loongforge/core/error.h"

namespace lf::models::policy_streams {

// Beta(alpha, beta) per sample (two Gammas), each from its own generator seeded by
// seed * 2654435761 + step * 1000003 + index + 17.
inline std::vector<double> beta_draws(uint64_t seed, int64_t step, const at::Tensor& sample_ids, double alpha,
                                      double beta) {
  auto ids = sample_ids.to(at::kCPU, at::kLong).contiguous();
  std::vector<double> out(static_cast<size_t>(ids.numel()));
  for (int64_t i = 0; i < ids.numel(); ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 2654435761ull + static_cast<uint64_t>(step) * 1000003ull +
                                                       static_cast<uint64_t>(ids.data_ptr<int64_t>()[i]) + 17);
    auto ga = at::_standard_gamma(at::full({1}, alpha, at::kDouble), gen);
    auto gb = at::_standard_gamma(at::full({1}, beta, at::kDouble), gen);
    out[static_cast<size_t>(i)] = ga.item<double>() / (ga.item<double>() + gb.item<double>());
  }
  return out;
}

// N(0, 1) noise of `shape` per sample, stacked [samples, shape...] float32, each from a generator
// seeded by seed * 0x9E3779B97F4A7C15 + step * 7919 + index + 3.
inline at::Tensor noise_draws(uint64_t seed, int64_t step, const std::vector<int64_t>& sample_indices,
                              const std::vector<int64_t>& shape) {
  std::vector<at::Tensor> noise;
  for (int64_t index : sample_indices) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) * 7919ull +
                                                       static_cast<uint64_t>(index) + 3);
    noise.push_back(at::normal(0.0, 1.0, shape, gen, at::kFloat));
  }
  return at::stack(noise);
}

}  // namespace lf::models::policy_streams

// What the flow-matching VLA policies (pi05.cpp, groot.cpp) draw per sample and keep in their
// checkpoints: draws keyed by (seed, step, sample index), so every layout (DP, TP) draws the same
// for a sample and a resumed run repeats an uninterrupted one; the step counter as the model's RNG
// state (Model::rng_state) under a key of the model's.
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

// The step counter as RNG state under `key`, and back (absent: unchanged; malformed: an error).
inline std::map<std::string, at::Tensor> step_state(const std::string& key, int64_t step) {
  at::Tensor bytes = at::empty({static_cast<int64_t>(sizeof step)}, at::kByte);
  std::memcpy(bytes.data_ptr(), &step, sizeof step);
  return {{key, bytes}};
}

inline void read_step_state(const std::map<std::string, at::Tensor>& s, const std::string& key, int64_t& step) {
  auto it = s.find(key);
  if (it == s.end()) return;
  const at::Tensor bytes = it->second.to(at::kCPU).contiguous();
  LF_CHECK(bytes.scalar_type() == at::kByte && bytes.numel() == static_cast<int64_t>(sizeof step),
           "the checkpoint's ", key, " is not the 8-byte step counter");
  std::memcpy(&step, bytes.data_ptr(), sizeof step);
}

}  // namespace lf::models::policy_streams

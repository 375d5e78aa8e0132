// Shared by the train/ multi-process tests: a ParallelContext over the worker's torchrun
// environment, and a small chain of parameters whose backward visits them last-to-first.
#pragma once

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/dist/launch_env.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/dist/rendezvous.h"
#include "loongforge/parallel/sharding.h"
#include "multiprocess.h"

namespace lf::testing {

struct TestContext {
  std::unique_ptr<lf::dist::Rendezvous> rdzv;
  std::unique_ptr<lf::dist::ParallelContext> ctx;
};

inline TestContext make_context(int tp) {
  TestContext t;
  t.rdzv = std::make_unique<lf::dist::Rendezvous>(lf::dist::detect_launch_env(),
                                                  std::chrono::seconds(60));
  lf::dist::ParallelSizes sizes;
  sizes.tp = tp;
  t.ctx = std::make_unique<lf::dist::ParallelContext>(
      *t.rdzv, lf::dist::ParallelLayout(t.rdzv->world_size(), sizes),
      lf::dist::ParallelContextOptions{.timeout = std::chrono::seconds(60)});
  return t;
}

// Same values on every rank (a function of the index only), varied sizes so that buckets split
// inside and between parameters.
inline std::vector<lf::parallel::Parameter> chain_params(at::ScalarType dtype = at::kFloat) {
  const std::vector<std::vector<int64_t>> shapes = {{5}, {3, 4}, {7}, {2, 3}, {11}, {6}, {4, 2}};
  std::vector<lf::parallel::Parameter> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (auto d : shapes[i]) n *= d;
    at::Tensor t = (at::arange(n, at::kFloat) * 0.37 + static_cast<double>(i)).sin().reshape(shapes[i]);
    lf::parallel::Parameter p;
    p.name = "p" + std::to_string(i);
    p.tensor = t.to(dtype).set_requires_grad(true);
    p.no_weight_decay = shapes[i].size() == 1;
    out.push_back(p);
  }
  return out;
}

// A scalar loss over the chain for micro-batch `mb` on DP rank `rank`: h <- h * (1 + 0.1 *
// mean(p_i * x_i)), so backward reaches the last parameter first.
inline at::Tensor chain_loss(const std::vector<lf::parallel::Parameter>& params, int rank,
                             int mb) {
  at::Tensor h = at::ones({}, at::kFloat);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i].tensor;
    at::Tensor x = (at::arange(p.numel(), at::kFloat) * 0.11 + 1.3 * rank + 0.7 * mb + i).cos()
                       .reshape(p.sizes());
    h = h * (1 + 0.1 * (p.to(at::kFloat) * x).mean());
  }
  return h;
}

inline double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace lf::testing

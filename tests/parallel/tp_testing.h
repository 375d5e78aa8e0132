// Helpers for the tensor-parallel tests: a ParallelContext for the worker's rank, comparisons that
// report the max difference, and the gathering of a parameter's TP shards into the full tensor.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "loongforge/dist/launch_env.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/dist/rendezvous.h"
#include "loongforge/parallel/sharding.h"
#include "loongforge/parallel/tensor/layers.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::testing {

// tp x dp over the worker's world (every kind the tests touch). Once per process: contexts share
// the store and the name "default".
inline lf::dist::Rendezvous& test_rendezvous() {
  static lf::dist::Rendezvous rendezvous(lf::dist::detect_launch_env(), std::chrono::seconds(60));
  return rendezvous;
}

inline std::unique_ptr<lf::dist::ParallelContext> make_context(int tp) {
  auto& rendezvous = test_rendezvous();
  lf::dist::ParallelSizes sizes;
  sizes.tp = tp;
  lf::dist::ParallelLayout layout(rendezvous.world_size(), sizes);
  lf::dist::ParallelContextOptions options;
  options.timeout = std::chrono::seconds(60);
  options.kinds = {lf::dist::GroupKind::world, lf::dist::GroupKind::tp, lf::dist::GroupKind::dp};
  return std::make_unique<lf::dist::ParallelContext>(rendezvous, layout, options);
}

// The experts' context of tp x dp with expert-parallel size ep and expert TP 1
// (ParallelLayout::expert_layout: its tp group is the expert-parallel group). Once per process.
inline std::unique_ptr<lf::dist::ParallelContext> make_expert_context(int tp, int ep) {
  auto& rendezvous = test_rendezvous();
  lf::dist::ParallelSizes sizes;
  sizes.tp = tp;
  sizes.ep = ep;
  sizes.etp = 1;
  lf::dist::ParallelLayout layout(rendezvous.world_size(), sizes);
  lf::dist::ParallelContextOptions options;
  options.name = "experts";
  options.timeout = std::chrono::seconds(60);
  options.kinds = {lf::dist::GroupKind::world, lf::dist::GroupKind::tp, lf::dist::GroupKind::dp};
  return std::make_unique<lf::dist::ParallelContext>(rendezvous, layout.expert_layout(), options);
}

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Largest magnitude of a reference, at least 1: tolerances are relative to it.
inline double scale_of(const at::Tensor& t) {
  return std::max(1.0, t.abs().max().to(at::kDouble).item<double>());
}

// max |a - b| <= tol * max(1, max |b|)
#define LF_EXPECT_CLOSE(a, b, tol)                                                          \
  do {                                                                                      \
    auto lf_a_ = (a);                                                                       \
    auto lf_b_ = (b);                                                                       \
    ASSERT_EQ(lf_a_.sizes(), lf_b_.sizes());                                                \
    EXPECT_LE(::lf::testing::max_abs_diff(lf_a_, lf_b_), (tol) * ::lf::testing::scale_of(lf_b_)) \
        << #a " vs " #b;                                                                    \
  } while (0)

// The full tensor from every TP rank's shard (partition_dim < 0: the tensor itself).
inline at::Tensor gather_shards(const at::Tensor& shard, int64_t partition_dim, int64_t blocks,
                                lf::backend::Communicator& tp) {
  if (partition_dim < 0 || tp.size() == 1) return shard;
  return lf::parallel::Sharding::along(partition_dim, blocks).gather(shard.detach(), tp);
}

// Rank `rank`'s contiguous chunk of `full` along dim (negative: from the end), of `size` chunks.
inline at::Tensor shard_along(const at::Tensor& full, int64_t dim, int rank, int size) {
  return lf::parallel::Sharding::along(dim < 0 ? dim + full.dim() : dim).shard(full, rank, size);
}

}  // namespace lf::testing

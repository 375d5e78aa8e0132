// Each TP/SP mapping's forward and backward on 2 and 4 ranks against values computed by hand:
// rank r contributes tensors built from r, so sums over the group are n(n+1)/2 and gathers are
// the ranks' blocks in rank order. Plus the RNG streams' masks across TP and DP ranks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "loongforge/core/error.h"
#include "loongforge/parallel/tensor/random.h"
#include "multiprocess.h"
#include "tp_testing.h"

namespace lf::parallel {
namespace {
using lf::testing::max_abs_diff;

at::Tensor leaf(at::Tensor t) { return t.set_requires_grad(true); }
at::Tensor arange2d(int64_t rows, int64_t cols) {
  return at::arange(rows * cols, at::kFloat).view({rows, cols});
}

void check_mappings(lf::dist::ParallelContext& ctx, at::ScalarType dtype) {
  auto& tp = ctx.tp();
  const int n = tp.size(), r = tp.rank();
  const double tri = n * (n + 1) / 2.0;  // sum over ranks of (r + 1)
  auto opt = at::TensorOptions().dtype(dtype);
  SCOPED_TRACE(std::string("dtype ") + c10::toString(dtype) + ", rank " + std::to_string(r));

  {  // copy_to_tp: fwd identity; bwd sums the ranks' gradients (r + 1).
    auto x = leaf(at::full({3}, 5.0, opt));
    auto y = copy_to_tp(x, tp);
    EXPECT_EQ(max_abs_diff(y, x), 0);
    y.backward(at::full({3}, r + 1.0, opt));
    EXPECT_EQ(max_abs_diff(x.grad(), at::full({3}, tri)), 0);
  }
  {  // once_over_tp: fwd identity; bwd the gradient on rank 0, zeros elsewhere; inside copy_to_tp
     // the sum then counts a whole gradient (here 4 on every rank) once.
    auto x = leaf(at::full({3}, 5.0, opt));
    auto y = once_over_tp(x, tp);
    EXPECT_EQ(max_abs_diff(y, x), 0);
    y.backward(at::full({3}, 4.0, opt));
    EXPECT_EQ(max_abs_diff(x.grad(), at::full({3}, r == 0 ? 4.0 : 0.0)), 0);
    auto z = leaf(at::full({3}, 5.0, opt));
    auto entered = copy_to_tp(z, tp);
    (once_over_tp(entered, tp) * 4.0 + entered * (r + 1.0)).sum().backward();
    EXPECT_EQ(max_abs_diff(z.grad(), at::full({3}, 4.0 + tri)), 0);
  }
  {  // reduce_from_tp: fwd sums (r + 1); bwd identity.
    auto x = leaf(at::full({3}, r + 1.0, opt));
    auto y = reduce_from_tp(x, tp);
    EXPECT_EQ(max_abs_diff(y, at::full({3}, tri)), 0);
    y.backward(at::full({3}, 7.0 * (r + 1), opt));
    EXPECT_EQ(max_abs_diff(x.grad(), at::full({3}, 7.0 * (r + 1))), 0);
  }
  {  // scatter_to_tp: fwd columns [2r, 2r + 2); bwd gathers every rank's (q + 1) block.
    auto x = leaf(arange2d(2, 2 * n).to(dtype));
    auto y = scatter_to_tp(x, tp);
    EXPECT_EQ(max_abs_diff(y, arange2d(2, 2 * n).narrow(1, 2 * r, 2)), 0);
    y.backward(at::full({2, 2}, r + 1.0, opt));
    auto expect = (at::arange(2 * n, at::kFloat).div(2, "floor") + 1).expand({2, 2 * n});
    EXPECT_EQ(max_abs_diff(x.grad(), expect), 0);
  }
  {  // gather_from_tp: fwd columns of block q hold q; bwd takes this rank's block.
    auto x = leaf(at::full({2, 2}, static_cast<double>(r), opt));
    auto y = gather_from_tp(x, tp);
    auto expect = at::arange(2 * n, at::kFloat).div(2, "floor").expand({2, 2 * n});
    EXPECT_EQ(max_abs_diff(y, expect), 0);
    y.backward(arange2d(2, 2 * n).to(dtype));
    EXPECT_EQ(max_abs_diff(x.grad(), arange2d(2, 2 * n).narrow(1, 2 * r, 2)), 0);
  }
  {  // scatter_to_sequence_parallel: fwd rows [2r, 2r + 2); bwd all-gathers (q + 1).
    auto x = leaf(arange2d(2 * n, 3).to(dtype));
    auto y = scatter_to_sequence_parallel(x, tp);
    EXPECT_EQ(max_abs_diff(y, arange2d(2 * n, 3).narrow(0, 2 * r, 2)), 0);
    y.backward(at::full({2, 3}, r + 1.0, opt));
    auto expect = (at::arange(2 * n, at::kFloat).div(2, "floor") + 1).unsqueeze(1).expand({2 * n, 3});
    EXPECT_EQ(max_abs_diff(x.grad(), expect), 0);
  }
  {  // gather_from_sequence_parallel: fwd rows of block q hold q; bwd reduce-scatters
     // (r + 1) * A, giving tri * A's rows of this rank.
    auto x = leaf(at::full({2, 3}, static_cast<double>(r), opt));
    auto y = gather_from_sequence_parallel(x, tp);
    auto expect = at::arange(2 * n, at::kFloat).div(2, "floor").unsqueeze(1).expand({2 * n, 3});
    EXPECT_EQ(max_abs_diff(y, expect), 0);
    y.backward((arange2d(2 * n, 3) * (r + 1)).to(dtype));
    EXPECT_EQ(max_abs_diff(x.grad(), arange2d(2 * n, 3).narrow(0, 2 * r, 2) * tri), 0);
  }
  {  // reduce_scatter_to_sequence_parallel: fwd sums (r + 1) * A and keeps rows of this rank;
     // bwd all-gathers the gradient q of every rank's block.
    auto x = leaf((arange2d(2 * n, 3) * (r + 1)).to(dtype));
    auto y = reduce_scatter_to_sequence_parallel(x, tp);
    EXPECT_EQ(max_abs_diff(y, arange2d(2 * n, 3).narrow(0, 2 * r, 2) * tri), 0);
    y.backward(at::full({2, 3}, static_cast<double>(r), opt));
    auto expect = at::arange(2 * n, at::kFloat).div(2, "floor").unsqueeze(1).expand({2 * n, 3});
    EXPECT_EQ(max_abs_diff(x.grad(), expect), 0);
  }
}

LF_WORKER_CASE(tp_mappings) {
  auto ctx = lf::testing::make_context(lf::testing::worker_world_size());
  check_mappings(*ctx, at::kFloat);
  check_mappings(*ctx, at::kBFloat16);  // small integers: exact in bf16 too
}

TEST(TpMappings, HandComputedValuesOnTwoRanks) {
  lf::testing::expect_all_ok(lf::testing::run_workers("tp_mappings", {.world_size = 2}));
}
TEST(TpMappings, HandComputedValuesOnFourRanks) {
  lf::testing::expect_all_ok(lf::testing::run_workers("tp_mappings", {.world_size = 4}));
}

// TP 2 x DP 2: the default stream (replicated regions) draws one mask everywhere; the
// model-parallel stream (TP-split regions) draws the same mask on ranks with the same TP rank
// and different masks across TP ranks.
LF_WORKER_CASE(tp_rng_streams) {
  auto ctx = lf::testing::make_context(2);
  RngTracker rng(1234, ctx->tp_rank());
  auto ones = at::ones({64, 32});
  at::Tensor masks = at::stack({dropout(ones, 0.5, rng.get(RngTracker::kDefault)),
                                dropout(ones, 0.5, rng.get(RngTracker::kModelParallel))});
  EXPECT_GT(masks.eq(0).sum().item<int64_t>(), 0);
  EXPECT_EQ(masks.ne(0).logical_and(masks.ne(2)).sum().item<int64_t>(), 0);  // 1 / (1 - p) = 2
  // [world, 2, 64, 32]: every rank's two masks.
  auto all = lf::parallel::comm::all_gather(masks.unsqueeze(0), ctx->world(), 0);
  const auto& layout = ctx->layout();
  for (int a = 0; a < ctx->world_size(); ++a)
    for (int b = 0; b < ctx->world_size(); ++b) {
      EXPECT_TRUE(at::equal(all[a][0], all[b][0])) << "default stream, ranks " << a << " " << b;
      const bool same_tp = layout.coords(a).tp == layout.coords(b).tp;
      EXPECT_EQ(at::equal(all[a][1], all[b][1]), same_tp)
          << "model-parallel stream, ranks " << a << " " << b;
    }
  // Two streams with one seed would silently correlate: refused.
  EXPECT_THROW(rng.add("other", rng.seed(RngTracker::kDefault)), lf::Error);
  // p = 0 is the identity (the default config).
  EXPECT_TRUE(at::equal(dropout(ones, 0.0, rng.get(RngTracker::kDefault)), ones));
}

TEST(TpRng, StreamsMatchWithinAndDifferAcrossTpRanks) {
  lf::testing::expect_all_ok(lf::testing::run_workers("tp_rng_streams", {.world_size = 4}));
}

}  // namespace
}  // namespace lf::parallel

// Column/row-parallel linear, vocab-parallel embedding and vocab-parallel cross entropy, with and
// without sequence parallelism, on 2 and 4 ranks: values and gradients equal the unsharded ATen
// computation. Every rank draws the same full tensors from one seed, keeps its shards, and the
// sharded gradients are compared with the shards of the full gradients.
//
// Tolerance (fp32): the sharded math sums the same products in a different order (a matmul split
// over its reduction dim, then an all-reduce), a few ulps: 1e-5 relative to the largest
// magnitude of the reference (LF_EXPECT_CLOSE).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "loongforge/parallel/tensor/cross_entropy.h"
#include "multiprocess.h"
#include "tp_testing.h"

namespace lf::parallel {
namespace {
constexpr double kTol = 1e-5;
using lf::testing::shard_along;

at::Tensor randn(at::Generator& g, std::vector<int64_t> shape) {
  return at::normal(0.0, 1.0, shape, g, at::kFloat);
}
at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

void check_linear(lf::dist::ParallelContext& ctx, bool sp) {
  SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
  auto& comm = ctx.tp();
  const int n = comm.size(), r = comm.rank();
  TensorParallel tp{&comm, sp};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  const int64_t s = 2 * n, b = 3, in = 4 * n, out = 2 * n;
  auto X = leaf(randn(gen, {s, b, in}));
  auto W = leaf(randn(gen, {out, in}));
  auto W2 = leaf(randn(gen, {in, out}));
  auto bias = leaf(randn(gen, {in}));
  auto C = randn(gen, {s, b, in});
  // Reference: the MLP-like pair column -> row, full tensors.
  auto Y = at::linear(X, W);                   // [s, b, out]
  auto Z = at::linear(Y, W2, bias);            // [s, b, in]
  (Z * C).sum().backward();

  auto x = leaf(sp ? shard_along(X, 0, r, n) : X);
  auto w = leaf(shard_along(W, 0, r, n));
  auto w2 = leaf(shard_along(W2, 1, r, n));
  auto bb = leaf(bias);
  auto y = column_parallel_linear(x, w, {}, tp);  // [s, b, out / n]
  LF_EXPECT_CLOSE(y, shard_along(Y, -1, r, n), kTol);
  auto z = row_parallel_linear(y, w2, bb, tp);    // [s(/n), b, in]
  LF_EXPECT_CLOSE(z, sp ? shard_along(Z, 0, r, n) : Z, kTol);
  // Without SP the loss is replicated (each rank computes it whole); with SP each rank holds the
  // loss of its own sequence chunk and the total is their sum.
  (z * (sp ? shard_along(C, 0, r, n) : C)).sum().backward();
  LF_EXPECT_CLOSE(x.grad(), sp ? shard_along(X.grad(), 0, r, n) : X.grad(), kTol);
  LF_EXPECT_CLOSE(w.grad(), shard_along(W.grad(), 0, r, n), kTol);
  LF_EXPECT_CLOSE(w2.grad(), shard_along(W2.grad(), 1, r, n), kTol);
  // The replicated bias sees only this rank's tokens under SP: summed over TP it is whole.
  auto bias_grad = sp ? comm::all_reduce(bb.grad(), comm) : bb.grad();
  LF_EXPECT_CLOSE(bias_grad, bias.grad(), kTol);

  // gather_output: the full result on every rank, gradient of this rank's columns.
  if (!sp) {
    auto x2 = leaf(X);
    auto full = column_parallel_linear(x2, w, {}, TensorParallel{&comm, false}, true);
    LF_EXPECT_CLOSE(full, Y, kTol);
  }
}

void check_embedding(lf::dist::ParallelContext& ctx, bool sp) {
  SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
  auto& comm = ctx.tp();
  const int n = comm.size(), r = comm.rank();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const int64_t v = 5 * n, h = 6, s = 2 * n, b = 3;
  auto E = leaf(randn(gen, {v, h}));
  auto tokens = at::randint(0, v, {s, b}, gen, at::TensorOptions().dtype(at::kLong));
  tokens.index_put_({0, 0}, v - 1);  // the last rank's last row
  tokens.index_put_({1, 0}, 0);
  auto C = randn(gen, {s, b, h});
  (at::embedding(E, tokens) * C).sum().backward();

  auto e = leaf(shard_along(E, 0, r, n));
  auto y = vocab_parallel_embedding(tokens, e, TensorParallel{&comm, sp});
  auto Y = at::embedding(E, tokens);
  LF_EXPECT_CLOSE(y, sp ? shard_along(Y, 0, r, n) : Y, 0.0);  // one non-zero term per sum: exact
  (y * (sp ? shard_along(C, 0, r, n) : C)).sum().backward();
  LF_EXPECT_CLOSE(e.grad(), shard_along(E.grad(), 0, r, n), kTol);
}

// Padded vocabulary (columns >= vocab are padding: no probability mass) and ignored targets.
void check_cross_entropy(lf::dist::ParallelContext& ctx, at::ScalarType dtype, double tol) {
  SCOPED_TRACE(c10::toString(dtype));
  auto& comm = ctx.tp();
  const int n = comm.size(), r = comm.rank();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t rows = 10, padded = 8 * n, vocab = padded - 3;  // the last rank holds padding
  auto Zfull = (randn(gen, {rows, padded}) * 4).to(dtype);
  auto target = at::randint(0, vocab, {rows}, gen, at::TensorOptions().dtype(at::kLong));
  target.index_put_({0}, vocab - 1);  // the last real column
  target.index_put_({1}, 0);
  target.index_put_({2}, -100);       // ignored
  auto weights = randn(gen, {rows});

  auto Z = leaf(Zfull.to(at::kFloat));
  auto ref = at::cross_entropy_loss(Z.narrow(1, 0, vocab), target, {}, at::Reduction::None, -100);
  (ref * weights).sum().backward();  // Z.grad: zero on padding columns

  auto z = leaf(shard_along(Zfull, 1, r, n));
  auto loss = vocab_parallel_cross_entropy(z, target, comm, vocab);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  LF_EXPECT_CLOSE(loss, ref, kTol);  // fp32 math on the same values in both
  EXPECT_EQ(loss[2].item<double>(), 0.0);
  (loss * weights).sum().backward();
  EXPECT_EQ(z.grad().scalar_type(), dtype);
  LF_EXPECT_CLOSE(z.grad().to(at::kFloat), shard_along(Z.grad(), 1, r, n), tol);
}

LF_WORKER_CASE(tp_layers) {
  auto ctx = lf::testing::make_context(lf::testing::worker_world_size());
  check_linear(*ctx, false);
  check_linear(*ctx, true);
  check_embedding(*ctx, false);
  check_embedding(*ctx, true);
  check_cross_entropy(*ctx, at::kFloat, kTol);
  // bf16 logits are upcast once and the math is fp32; the gradient is rounded to bf16 at the end:
  // half an ulp of values below 1 is 2^-9 ~ 2e-3.
  check_cross_entropy(*ctx, at::kBFloat16, 4e-3);
}

TEST(TpLayers, EqualUnshardedOnTwoRanks) {
  lf::testing::expect_all_ok(lf::testing::run_workers("tp_layers", {.world_size = 2}));
}
TEST(TpLayers, EqualUnshardedOnFourRanks) {
  lf::testing::expect_all_ok(lf::testing::run_workers("tp_layers", {.world_size = 4}));
}

}  // namespace
}  // namespace lf::parallel

// Context-parallel attention on 2 and 4 ranks (Gloo) against one process's attention over the
// whole sequence: ring (p2p) and Ulysses (a2a), forward output and the gradients of q, k, v, with
// GQA, a value head size other than the key's (as MLA has), and packed documents. Plus the
// load-balanced layout itself.
//
// Tolerance 2e-6 of the largest magnitude (fp32): the same products as the single process, summed
// in another order (per-block softmax merged by logsumexp, gradients summed over blocks).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "loongforge/backend/functional.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/models/blocks/attention.h"
#include "loongforge/parallel/context/context_parallel.h"
#include "multiprocess.h"
#include "tp_testing.h"

namespace lf::parallel {
namespace {

std::unique_ptr<lf::dist::ParallelContext> cp_context(int cp) {
  auto& rendezvous = lf::testing::test_rendezvous();
  lf::dist::ParallelSizes sizes;
  sizes.cp = cp;
  lf::dist::ParallelLayout layout(rendezvous.world_size(), sizes);
  lf::dist::ParallelContextOptions options;
  options.timeout = std::chrono::seconds(60);
  options.kinds = {lf::dist::GroupKind::world, lf::dist::GroupKind::cp};
  return std::make_unique<lf::dist::ParallelContext>(rendezvous, layout, options);
}

TEST(ContextParallelLayout, ChunksBalanceTheCausalTriangle) {
  EXPECT_EQ(cp_chunks(2, 0), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(cp_chunks(2, 1), std::make_pair(int64_t{1}, int64_t{2}));
  EXPECT_EQ(cp_chunks(4, 1), std::make_pair(int64_t{1}, int64_t{6}));
  auto p = cp_positions(16, 2, 1);
  EXPECT_TRUE(p.equal(at::tensor({4, 5, 6, 7, 8, 9, 10, 11}, at::kLong)));
  auto x = at::arange(16, at::kLong).view({1, 16});
  EXPECT_TRUE(cp_slice(x, 1, 2, 0).equal(at::tensor({0, 1, 2, 3, 12, 13, 14, 15}, at::kLong).view({1, 8})));
  // Every position once over the ranks.
  std::vector<at::Tensor> all;
  for (int r = 0; r < 4; ++r) all.push_back(cp_positions(32, 4, r));
  EXPECT_TRUE(std::get<0>(at::cat(all).sort()).equal(at::arange(32, at::kLong)));
  EXPECT_THROW(cp_positions(12, 4, 0), lf::Error);  // 12 tokens do not make 8 chunks
  EXPECT_EQ(parse_cp_comm_type("a2a"), CpCommType::a2a);
  EXPECT_THROW(parse_cp_comm_type("ring"), lf::Error);
}

void check_attention(lf::dist::ParallelContext* ctx, CpCommType comm, bool documents, int64_t dv) {
  const auto& be = lf::backend::cpu_backend();
  const int n = ctx->cp_size(), r = ctx->cp_rank();
  SCOPED_TRACE(std::string(to_string(comm)) + (documents ? ", documents" : "") + ", cp " + std::to_string(n) +
               ", rank " + std::to_string(r));
  const int64_t b = 2, nq = 4, nkv = 2, s = 16 * n, d = 8;
  at::manual_seed(7);  // the same full tensors on every rank
  auto q = at::randn({b, nq, s, d}), k = at::randn({b, nkv, s, d}), v = at::randn({b, nkv, s, dv});
  auto dout = at::randn({b, nq, s, dv});
  at::Tensor docs;
  if (documents) {
    // Documents of uneven lengths crossing the chunk boundaries; the second row is one document.
    docs = at::zeros({b, s}, at::kLong);
    docs[0] = (at::arange(s, at::kLong) * 3).div(s / 2 + 5, "floor");
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // One process: causal attention over the whole sequence (within documents).
  auto qf = q.clone().requires_grad_(true), kf = k.clone().requires_grad_(true), vf = v.clone().requires_grad_(true);
  auto mask = documents ? lf::backend::AttentionMask::boolean(lf::models::block_causal_mask(docs))
                        : lf::backend::AttentionMask::causal();
  auto of = lf::ops::sdpa(be, qf, kf, vf, mask, scale);
  of.backward(dout);
  // This rank's tokens.
  auto local = [&](const at::Tensor& t) { return cp_slice(t, 2, n, r); };
  auto ql = local(q).requires_grad_(true), kl = local(k).requires_grad_(true), vl = local(v).requires_grad_(true);
  ContextParallel cp{.group = &ctx->cp(), .comm = comm};
  auto whole = [&](const at::Tensor& wq, const at::Tensor& wk, const at::Tensor& wv, const at::Tensor& wd) {
    auto m = wd.defined() ? lf::backend::AttentionMask::boolean(lf::models::block_causal_mask(wd))
                          : lf::backend::AttentionMask::causal();
    return lf::ops::sdpa(be, wq, wk, wv, m, scale);
  };
  auto ol = context_parallel_attention(be, cp, ql, kl, vl, docs, scale, whole);
  ol.backward(local(dout));
  LF_EXPECT_CLOSE(ol.detach(), local(of.detach()), 2e-6);
  LF_EXPECT_CLOSE(ql.grad(), local(qf.grad()), 2e-6);
  LF_EXPECT_CLOSE(kl.grad(), local(kf.grad()), 2e-6);
  LF_EXPECT_CLOSE(vl.grad(), local(vf.grad()), 2e-6);
  if (comm == CpCommType::p2p) {
    // Transfers waited for before each block (no overlap): the same numbers, bit for bit, and the
    // ring's timers count one forward and one backward call.
    RingStats stats;
    ContextParallel serial{.group = &ctx->cp(), .comm = comm, .overlap = false, .stats = &stats};
    auto qs = local(q).requires_grad_(true), ks = local(k).requires_grad_(true), vs = local(v).requires_grad_(true);
    auto os = context_parallel_attention(be, serial, qs, ks, vs, docs, scale, whole);
    os.backward(local(dout));
    EXPECT_TRUE(os.equal(ol)) << "serial and overlapped rings differ";
    EXPECT_TRUE(qs.grad().equal(ql.grad()) && ks.grad().equal(kl.grad()) && vs.grad().equal(vl.grad()));
    EXPECT_EQ(stats.calls, 2);
    EXPECT_GT(stats.ring_seconds, 0);
  }
}

LF_WORKER_CASE(cp_attention) {
  auto ctx = cp_context(lf::testing::worker_world_size());
  for (auto comm : {CpCommType::p2p, CpCommType::a2a})
    for (bool documents : {false, true}) check_attention(ctx.get(), comm, documents, 8);
  check_attention(ctx.get(), CpCommType::p2p, false, 6);  // value heads narrower than the keys (MLA)
  check_attention(ctx.get(), CpCommType::a2a, true, 6);
}

TEST(ContextParallelAttention, RingAndUlyssesEqualOneProcessOnTwoRanks) {
  lf::testing::expect_all_ok(lf::testing::run_workers("cp_attention", {.world_size = 2}));
}

// At cp 4 Ulysses repeats the 2 key/value heads to the 4 query heads (2 does not divide by 4).
TEST(ContextParallelAttention, RingAndUlyssesEqualOneProcessOnFourRanks) {
  lf::testing::expect_all_ok(lf::testing::run_workers("cp_attention", {.world_size = 4}));
}

}  // namespace
}  // namespace lf::parallel

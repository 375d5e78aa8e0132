// DSA (DeepSeek sparse attention) ops beyond the harness's fused == reference cases
// (op_cases.cpp): the reference pinned to independent compositions (a per-query loop for the
// top-k and the attention, ATen autograd for the gradients), argument errors, and the fused CPU
// path's peak memory growing linearly with the sequence while the reference's grows with its
// square (the table of docs/performance.md: LF_DSA_MEMORY_TABLE=4096,8192,...).
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "loongforge/backend/reference_ops.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "op_cases.h"

namespace lf::testing {
namespace {

using backend::ReferenceOps;

const ReferenceOps kRef;
const auto kF64 = at::TensorOptions().dtype(at::kDouble);

void expect_close(const at::Tensor& a, const at::Tensor& e, double tol, const std::string& what) {
  auto r = compare(a, e, tol, tol);
  EXPECT_TRUE(r.ok) << what << ": " << r.detail;
}

// The dense index scores by autograd-able ATen: [b, sq, sk].
at::Tensor index_scores(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w, double scale) {
  return (at::relu(at::einsum("bshd,btd->bsht", {qi, ki}) * scale) * w.unsqueeze(-1)).sum(2);
}

TEST(ReferenceDsa, TopkIsEachQuerysBestVisibleKeysInOrder) {
  at::manual_seed(3);
  const int64_t b = 2, sq = 9, sk = 12, k = 5;  // bottom-right: query s sees keys t <= s + 3
  auto qi = at::randn({b, sq, 3, 8}, kF64), ki = at::randn({b, sk, 8}, kF64), w = at::randn({b, sq, 3}, kF64);
  auto idx = kRef.dsa_indexer_topk(qi, ki, w, 0.5, k);
  auto scores = index_scores(qi, ki, w, 0.5);
  ASSERT_EQ(idx.sizes(), (at::IntArrayRef{b, sq, k}));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t s = 0; s < sq; ++s) {
      const int64_t visible = s + (sk - sq) + 1;
      std::vector<std::pair<double, int64_t>> row;
      for (int64_t t = 0; t < visible; ++t) row.push_back({-scores[bi][s][t].item<double>(), t});
      std::sort(row.begin(), row.end());
      for (int64_t j = 0; j < k; ++j)
        EXPECT_EQ(idx[bi][s][j].item<int64_t>(), j < visible ? row[j].second : -1) << bi << " " << s << " " << j;
    }
  // Ties go to the lower key: all-zero scores select keys 0, 1, 2 ...
  auto tie = kRef.dsa_indexer_topk(qi, ki, at::zeros_like(w), 0.5, k);
  EXPECT_TRUE(tie[0][sq - 1].equal(at::arange(k, at::kLong))) << tie[0][sq - 1];
  // The fused CPU path follows the same rule.
  auto fused_tie = backend::cpu_backend().ops().dsa_indexer_topk(qi, ki, at::zeros_like(w), 0.5, k);
  EXPECT_TRUE(fused_tie.equal(tie));
}

TEST(ReferenceDsa, IndexerScoresAndGradientsMatchAutograd) {
  at::manual_seed(4);
  const int64_t b = 2, sq = 7, sk = 7;
  auto qi = at::randn({b, sq, 3, 8}, kF64).requires_grad_(), ki = at::randn({b, sk, 8}, kF64).requires_grad_(),
       w = at::randn({b, sq, 3}, kF64).requires_grad_();
  auto idx = kRef.dsa_indexer_topk(qi.detach(), ki.detach(), w.detach(), 0.5, 4);
  auto got = kRef.dsa_indexer_scores_fwd(qi.detach(), ki.detach(), w.detach(), idx, 0.5);
  auto valid = idx.ge(0);
  auto want = index_scores(qi, ki, w, 0.5).gather(2, idx.clamp_min(0));
  expect_close(got.masked_select(valid), want.masked_select(valid).detach(), 1e-12, "index scores");
  EXPECT_TRUE(at::isinf(got.masked_select(valid.logical_not())).all().item<bool>());
  auto cot = at::randn({b, sq, 4}, kF64);
  auto g = torch::autograd::grad({(want * cot).masked_select(valid).sum()}, {qi, ki, w});
  auto r = kRef.dsa_indexer_scores_bwd(cot, qi.detach(), ki.detach(), w.detach(), idx, 0.5);
  expect_close(r.dq, g[0], 1e-12, "dq");
  expect_close(r.dk, g[1], 1e-12, "dk");
  expect_close(r.dw, g[2], 1e-12, "dw");
}

TEST(ReferenceDsa, SparseAttentionMatchesPerQuerySoftmaxAndAutograd) {
  at::manual_seed(5);
  const int64_t b = 2, nq = 4, nkv = 2, sq = 6, sk = 8, d = 5, dv = 3;
  auto q = at::randn({b, nq, sq, d}, kF64).requires_grad_(), k = at::randn({b, nkv, sk, d}, kF64).requires_grad_(),
       v = at::randn({b, nkv, sk, dv}, kF64).requires_grad_();
  auto idx = kRef.dsa_indexer_topk(at::randn({b, sq, 2, 4}, kF64), at::randn({b, sk, 4}, kF64),
                                   at::randn({b, sq, 2}, kF64), 1.0, 4);
  const double scale = 0.7;
  auto r = kRef.dsa_sparse_attention_fwd(q.detach(), k.detach(), v.detach(), idx, scale);
  std::vector<at::Tensor> rows;
  auto head_prob = at::zeros({b, sq, 4}, kF64);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < nq; ++h)
      for (int64_t s = 0; s < sq; ++s) {
        auto sel = idx[bi][s].masked_select(idx[bi][s].ge(0));
        auto ks = k[bi][h / 2].index_select(0, sel), vs = v[bi][h / 2].index_select(0, sel);
        auto p = at::softmax(at::matmul(ks, q[bi][h][s]) * scale, 0);
        rows.push_back(at::matmul(p, vs));
        head_prob[bi][s].narrow(0, 0, sel.size(0)) += p.detach();
      }
  auto want = at::stack(rows).view({b, nq, sq, dv});
  expect_close(r.o, want.detach(), 1e-12, "o");
  expect_close(r.head_prob, head_prob, 1e-12, "head_prob");
  auto dout = at::randn({b, nq, sq, dv}, kF64);
  auto g = torch::autograd::grad({(want * dout).sum()}, {q, k, v});
  auto bw = kRef.dsa_sparse_attention_bwd(dout, q.detach(), k.detach(), v.detach(), idx, r.o, r.lse, scale);
  expect_close(bw.dq, g[0], 1e-12, "dq");
  expect_close(bw.dk, g[1], 1e-12, "dk");
  expect_close(bw.dv, g[2], 1e-12, "dv");
}

TEST(DsaChecks, ArgumentsAreClearErrors) {
  auto qi = at::randn({1, 4, 2, 8}), ki = at::randn({1, 4, 8}), w = at::randn({1, 4, 2});
  for (const backend::OpTable* ops : {static_cast<const backend::OpTable*>(&kRef), &backend::cpu_backend().ops()}) {
    try {
      ops->dsa_indexer_topk(qi, ki, w, 1.0, 5);
      FAIL() << "expected lf::Error";
    } catch (const lf::Error& e) {
      EXPECT_NE(std::string(e.what()).find("topk 5 must lie in [1, 4]"), std::string::npos) << e.what();
    }
    try {
      ops->dsa_sparse_attention_fwd(at::randn({1, 2, 4, 8}), at::randn({1, 2, 4, 8}), at::randn({1, 2, 4, 8}),
                                    at::full({1, 4, 2}, 4, at::kLong), 1.0);
      FAIL() << "expected lf::Error";
    } catch (const lf::Error& e) {
      EXPECT_NE(std::string(e.what()).find("must lie in [0, 4) or be -1"), std::string::npos) << e.what();
    }
  }
}

// The harness's shapes fit in one block of the fused path; these cross many block boundaries
// (the top-k in 16 blocks of 64 queries, the attention in 17 of 63, the indexer scores in 2). The
// selection in fp64 (no near-ties from rounding among 1024 keys), then every output in fp32 at the
// harness's 1e-5 on that selection, and in fp64 at 1e-10 (a block mix-up shows at O(1)).
TEST(FusedDsa, EqualsReferenceAcrossManyBlocks) {
  const auto& fused = backend::cpu_backend().ops();
  at::manual_seed(12);
  const int64_t sq = 1024, sk = 1024, nh = 64, di = 32, topk = 64;
  auto qi = at::randn({1, sq, nh, di}, kF64), ki = at::randn({1, sk, di}, kF64), w = at::randn({1, sq, nh}, kF64);
  const double si = 1.0 / std::sqrt(32.0);
  auto idx = kRef.dsa_indexer_topk(qi, ki, w, si, topk);
  EXPECT_TRUE(fused.dsa_indexer_topk(qi, ki, w, si, topk).equal(idx));
  auto q0 = at::randn({1, 8, sq, 64}, kF64), k0 = at::randn({1, 8, sk, 64}, kF64), v0 = at::randn({1, 8, sk, 64}, kF64);
  auto dsc0 = at::randn({1, sq, topk}, kF64), dout0 = at::randn({1, 8, sq, 64}, kF64);
  auto qi0 = qi, ki0 = ki, w0 = w;
  for (const auto dt : {at::kFloat, at::kDouble}) {
    const double tol = dt == at::kFloat ? 1e-5 : 1e-10;
    const char* name = dt == at::kFloat ? "fp32" : "fp64";
    qi = qi0.to(dt), ki = ki0.to(dt), w = w0.to(dt);
    auto q = q0.to(dt), k = k0.to(dt), v = v0.to(dt), dsc = dsc0.to(dt), dout = dout0.to(dt);
    auto report = [tol, name](const char* what, const at::Tensor& a, const at::Tensor& e) {
      auto r = compare(a, e, tol, tol);
      std::cout << "fused vs reference, " << name << ", " << what << ": max |diff| " << r.max_abs << "\n";
      EXPECT_TRUE(r.ok) << name << " " << what << ": " << r.detail;
    };
    report("index scores", fused.dsa_indexer_scores_fwd(qi, ki, w, idx, si), kRef.dsa_indexer_scores_fwd(qi, ki, w, idx, si));
    auto gf = fused.dsa_indexer_scores_bwd(dsc, qi, ki, w, idx, si), gr = kRef.dsa_indexer_scores_bwd(dsc, qi, ki, w, idx, si);
    report("indexer dq", gf.dq, gr.dq);
    report("indexer dk", gf.dk, gr.dk);
    report("indexer dw", gf.dw, gr.dw);
    auto af = fused.dsa_sparse_attention_fwd(q, k, v, idx, 0.125), ar = kRef.dsa_sparse_attention_fwd(q, k, v, idx, 0.125);
    report("o", af.o, ar.o);
    report("lse", af.lse, ar.lse);
    report("head_prob", af.head_prob, ar.head_prob);
    auto bf = fused.dsa_sparse_attention_bwd(dout, q, k, v, idx, af.o, af.lse, 0.125);
    auto br = kRef.dsa_sparse_attention_bwd(dout, q, k, v, idx, ar.o, ar.lse, 0.125);
    report("dq", bf.dq, br.dq);
    report("dk", bf.dk, br.dk);
    report("dv", bf.dv, br.dv);
  }
}

// ---- memory ---------------------------------------------------------------------------------

// One DSA layer's ops, forward and backward, at sequence length s (batch 1, 4 indexer heads of 32,
// 8 attention heads of 64, top-256 keys); returns the peak bytes above what was live before and
// the seconds taken.
struct Measured {
  double peak_mib = 0, seconds = 0;
  double topk_s = 0, scores_s = 0, attention_s = 0;  // the indexer's top-k, its scores fwd+bwd, the attention fwd+bwd
};
Measured measure(const backend::OpTable& ops, int64_t s) {
  const auto& be = backend::cpu_backend();
  at::manual_seed(6);
  auto qi = at::randn({1, s, 4, 32}), ki = at::randn({1, s, 32}), w = at::randn({1, s, 4});
  auto q = at::randn({1, 8, s, 64}), k = at::randn({1, 8, s, 64}), v = at::randn({1, 8, s, 64});
  const int64_t base = be.memory_stats().allocated_bytes;
  be.reset_peak_memory();
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  Measured m;
  const auto t0 = clock::now();
  {
    auto t = clock::now();
    auto idx = ops.dsa_indexer_topk(qi, ki, w, 1.0 / std::sqrt(32.0), 256);
    m.topk_s = since(t);
    t = clock::now();
    auto scores = ops.dsa_indexer_scores_fwd(qi, ki, w, idx, 0.1);
    auto ib = ops.dsa_indexer_scores_bwd(at::ones_like(scores), qi, ki, w, idx, 0.1);
    m.scores_s = since(t);
    t = clock::now();
    auto a = ops.dsa_sparse_attention_fwd(q, k, v, idx, 0.125);
    auto ab = ops.dsa_sparse_attention_bwd(at::ones_like(a.o), q, k, v, idx, a.o, a.lse, 0.125);
    m.attention_s = since(t);
  }
  m.seconds = since(t0);
  m.peak_mib = static_cast<double>(be.memory_stats().peak_allocated_bytes - base) / (1 << 20);
  return m;
}

TEST(DsaMemory, FusedPeakGrowsLinearlyReferenceQuadratically) {
  const auto& cpu = backend::cpu_backend().ops();
  const auto f1 = measure(cpu, 1024), f2 = measure(cpu, 2048), f4 = measure(cpu, 4096);
  const auto r1 = measure(kRef, 512), r2 = measure(kRef, 1024);
  std::cout << "peak MiB above inputs, fused: 1K " << f1.peak_mib << ", 2K " << f2.peak_mib << ", 4K "
            << f4.peak_mib << "; reference: 512 " << r1.peak_mib << ", 1K " << r2.peak_mib << "\n";
  // Linear: doubling the sequence at most doubles the peak (+ a fixed block); quadratic: x4.
  EXPECT_LT(f4.peak_mib, 2.2 * f2.peak_mib);
  EXPECT_LT(f2.peak_mib, 2.2 * f1.peak_mib);
  EXPECT_GT(r2.peak_mib, 3.5 * r1.peak_mib);
  EXPECT_LT(f2.peak_mib, measure(kRef, 2048).peak_mib / 4);

  // The table of docs/performance.md: LF_DSA_MEMORY_TABLE=4096,8192,16384,32768,65536 (the
  // reference only where its [b, nq, sq, sk] fits: up to 4K).
  const char* table = std::getenv("LF_DSA_MEMORY_TABLE");
  if (!table) return;
  std::stringstream ss(table);
  std::string item;
  std::cout << "| sequence | fused peak MiB | fused seconds (top-k / indexer scores / attention) | reference peak MiB |\n"
               "|---|---|---|---|\n";
  while (std::getline(ss, item, ',')) {
    const int64_t s = std::stoll(item);
    const auto f = measure(cpu, s);
    std::cout << "| " << s << " | " << f.peak_mib << " | " << f.seconds << " (" << f.topk_s << " / " << f.scores_s
              << " / " << f.attention_s << ") | ";
    if (s <= 4096)
      std::cout << measure(kRef, s).peak_mib;
    else
      std::cout << "-";
    std::cout << " |" << std::endl;
  }
}

}  // namespace
}  // namespace lf::testing

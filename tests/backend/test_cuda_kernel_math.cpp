// The CUDA kernels' per-item math (backends/cuda/kernels/kernel_math.h) run on the host: every
// item of each kernel's grid, in the order of the kernel's index arithmetic, against the CPU
// reference (ReferenceOps) in fp32. This checks the formulas and the indexing of RMSNorm, SwiGLU,
// RoPE, AdamW, the sum of squares, the MoE (un)permutation and the DSA indexer's scores on every
// machine (the cross entropy's: test_chunked_cross_entropy.cpp); the GPU-only parts (launch
// shapes, warp sums, bf16/fp16 storage) are the op harness's on a GPU machine. Warp reductions are
// emulated as the sum of the 32 lanes' partials.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/kernel_math.h"
#include "loongforge/backend/reference_ops.h"
#include "op_cases.h"

namespace lf::testing {
namespace {

namespace ck = lf::cuda_kernels;
using backend::ReferenceOps;

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed, double scale = 1.0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * scale;
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const char* what, double tol = 1e-5) {
  const auto r = compare(actual, expected, tol, tol);
  EXPECT_TRUE(r.ok) << what << ": " << r.detail << " (max |diff| " << r.max_abs << ")";
}

// The RMSNorm kernels as launched: one block of 256 threads per row (forward); the backward's
// blocks of 3 rows each adding into their own fp32 dw partial row, summed at the end.
TEST(CudaKernelMath, RmsNormEqualsTheReference) {
  const ReferenceOps ref;
  constexpr int kThreads = 256;
  const int64_t rows = 7, h = 300;  // h > 256: some threads take two columns
  const at::Tensor x = randn({rows, h}, 21), w = randn({h}, 22) + 1.0, dy = randn({rows, h}, 23);
  const auto want_f = ref.rms_norm_fwd(x, w, 1e-5);
  at::Tensor y = at::full_like(x, std::numeric_limits<float>::quiet_NaN()), rstd = at::empty({rows});
  for (int64_t row = 0; row < rows; ++row) {
    float sum = 0.0f;
    for (int tid = 0; tid < kThreads; ++tid) sum += ck::rms_square_partial(x.data_ptr<float>(), row, h, tid, kThreads);
    const float r = ck::rms_rstd(sum, h, 1e-5f);
    rstd.data_ptr<float>()[row] = r;
    for (int64_t i = 0; i < h; ++i) ck::rms_norm_fwd_item(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), row, i, h, r);
  }
  expect_close(y, want_f.y, "y");
  expect_close(rstd, want_f.rstd, "rstd");
  const auto want_b = ref.rms_norm_bwd(dy, x, w, want_f.rstd);
  const int64_t per_block = 3, blocks = (rows + per_block - 1) / per_block;
  at::Tensor dx = at::full_like(x, std::numeric_limits<float>::quiet_NaN()), partial = at::zeros({blocks, h});
  for (int64_t row = 0; row < rows; ++row) {
    const float r = want_f.rstd.data_ptr<float>()[row];
    float dot = 0.0f;
    for (int tid = 0; tid < kThreads; ++tid)
      dot += ck::rms_bwd_dot_partial(dy.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(), row, h, r, tid,
                                     kThreads);
    for (int64_t i = 0; i < h; ++i)
      ck::rms_norm_bwd_item(dy.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(), dx.data_ptr<float>(),
                            partial.data_ptr<float>() + (row / per_block) * h, row, i, h, r, dot / static_cast<float>(h));
  }
  expect_close(dx, want_b.dx, "dx");
  expect_close(partial.sum(0), want_b.dw, "dw");
}

TEST(CudaKernelMath, SwigluEqualsTheReference) {
  const ReferenceOps ref;
  const int64_t rows = 5, f = 33;
  const at::Tensor gu = randn({rows, 2 * f}, 24, 2.0), dy = randn({rows, f}, 25);
  at::Tensor y = at::full({rows, f}, std::numeric_limits<float>::quiet_NaN());
  at::Tensor dgu = at::full_like(gu, std::numeric_limits<float>::quiet_NaN());
  for (int64_t i = 0; i < rows * f; ++i) {
    ck::swiglu_fwd_item(gu.data_ptr<float>(), y.data_ptr<float>(), i, f);
    ck::swiglu_bwd_item(dy.data_ptr<float>(), gu.data_ptr<float>(), dgu.data_ptr<float>(), i, f);
  }
  expect_close(y, ref.swiglu_fwd(gu), "y");
  expect_close(dgu, ref.swiglu_bwd(dy, gu), "dgate_up");
}

// The sum of squares as launched: 64K-element chunks of each tensor, 256 threads a chunk, the
// chunks' partials summed in order; fp64 throughout, compared at 1e-12.
TEST(CudaKernelMath, SquareSumEqualsTheReference) {
  const ReferenceOps ref;
  constexpr int kThreads = 256;
  constexpr int64_t kChunk = int64_t{1} << 16;
  const std::vector<at::Tensor> ts{randn({70001}, 26), randn({5}, 27), randn({129, 3}, 28, 3.0)};
  double total = 0.0;
  for (const auto& t : ts)
    for (int64_t first = 0; first < t.numel(); first += kChunk) {
      const int64_t end = std::min(t.numel(), first + kChunk);
      for (int tid = 0; tid < kThreads; ++tid)
        total += ck::square_sum_partial(t.data_ptr<float>(), first, end, tid, kThreads);
    }
  const double want = ref.squared_norm(ts).item<double>();
  EXPECT_NEAR(total, want, 1e-12 * want);
}

TEST(CudaKernelMath, RopeEqualsTheReferenceForBothLayoutsAndDirections) {
  const ReferenceOps ref;
  const int64_t s = 5, b = 2, n = 3, d = 12;
  for (const bool interleaved : {false, true})
    for (const int64_t r : {int64_t{12}, int64_t{8}}) {
      const at::Tensor x = randn({s, b, n, d}, 1), cos = randn({s, r}, 2), sin = randn({s, r}, 3);
      for (const bool transpose : {false, true}) {
        // NaN first: an item the grid does not cover shows.
        at::Tensor y = at::full_like(x, std::numeric_limits<float>::quiet_NaN());
        const int64_t items = s * b * n * ck::rope_items_per_row(d, r);
        for (int64_t i = 0; i < items; ++i)
          ck::rope_item(x.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(), y.data_ptr<float>(), i,
                        b * n, d, r, interleaved, transpose);
        const at::Tensor want = transpose ? ref.rope_bwd(x, cos, sin, interleaved) : ref.rope_fwd(x, cos, sin, interleaved);
        SCOPED_TRACE(::testing::Message() << "interleaved " << interleaved << " r " << r << " transpose " << transpose);
        expect_close(y, want, "rope");
      }
    }
}

TEST(CudaKernelMath, AdamWEqualsTheReference) {
  const ReferenceOps ref;
  for (const double wd : {0.0, 0.1}) {
    backend::AdamWHyper hp{3e-3, 0.9, 0.95, 1e-8, wd, 7};
    hp.grad_scale = 0.37;
    const at::Tensor p0 = randn({1000}, 4), g = randn({1000}, 5, 4.0), m0 = randn({1000}, 6, 0.1),
                     v0 = randn({1000}, 7, 0.1).square();
    at::Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
    ref.adamw_step({p}, {g}, {m}, {v}, hp);
    // The constants as CudaOps::adamw_step computes them.
    const double bc1 = 1.0 - std::pow(hp.beta1, 7.0);
    const ck::AdamWConsts k{static_cast<float>(hp.grad_scale), static_cast<float>(1.0 - hp.lr * hp.weight_decay),
                            hp.weight_decay != 0, static_cast<float>(hp.beta1), static_cast<float>(1.0 - hp.beta1),
                            static_cast<float>(hp.beta2), static_cast<float>(1.0 - hp.beta2),
                            static_cast<float>(std::sqrt(1.0 - std::pow(hp.beta2, 7.0))), static_cast<float>(hp.eps),
                            static_cast<float>(-hp.lr / bc1)};
    at::Tensor pk = p0.clone(), mk = m0.clone(), vk = v0.clone();
    for (int64_t i = 0; i < 1000; ++i)
      ck::adamw_item(pk.data_ptr<float>(), g.data_ptr<float>(), mk.data_ptr<float>(), vk.data_ptr<float>(), i, k);
    SCOPED_TRACE(::testing::Message() << "weight decay " << wd);
    expect_close(pk, p, "param");
    expect_close(mk, m, "exp_avg");
    expect_close(vk, v, "exp_avg_sq");
  }
}

// 13 tokens, top-3 of 5 experts with dropped slots, hidden 40 (more than a warp's 32 lanes).
struct MoeInputs {
  at::Tensor x, indices, probs;
  int64_t n = 13, k = 3, h = 40, experts = 5;
};

MoeInputs moe_inputs() {
  MoeInputs in;
  in.x = randn({in.n, in.h}, 8);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  in.indices = at::randint(-1, in.experts, {in.n, in.k}, gen, at::TensorOptions().dtype(at::kLong));
  in.probs = randn({in.n, in.k}, 10).softmax(1);
  return in;
}

TEST(CudaKernelMath, MoeUnpermuteEqualsTheReference) {
  const ReferenceOps ref;
  const MoeInputs in = moe_inputs();
  const auto perm = ref.moe_permute_fwd(in.x, in.indices, in.experts);
  const at::Tensor y = randn({perm.permuted.size(0), in.h}, 11), dout = randn({in.n, in.h}, 12);
  const at::Tensor position = perm.position.contiguous();
  const int64_t* pos = position.data_ptr<int64_t>();

  at::Tensor out = at::full({in.n, in.h}, std::numeric_limits<float>::quiet_NaN());
  for (int64_t i = 0; i < in.n * in.h; ++i)
    ck::unpermute_fwd_item(y.data_ptr<float>(), pos, in.probs.data_ptr<float>(), out.data_ptr<float>(), i, in.k, in.h);
  expect_close(out, ref.moe_unpermute_fwd(y, position, in.probs), "out");

  const auto want = ref.moe_unpermute_bwd(dout, y, position, in.probs);
  at::Tensor dy = at::zeros_like(y);  // as CudaOps: rows no slot owns stay 0
  for (int64_t i = 0; i < in.n * in.k * in.h; ++i)
    ck::unpermute_bwd_dy_item(dout.data_ptr<float>(), pos, in.probs.data_ptr<float>(), dy.data_ptr<float>(), i, in.k,
                              in.h);
  expect_close(dy, want.dy, "dy");
  at::Tensor dprobs = at::empty({in.n, in.k});
  for (int64_t slot = 0; slot < in.n * in.k; ++slot) {
    float total = 0.0f;
    for (int lane = 0; lane < 32; ++lane)
      total += ck::unpermute_dprobs_partial(dout.data_ptr<float>(), y.data_ptr<float>(), pos, slot, in.k, in.h, lane, 32);
    dprobs.data_ptr<float>()[slot] = total;
  }
  expect_close(dprobs, want.dprobs, "dprobs");
  ASSERT_TRUE(position.lt(0).any().item<bool>()) << "the case must have dropped slots";
}

TEST(CudaKernelMath, MoePermuteBackwardGathersEachTokensRowsInAFixedOrder) {
  const ReferenceOps ref;
  const MoeInputs in = moe_inputs();
  const auto perm = ref.moe_permute_fwd(in.x, in.indices, in.experts);
  const int64_t m = perm.source.size(0);
  const at::Tensor dpermuted = randn({m, in.h}, 13);
  // The token-ordered row list and its offsets, as CudaOps::moe_permute_bwd builds them.
  const at::Tensor rows = at::argsort(perm.source, /*stable=*/true, 0, false).contiguous();
  const at::Tensor first = at::searchsorted(perm.source.index_select(0, rows), at::arange(in.n + 1, at::kLong));
  at::Tensor dx = at::full({in.n, in.h}, std::numeric_limits<float>::quiet_NaN());
  for (int64_t i = 0; i < in.n * in.h; ++i)
    ck::permute_bwd_item(dpermuted.data_ptr<float>(), rows.data_ptr<int64_t>(), first.data_ptr<int64_t>(),
                         dx.data_ptr<float>(), i, in.h);
  expect_close(dx, ref.moe_permute_bwd(dpermuted, perm.source, in.n), "dx");
}

TEST(CudaKernelMath, DsaIndexerScoresEqualTheReference) {
  const ReferenceOps ref;
  const int64_t b = 2, sq = 16, sk = 20, nh = 4, di = 40, topk = 8;  // query 0 sees 5 keys
  const double scale = 1.0 / std::sqrt(static_cast<double>(di));
  const at::Tensor qi = randn({b, sq, nh, di}, 14), ki = randn({b, sk, di}, 15), w = randn({b, sq, nh}, 16);
  auto score = [&](int64_t bi, int64_t s, int64_t t) {
    float acc = 0.0f;
    for (int64_t j = 0; j < nh; ++j) {
      float dot = 0.0f;
      for (int lane = 0; lane < 32; ++lane)
        dot += ck::indexer_dot_partial(qi.data_ptr<float>(), ki.data_ptr<float>(), bi, s, j, t, sq, sk, nh, di, lane, 32);
      acc += ck::indexer_head_term(w.data_ptr<float>(), bi, s, j, sq, nh, dot, static_cast<float>(scale));
    }
    return acc;
  };
  // The dense scores, masked as the kernel masks them, sorted as CudaOps::dsa_indexer_topk sorts.
  at::Tensor dense = at::empty({b, sq, sk});
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t s = 0; s < sq; ++s)
      for (int64_t t = 0; t < sk; ++t)
        dense.data_ptr<float>()[(bi * sq + s) * sk + t] =
            ck::indexer_visible(s, t, sq, sk) ? score(bi, s, t) : -std::numeric_limits<float>::infinity();
  auto [sorted, order] = at::sort(dense, /*stable=*/true, -1, /*descending=*/true);
  const at::Tensor top = order.narrow(-1, 0, topk);
  const at::Tensor mine = at::where(at::isinf(sorted.narrow(-1, 0, topk)), at::full_like(top, -1), top);
  const at::Tensor want = ref.dsa_indexer_topk(qi, ki, w, scale, topk);
  ASSERT_TRUE(mine.equal(want)) << "top-k indices differ from the reference's";
  ASSERT_TRUE(want.lt(0).any().item<bool>()) << "the case must have queries that see fewer than topk keys";

  at::Tensor picked = at::empty({b, sq, topk});
  const int64_t* idx = want.data_ptr<int64_t>();
  for (int64_t item = 0; item < b * sq * topk; ++item) {
    const int64_t t = idx[item], s = (item / topk) % sq, bi = item / (topk * sq);
    picked.data_ptr<float>()[item] = t >= 0 ? score(bi, s, t) : -std::numeric_limits<float>::infinity();
  }
  expect_close(picked, ref.dsa_indexer_scores_fwd(qi, ki, w, want, scale), "selected scores");
}

}  // namespace
}  // namespace lf::testing

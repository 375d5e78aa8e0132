// Pins the CPU reference itself, since every backend is held to it: (1) finite-difference
// gradient checks of every backward in fp64, (2) agreement with independent ATen compositions
// (at::layer_norm, at::rms_norm, at::cross_entropy_loss, at::scaled_dot_product_attention,
// complex-number RoPE) and their autograd gradients, (3) AdamW against a scalar hand-written
// update and against torch::optim::AdamW.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <functional>

#include "loongforge/backend/reference_ops.h"
#include "loongforge/core/error.h"
#include "op_cases.h"

namespace lf::testing {
namespace {

using backend::AttentionMask;
using backend::MaskKind;
using backend::ReferenceOps;

const ReferenceOps kRef;
const auto kF64 = at::TensorOptions().dtype(at::kDouble);

void expect_close(const at::Tensor& a, const at::Tensor& e, double tol, const std::string& what) {
  auto r = compare(a, e, tol, tol);
  EXPECT_TRUE(r.ok) << what << ": " << r.detail;
}

// ---- finite differences ---------------------------------------------------------------------

// f maps the inputs to one output; vjp maps (inputs, cotangent) to the gradients of the inputs
// listed in `wrt`. Checks <cot, f(x + h e_j) - f(x - h e_j)> / 2h against vjp, element by element.
void fd_check(const std::string& name, std::vector<at::Tensor> inputs, std::vector<size_t> wrt,
              const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
              const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&,
                                                          const at::Tensor&)>& vjp) {
  at::manual_seed(99);
  const auto y = f(inputs);
  const auto cot = at::randn(y.sizes(), kF64);
  const auto analytic = vjp(inputs, cot);
  ASSERT_EQ(analytic.size(), wrt.size()) << name;
  const double h = 1e-6;
  for (size_t a = 0; a < wrt.size(); ++a) {
    at::Tensor x = inputs[wrt[a]];
    auto flat = x.view({-1});
    auto numeric = at::zeros_like(flat);
    for (int64_t j = 0; j < flat.numel(); ++j) {
      const double orig = flat[j].item<double>();
      flat[j] = orig + h;
      const double up = (f(inputs) * cot).sum().item<double>();
      flat[j] = orig - h;
      const double down = (f(inputs) * cot).sum().item<double>();
      flat[j] = orig;
      numeric[j] = (up - down) / (2 * h);
    }
    auto r = compare(analytic[a].reshape(x.sizes()), numeric.view(x.sizes()), 1e-6, 1e-5);
    EXPECT_TRUE(r.ok) << name << ": gradient of input " << wrt[a] << ": " << r.detail;
  }
}

TEST(ReferenceFiniteDifference, RmsNorm) {
  at::manual_seed(1);
  fd_check("rms_norm", {at::randn({3, 8}, kF64), at::randn({8}, kF64)}, {0, 1},
           [](auto& in) { return kRef.rms_norm_fwd(in[0], in[1], 1e-6).y; },
           [](auto& in, auto& dy) {
             auto f = kRef.rms_norm_fwd(in[0], in[1], 1e-6);
             auto g = kRef.rms_norm_bwd(dy, in[0], in[1], f.rstd);
             return std::vector<at::Tensor>{g.dx, g.dw};
           });
}

TEST(ReferenceFiniteDifference, LayerNorm) {
  at::manual_seed(2);
  fd_check("layer_norm", {at::randn({3, 8}, kF64), at::randn({8}, kF64), at::randn({8}, kF64)},
           {0, 1, 2}, [](auto& in) { return kRef.layer_norm_fwd(in[0], in[1], in[2], 1e-5).y; },
           [](auto& in, auto& dy) {
             auto f = kRef.layer_norm_fwd(in[0], in[1], in[2], 1e-5);
             auto g = kRef.layer_norm_bwd(dy, in[0], in[1], true, f.mean, f.rstd);
             return std::vector<at::Tensor>{g.dx, g.dw, g.db};
           });
}

TEST(ReferenceFiniteDifference, RopeBothLayoutsWithArbitraryTables) {
  // Random cos/sin (not a real rotation table) so the transpose is checked in general.
  for (bool interleaved : {false, true}) {
    at::manual_seed(3);
    auto cos = at::randn({4, 6}, kF64), sin = at::randn({4, 6}, kF64);
    fd_check(interleaved ? "rope_interleaved" : "rope_halves", {at::randn({4, 2, 1, 8}, kF64)},
             {0}, [&](auto& in) { return kRef.rope_fwd(in[0], cos, sin, interleaved); },
             [&](auto&, auto& dy) {
               return std::vector<at::Tensor>{kRef.rope_bwd(dy, cos, sin, interleaved)};
             });
  }
}

TEST(ReferenceFiniteDifference, Swiglu) {
  at::manual_seed(4);
  fd_check("swiglu", {at::randn({3, 10}, kF64)}, {0},
           [](auto& in) { return kRef.swiglu_fwd(in[0]); },
           [](auto& in, auto& dy) { return std::vector<at::Tensor>{kRef.swiglu_bwd(dy, in[0])}; });
}

TEST(ReferenceFiniteDifference, CrossEntropyWithIgnoredRow) {
  at::manual_seed(5);
  auto target = at::tensor({2, -100, 0, 4}, at::kLong);
  fd_check("cross_entropy", {at::randn({4, 5}, kF64)}, {0},
           [&](auto& in) { return kRef.softmax_cross_entropy_fwd(in[0], target, -100).loss; },
           [&](auto& in, auto& dl) {
             auto f = kRef.softmax_cross_entropy_fwd(in[0], target, -100);
             return std::vector<at::Tensor>{
                 kRef.softmax_cross_entropy_bwd(dl, in[0], target, f.lse, -100)};
           });
}

TEST(ReferenceFiniteDifference, SdpaEveryMaskKindWithGqa) {
  at::manual_seed(6);
  auto bool_mask = at::rand({1, 1, 3, 5}).gt(0.3);
  bool_mask.select(2, 0).fill_(false);  // a query row that sees nothing: zero gradient
  std::vector<AttentionMask> masks{AttentionMask::none(), AttentionMask::causal(),
                                   AttentionMask::boolean(bool_mask),
                                   AttentionMask::additive(at::randn({1, 2, 3, 5}, kF64))};
  for (const auto& mask : masks) {
    // q: [1, 2, 3, 4], k/v: [1, 1, 5, 4|3]: GQA group 2, s != t (bottom-right causal).
    fd_check(std::string("sdpa_") + backend::to_string(mask.kind),
             {at::randn({1, 2, 3, 4}, kF64), at::randn({1, 1, 5, 4}, kF64),
              at::randn({1, 1, 5, 3}, kF64)},
             {0, 1, 2}, [&](auto& in) { return kRef.sdpa_fwd(in[0], in[1], in[2], mask, 0.5).o; },
             [&](auto& in, auto& dout) {
               auto f = kRef.sdpa_fwd(in[0], in[1], in[2], mask, 0.5);
               auto g = kRef.sdpa_bwd(dout, in[0], in[1], in[2], f.o, f.lse, mask, 0.5);
               return std::vector<at::Tensor>{g.dq, g.dk, g.dv};
             });
  }
}

// ---- independent compositions -------------------------------------------------------------

std::vector<at::Tensor> grads(const at::Tensor& y, const at::Tensor& dy,
                              const std::vector<at::Tensor>& wrt) {
  return torch::autograd::grad({y}, wrt, {dy});
}

TEST(ReferenceVsAten, NormsMatchAtenAndItsAutograd) {
  at::manual_seed(7);
  auto x = at::randn({5, 32}).requires_grad_(), w = at::randn({32}).requires_grad_(),
       b = at::randn({32}).requires_grad_(), dy = at::randn({5, 32});
  auto ln = kRef.layer_norm_fwd(x.detach(), w.detach(), b.detach(), 1e-5);
  auto ln_ref = at::layer_norm(x, {32}, w, b, 1e-5);
  expect_close(ln.y, ln_ref.detach(), 1e-5, "layer_norm y");
  auto lg = kRef.layer_norm_bwd(dy, x.detach(), w.detach(), true, ln.mean, ln.rstd);
  auto lg_ref = grads(ln_ref, dy, {x, w, b});
  expect_close(lg.dx, lg_ref[0], 1e-5, "layer_norm dx");
  expect_close(lg.dw, lg_ref[1], 1e-5, "layer_norm dw");
  expect_close(lg.db, lg_ref[2], 1e-5, "layer_norm db");

  auto rn = kRef.rms_norm_fwd(x.detach(), w.detach(), 1e-6);
  auto rn_ref = at::rms_norm(x, {32}, w, 1e-6);
  expect_close(rn.y, rn_ref.detach(), 1e-5, "rms_norm y");
  auto rg = kRef.rms_norm_bwd(dy, x.detach(), w.detach(), rn.rstd);
  auto rg_ref = grads(rn_ref, dy, {x, w});
  expect_close(rg.dx, rg_ref[0], 1e-5, "rms_norm dx");
  expect_close(rg.dw, rg_ref[1], 1e-5, "rms_norm dw");
}

TEST(ReferenceVsAten, CrossEntropyMatchesAtenCrossEntropy) {
  at::manual_seed(8);
  auto logits = (at::randn({9, 30}) * 4).requires_grad_();
  auto target = at::randint(30, {9}, at::kLong);
  target[3] = -100;
  auto dloss = at::randn({9});
  auto f = kRef.softmax_cross_entropy_fwd(logits.detach(), target, -100);
  auto ref = at::cross_entropy_loss(logits, target, {}, at::Reduction::None, -100);
  expect_close(f.loss, ref.detach(), 1e-5, "loss");
  expect_close(f.lse, at::logsumexp(logits.detach(), {1}), 1e-5, "lse");
  EXPECT_EQ(f.loss[3].item<float>(), 0.0f);
  auto d = kRef.softmax_cross_entropy_bwd(dloss, logits.detach(), target, f.lse, -100);
  expect_close(d, grads(ref, dloss, {logits})[0], 1e-5, "dlogits");
}

// The fused output layer + cross entropy against ATen's linear and cross entropy and their
// autograd: the loss, and the gradients of sum(weight * loss) to x and w (padding rows excluded
// from the softmax, ignored tokens without loss or gradient).
TEST(ReferenceVsAten, LinearCrossEntropyMatchesLinearThenCrossEntropy) {
  at::manual_seed(9);
  auto x = at::randn({11, 6}, kF64).requires_grad_();
  auto w = at::randn({20, 6}, kF64).requires_grad_();
  auto target = at::randint(17, {11}, at::kLong);
  target[4] = -100;
  auto weight = at::rand({11});
  backend::VocabShard shard;
  shard.valid = 17;  // rows 17..19: padding
  auto r = kRef.linear_cross_entropy(x.detach(), w.detach(), target, weight, -100, shard, 0);
  auto logits = at::linear(x, w).narrow(1, 0, 17);
  auto ce = at::cross_entropy_loss(logits, target, {}, at::Reduction::None, -100);
  expect_close(r.loss, ce.detach().to(at::kFloat), 1e-6, "loss");
  auto g = grads((ce * weight.to(at::kDouble)).sum(), at::ones({}, kF64), {x, w});
  expect_close(r.dx, g[0], 1e-12, "dx");
  expect_close(r.dw, g[1], 1e-12, "dw");
  EXPECT_EQ(r.dw.narrow(0, 17, 3).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(r.loss[4].item<float>(), 0.0f);
}

TEST(ReferenceVsAten, SdpaMatchesAtenSdpaForEachMaskKind) {
  at::manual_seed(9);
  auto q = at::randn({2, 4, 6, 8}).requires_grad_(), k = at::randn({2, 2, 6, 8}).requires_grad_(),
       v = at::randn({2, 2, 6, 8}).requires_grad_(), dout = at::randn({2, 4, 6, 8});
  auto bool_mask = at::rand({2, 1, 6, 6}).gt(0.4).logical_or(at::eye(6, at::kBool));
  auto add_mask = at::randn({1, 4, 6, 6});
  struct Case { AttentionMask mask; at::Tensor aten_mask; bool causal; };
  for (const auto& c : {Case{AttentionMask::none(), {}, false},
                        Case{AttentionMask::causal(), {}, true},  // s == t: aligned identically
                        Case{AttentionMask::boolean(bool_mask), bool_mask, false},
                        Case{AttentionMask::additive(add_mask), add_mask, false}}) {
    const std::string what = backend::to_string(c.mask.kind);
    auto f = kRef.sdpa_fwd(q.detach(), k.detach(), v.detach(), c.mask, 0.3);
    auto aten_mask = c.aten_mask.defined() ? std::optional<at::Tensor>(c.aten_mask) : std::nullopt;
    auto ref = at::scaled_dot_product_attention(q, k, v, aten_mask, 0.0, c.causal, 0.3,
                                                /*enable_gqa=*/true);
    expect_close(f.o, ref.detach(), 1e-5, what + " o");
    auto g = kRef.sdpa_bwd(dout, q.detach(), k.detach(), v.detach(), f.o, f.lse, c.mask, 0.3);
    auto gr = grads(ref, dout, {q, k, v});
    expect_close(g.dq, gr[0], 1e-5, what + " dq");
    expect_close(g.dk, gr[1], 1e-5, what + " dk");
    expect_close(g.dv, gr[2], 1e-5, what + " dv");
  }
}

TEST(ReferenceVsAten, CausalIsBottomRightAlignedForKvCache) {
  // s = 2 new queries after 3 cached keys (t = 5): query i sees keys 0 .. 3 + i.
  at::manual_seed(10);
  auto q = at::randn({1, 1, 2, 4}), k = at::randn({1, 1, 5, 4}), v = at::randn({1, 1, 5, 4});
  auto keep = at::tensor({1, 1, 1, 1, 0, 1, 1, 1, 1, 1}, at::kLong).ne(0).view({1, 1, 2, 5});
  auto causal = kRef.sdpa_fwd(q, k, v, AttentionMask::causal(), 0.5);
  auto explicit_ = kRef.sdpa_fwd(q, k, v, AttentionMask::boolean(keep), 0.5);
  expect_close(causal.o, explicit_.o, 0, "causal == explicit bottom-right mask");
}

TEST(ReferenceVsAten, FullyMaskedRowGivesZeroOutputAndMinusInfLse) {
  auto q = at::randn({1, 1, 2, 4}), k = at::randn({1, 1, 3, 4}), v = at::randn({1, 1, 3, 4});
  auto keep = at::ones({1, 1, 2, 3}, at::kBool);
  keep[0][0][1].fill_(false);
  auto f = kRef.sdpa_fwd(q, k, v, AttentionMask::boolean(keep), 1.0);
  EXPECT_TRUE(f.o[0][0][1].eq(0).all().item<bool>());
  EXPECT_TRUE(std::isinf(f.lse[0][0][1].item<float>()));
  EXPECT_FALSE(f.o.isnan().any().item<bool>());
}

TEST(ReferenceVsAten, RopeMatchesComplexRotation) {
  // Rotating the pair (a, b) by theta is multiplying a + ib by e^{i theta}.
  at::manual_seed(11);
  const int64_t s = 5, r = 8;
  auto x = at::randn({s, 2, 3, 12}, kF64);
  auto theta = at::randn({s, r / 2}, kF64);
  for (bool interleaved : {false, true}) {
    auto emb = interleaved ? theta.repeat_interleave(2, 1) : at::cat({theta, theta}, 1);
    auto y = kRef.rope_fwd(x, emb.cos(), emb.sin(), interleaved);
    auto xr = x.narrow(-1, 0, r);
    at::Tensor pairs = interleaved ? xr.unflatten(-1, {r / 2, 2})
                                   : at::stack({xr.narrow(-1, 0, r / 2), xr.narrow(-1, r / 2, r / 2)}, -1);
    auto rot = at::view_as_real(at::view_as_complex(pairs.contiguous()) *
                                at::polar(at::ones_like(theta), theta).view({s, 1, 1, r / 2}));
    auto expect = interleaved ? rot.flatten(-2)
                              : at::cat({rot.select(-1, 0), rot.select(-1, 1)}, -1);
    expect_close(y.narrow(-1, 0, r), expect, 1e-12, interleaved ? "interleaved" : "halves");
    expect_close(y.narrow(-1, r, 4), x.narrow(-1, r, 4), 0, "pass-through dims");
  }
}

TEST(ReferenceFiniteDifference, Gelu) {
  fd_check("gelu", {at::randn({3, 10}, kF64) * 2}, {0},
           [](auto& in) { return kRef.gelu_fwd(in[0]); },
           [](auto& in, auto& dy) { return std::vector<at::Tensor>{kRef.gelu_bwd(dy, in[0])}; });
}

TEST(ReferenceVsAten, GeluMatchesAtenErfGelu) {
  auto x = at::randn({4, 33}) * 3;
  expect_close(kRef.gelu_fwd(x), at::gelu(x), 1e-6, "gelu");
}

TEST(ReferenceFiniteDifference, GeluTanh) {
  fd_check("gelu_tanh", {at::randn({3, 10}, kF64) * 2}, {0},
           [](auto& in) { return kRef.gelu_tanh_fwd(in[0]); },
           [](auto& in, auto& dy) { return std::vector<at::Tensor>{kRef.gelu_tanh_bwd(dy, in[0])}; });
}

// The reference is ATen's kernel; the formula x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in
// fp64 holds it (and so the CPU backend's kernel, which the op harness compares with it).
TEST(ReferenceVsFormula, GeluTanhIsTheTanhForm) {
  auto x = at::randn({4, 33}, kF64) * 3;
  auto want = 0.5 * x * (1 + at::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
  expect_close(kRef.gelu_tanh_fwd(x), want, 1e-12, "gelu_tanh");
}

TEST(ReferenceFiniteDifference, GegluTanh) {
  fd_check("geglu_tanh", {at::randn({3, 10}, kF64) * 2, at::randn({3, 10}, kF64)}, {0, 1},
           [](auto& in) { return kRef.geglu_tanh_fwd(in[0], in[1]); },
           [](auto& in, auto& dy) {
             auto g = kRef.geglu_tanh_bwd(dy, in[0], in[1]);
             return std::vector<at::Tensor>{g.dgate, g.dup};
           });
}

TEST(ReferenceVsFormula, GegluTanhIsGeluTanhTimesUp) {
  auto g = at::randn({4, 33}, kF64) * 3, u = at::randn({4, 33}, kF64);
  auto want = 0.5 * g * (1 + at::tanh(0.79788456080286535588 * (g + 0.044715 * g * g * g))) * u;
  expect_close(kRef.geglu_tanh_fwd(g, u), want, 1e-12, "geglu_tanh");
  EXPECT_THROW(kRef.geglu_tanh_fwd(g, u.narrow(1, 0, 32)), lf::Error);
}

TEST(ReferenceVsAten, SwigluMatchesSiluTimesUp) {
  auto gu = at::randn({4, 2, 20});
  expect_close(kRef.swiglu_fwd(gu), at::silu(gu.narrow(-1, 0, 10)) * gu.narrow(-1, 10, 10), 1e-6,
               "swiglu");
}

// ---- AdamW ----------------------------------------------------------------------------------

TEST(ReferenceAdamW, MatchesScalarHandWrittenUpdate) {
  const backend::AdamWHyper h{0.1, 0.9, 0.99, 1e-8, 0.5, 2};
  auto p = at::tensor({1.0, -2.0, 0.5}, kF64), g = at::tensor({0.3, -0.1, 0.0}, kF64);
  auto m = at::tensor({0.1, 0.2, -0.3}, kF64), v = at::tensor({0.01, 0.04, 0.09}, kF64);
  std::vector<double> pe(3), me(3), ve(3);
  for (int i = 0; i < 3; ++i) {
    double pi = p[i].item<double>(), gi = g[i].item<double>(), mi = m[i].item<double>(),
           vi = v[i].item<double>();
    pi *= 1 - 0.1 * 0.5;  // decoupled: decay the weight, not the gradient
    mi = 0.9 * mi + 0.1 * gi;
    vi = 0.99 * vi + 0.01 * gi * gi;
    const double mhat = mi / (1 - 0.9 * 0.9), vhat = vi / (1 - 0.99 * 0.99);
    pe[i] = pi - 0.1 * mhat / (std::sqrt(vhat) + 1e-8);
    me[i] = mi;
    ve[i] = vi;
  }
  std::vector<at::Tensor> ps{p}, gs{g}, ms{m}, vs{v};
  kRef.adamw_step(ps, gs, ms, vs, h);
  expect_close(p, at::tensor(pe, kF64), 1e-12, "param");
  expect_close(m, at::tensor(me, kF64), 1e-15, "exp_avg");
  expect_close(v, at::tensor(ve, kF64), 1e-15, "exp_avg_sq");
}

TEST(ReferenceAdamW, MatchesTorchOptimAdamWOverSteps) {
  at::manual_seed(12);
  auto w = at::randn({6, 4});
  auto ours = w.clone(), theirs = w.clone().requires_grad_();
  auto m = at::zeros_like(w), v = at::zeros_like(w);
  torch::optim::AdamW opt({theirs}, torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95})
                                        .eps(1e-8).weight_decay(0.1));
  for (int64_t step = 1; step <= 4; ++step) {
    auto grad = at::randn({6, 4});
    theirs.mutable_grad() = grad.clone();
    opt.step();
    std::vector<at::Tensor> ps{ours}, gs{grad}, ms{m}, vs{v};
    kRef.adamw_step(ps, gs, ms, vs, {3e-3, 0.9, 0.95, 1e-8, 0.1, step});
  }
  expect_close(ours, theirs.detach(), 1e-6, "params after 4 steps");
}

TEST(ReferenceAdamW, GradScaleEqualsScaledGradients) {
  at::manual_seed(13);
  auto p = at::randn({5, 3}), g = at::randn({5, 3}), m = at::randn({5, 3}) * 0.1, v = at::rand({5, 3});
  auto p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
  backend::AdamWHyper h{1e-2, 0.9, 0.95, 1e-8, 0.1, 3};
  std::vector<at::Tensor> a{p}, ga{g * 0.25}, ma{m}, va{v};
  kRef.adamw_step(a, ga, ma, va, h);
  h.grad_scale = 0.25;
  std::vector<at::Tensor> b{p2}, gb{g}, mb{m2}, vb{v2};
  kRef.adamw_step(b, gb, mb, vb, h);
  expect_close(p2, p, 0, "params");
  expect_close(v2, v, 0, "exp_avg_sq");
}

// The MoE ops against a per-token loop written from their definitions (HF transformers' expert
// loop), and their backward against finite differences in fp64.
TEST(ReferenceMoe, PermuteGemmUnpermuteMatchPerTokenLoop) {
  at::manual_seed(5);
  const int64_t n = 9, k = 2, e = 4, h = 6, f = 5;
  auto x = at::randn({n, h}, kF64);
  auto idx = at::randint(e, {n, k}, at::kLong);
  idx[3][1] = -1;
  auto w1 = at::randn({e, f, h}, kF64), w2 = at::randn({e, h, f}, kF64);
  auto probs = at::rand({n, k}, kF64);
  auto p = kRef.moe_permute_fwd(x, idx, e);
  auto mid = kRef.grouped_gemm_fwd(p.permuted, w1, p.tokens_per_expert);
  auto y = kRef.grouped_gemm_fwd(mid, w2, p.tokens_per_expert);
  auto out = kRef.moe_unpermute_fwd(y, p.position, probs);
  auto want = at::zeros({n, h}, kF64);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t ex = idx[t][j].item<int64_t>();
      if (ex < 0) continue;
      want[t] += probs[t][j] * at::mv(w2[ex], at::mv(w1[ex], x[t]));
    }
  expect_close(out, want, 1e-12, "moe output");
  // Grouping: rows sorted by expert, then (token, slot) within an expert.
  EXPECT_EQ(p.tokens_per_expert.sum().item<int64_t>(), n * k - 1);
  for (int64_t r = 0; r + 1 < p.source.size(0); ++r) {
    const int64_t t0 = p.source[r].item<int64_t>(), t1 = p.source[r + 1].item<int64_t>();
    const int64_t s0 = p.position[t0].eq(r).nonzero().item<int64_t>(), s1 = p.position[t1].eq(r + 1).nonzero().item<int64_t>();
    const int64_t e0 = idx[t0][s0].item<int64_t>(), e1 = idx[t1][s1].item<int64_t>();
    EXPECT_TRUE(e0 < e1 || (e0 == e1 && (t0 < t1 || (t0 == t1 && s0 < s1)))) << "row " << r;
  }
}

// Every slot dropped (an expert-parallel rank that no token reached): no rows, a zero output, zero
// gradients to the routing weights and an empty gradient to the rows.
TEST(ReferenceMoe, EverySlotDroppedGivesZeros) {
  const int64_t n = 5, k = 2, h = 3;
  auto x = at::randn({n, h}, kF64);
  auto idx = at::full({n, k}, -1, at::kLong);
  auto probs = at::rand({n, k}, kF64);
  auto p = kRef.moe_permute_fwd(x, idx, 4);
  EXPECT_EQ(p.permuted.size(0), 0);
  EXPECT_EQ(p.tokens_per_expert.sum().item<int64_t>(), 0);
  auto w = at::randn({4, h, h}, kF64);
  auto y = kRef.grouped_gemm_fwd(p.permuted, w, p.tokens_per_expert);
  EXPECT_EQ(y.size(0), 0);
  expect_close(kRef.moe_unpermute_fwd(y, p.position, probs), at::zeros({n, h}, kF64), 0, "output");
  auto b = kRef.moe_unpermute_bwd(at::randn({n, h}, kF64), y, p.position, probs);
  expect_close(b.dprobs, at::zeros({n, k}, kF64), 0, "routing weights' gradient");
  EXPECT_EQ(b.dy.size(0), 0);
}

TEST(ReferenceFiniteDifference, MoePermuteUnpermuteGroupedGemm) {
  at::manual_seed(6);
  const int64_t n = 5, k = 2, e = 3, h = 4, f = 3;
  auto idx = at::tensor({0, 2, 2, 0, 1, -1, 0, 1, 2, 1}, at::kLong).view({n, k});
  // x -> permute -> grouped GEMM (w [e, f, h]) -> pad to h -> unpermute with probs.
  auto fwd = [&](const std::vector<at::Tensor>& in) {
    auto p = kRef.moe_permute_fwd(in[0], idx, e);
    auto y = kRef.grouped_gemm_fwd(p.permuted, in[1], p.tokens_per_expert);
    return kRef.moe_unpermute_fwd(at::pad(y, {0, h - f}), p.position, in[2]);
  };
  fd_check("moe", {at::randn({n, h}, kF64), at::randn({e, f, h}, kF64), at::rand({n, k}, kF64)}, {0, 1, 2}, fwd,
           [&](auto& in, auto& dout) {
             auto p = kRef.moe_permute_fwd(in[0], idx, e);
             auto y = kRef.grouped_gemm_fwd(p.permuted, in[1], p.tokens_per_expert);
             auto u = kRef.moe_unpermute_bwd(dout, at::pad(y, {0, h - f}), p.position, in[2]);
             auto g = kRef.grouped_gemm_bwd(u.dy.narrow(1, 0, f), p.permuted, in[1], p.tokens_per_expert, {});
             return std::vector<at::Tensor>{kRef.moe_permute_bwd(g.dx, p.source, n), g.dw, u.dprobs};
           });
}

// The backward's gradients one at a time (--delay-wgrad-compute computes the input's first and
// the weights' later; a frozen weight gets none): each equals the joint call's bit for bit, and
// the one not asked for is not computed.
TEST(ReferenceOps, GroupedGemmBackwardComputesOnlyTheWantedGradients) {
  at::manual_seed(7);
  const auto counts = at::tensor({3, 0, 4}, at::kLong);
  auto x = at::randn({7, 5}), w = at::randn({3, 6, 5}), dy = at::randn({7, 6});
  auto both = kRef.grouped_gemm_bwd(dy, x, w, counts, {});
  auto dx = kRef.grouped_gemm_bwd(dy, x, w, counts, {true, false});
  auto dw = kRef.grouped_gemm_bwd(dy, x, w, counts, {false, true});
  ASSERT_TRUE(both.dx.defined() && both.dw.defined());
  EXPECT_FALSE(dx.dw.defined());
  EXPECT_FALSE(dw.dx.defined());
  EXPECT_TRUE(at::equal(dx.dx, both.dx));
  EXPECT_TRUE(at::equal(dw.dw, both.dw));
}

TEST(ReferenceChecks, MoeArgumentsAreClearErrors) {
  try {
    kRef.moe_permute_fwd(at::randn({2, 4}), at::tensor({0, 5}, at::kLong).view({2, 1}), 4);
    FAIL() << "expected lf::Error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[0, 4)"), std::string::npos) << e.what();
  }
  try {
    kRef.grouped_gemm_fwd(at::randn({5, 4}), at::randn({2, 3, 4}), at::tensor({2, 2}, at::kLong));
    FAIL() << "expected lf::Error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum to 4 but x has 5 rows"), std::string::npos) << e.what();
  }
}

TEST(ReferenceChecks, BadShapesAreClearErrors) {
  try {
    kRef.sdpa_fwd(at::randn({1, 3, 4, 8}), at::randn({1, 2, 4, 8}), at::randn({1, 2, 4, 8}),
                  AttentionMask::none(), 1.0);
    FAIL() << "expected lf::Error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nq = 3, nkv = 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kRef.rms_norm_fwd(at::randn({2, 8}), at::randn({7}), 1e-6), lf::Error);
  EXPECT_THROW(kRef.softmax_cross_entropy_fwd(at::randn({2, 5}), at::tensor({1, 5}, at::kLong), -100),
               lf::Error);
}

}  // namespace
}  // namespace lf::testing

// The op harness: every case of op_cases.cpp on every backend (cpu; xpu through the reference
// plugin built in this tree, or the plugin tools/xpu-compat names; cuda when a GPU is visible),
// forward and backward, against the CPU
// reference. A backend that is not present skips with the reason. Also checks the autograd
// wrappers (backend/functional.h) route gradients to the right inputs on each backend.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "loongforge/backend/functional.h"
#include "loongforge/backend/reference_ops.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "multiprocess.h"
#include "op_cases.h"
#include "plugin_under_test.h"

namespace lf::testing {
namespace {

using backend::DeviceBackend;

// The backend under test, or nullptr with the reason it is absent.
const DeviceBackend* backend_for(const std::string& name, std::string* why) {
  if (name == "cpu") return &backend::cpu_backend();
  if (name == "xpu") {
    static std::unique_ptr<DeviceBackend> xpu = backend::load_xpu_plugin(xpu_plugin_under_test());
    return xpu.get();
  }
  if (!backend::cuda_device_visible()) {
    const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
    *why = std::string("no CUDA device visible (CUDA_VISIBLE_DEVICES=") + (vis ? vis : "unset") +
           "); the cuda backend's ops are compared with the reference only on a GPU machine";
    return nullptr;
  }
  // Reference matmuls are full fp32; keep cuBLAS from using TF32 so the tolerances hold.
  at::globalContext().setAllowTF32CuBLAS(false);
  return &backend::backend_by_name("cuda");
}

struct HarnessParam {
  std::string backend;
  size_t case_index;
};

// Names the parameter in test listings (ctest shows it) instead of dumping its bytes.
void PrintTo(const HarnessParam& p, std::ostream* os) {
  *os << p.backend << "/" << op_cases()[p.case_index].name;
}

class OpHarness : public ::testing::TestWithParam<HarnessParam> {};

TEST_P(OpHarness, MatchesCpuReference) {
  const auto& param = GetParam();
  const OpCase& c = op_cases()[param.case_index];
  std::string why;
  const DeviceBackend* be = backend_for(param.backend, &why);
  if (be == nullptr) GTEST_SKIP() << why;

  const auto inputs = c.make_inputs();
  const backend::ReferenceOps reference;
  const NamedTensors expected = c.run(reference, inputs);

  std::vector<at::Tensor> device_inputs;
  for (const auto& t : inputs)
    device_inputs.push_back(t.defined() ? t.to(be->device()) : t);
  const NamedTensors actual = c.run(be->ops(), device_inputs);

  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(actual[i].first, expected[i].first);
    ASSERT_EQ(actual[i].second.device(), be->device()) << actual[i].first;
    auto r = compare(actual[i].second, expected[i].second, c.atol, c.rtol);
    EXPECT_TRUE(r.ok) << c.name << " on " << param.backend << ": output " << expected[i].first
                      << ": " << r.detail;
  }
}

std::vector<HarnessParam> all_params() {
  std::vector<HarnessParam> p;
  for (const char* b : {"cpu", "xpu", "cuda"})
    for (size_t i = 0; i < op_cases().size(); ++i) p.push_back({b, i});
  return p;
}

INSTANTIATE_TEST_SUITE_P(Backends, OpHarness, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<HarnessParam>& info) {
                           return info.param.backend + "_" +
                                  op_cases()[info.param.case_index].name;
                         });

// The plugin under test loads through the loader training uses (LOONGFORGE_DEVICE=xpu): the ABI
// handshake (version and table size) passes and it is an xpu backend. tools/xpu-compat runs this
// first, so a plugin the loader rejects gets the loader's message once.
TEST(XpuPlugin, LoadsThroughTheTrainingLoader) {
  std::unique_ptr<DeviceBackend> xpu;
  try {
    xpu = backend::load_xpu_plugin(xpu_plugin_under_test());
  } catch (const lf::Error& e) {
    FAIL() << e.what();
  }
  ASSERT_NE(xpu, nullptr);
  EXPECT_EQ(xpu->name(), "xpu");
  std::printf("[xpu plugin] %s loads: backend %s on %s\n", xpu_plugin_under_test().c_str(), xpu->name().c_str(),
              xpu->device().str().c_str());
}

// The harness must be able to fail: a wrong result is caught with the element that differs.
TEST(OpHarnessSelfTest, CompareCatchesOneWrongElement) {
  auto e = at::arange(10, at::kFloat);
  auto a = e.clone();
  a[7] = 7.01f;
  auto r = compare(a, e, 1e-5, 1e-4);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.detail.find("flat index 7"), std::string::npos) << r.detail;
  EXPECT_TRUE(compare(e, e.clone(), 0, 0).ok);
  auto inf = at::full({2}, -INFINITY);
  EXPECT_TRUE(compare(inf, inf.clone(), 0, 0).ok);  // fully masked rows: lse = -inf both sides
}

// ---- autograd wrappers --------------------------------------------------------------------

class FunctionalOnBackend : public ::testing::TestWithParam<std::string> {};

// Gradients through lf::ops on a backend equal the gradients autograd computes through an
// independent ATen composition on the CPU.
TEST_P(FunctionalOnBackend, GradientsReachTheRightInputs) {
  std::string why;
  const DeviceBackend* be = backend_for(GetParam(), &why);
  if (be == nullptr) GTEST_SKIP() << why;
  const auto dev = be->device();
  at::manual_seed(11);
  auto leaf = [&](at::Tensor t) { return t.to(dev).detach().requires_grad_(true); };
  auto grad_of = [](const at::Tensor& out, const std::vector<at::Tensor>& wrt) {
    return torch::autograd::grad({out}, wrt, {at::ones_like(out)}, /*retain=*/false);
  };
  auto expect_close = [](const at::Tensor& a, const at::Tensor& e, const char* what) {
    auto r = compare(a, e, 1e-5, 1e-4);
    EXPECT_TRUE(r.ok) << what << ": " << r.detail;
  };

  {  // layer_norm: dx, dw, db land on x, w, b
    auto x0 = at::randn({3, 16}), w0 = at::randn({16}), b0 = at::randn({16});
    auto x = leaf(x0), w = leaf(w0), b = leaf(b0);
    auto y = lf::ops::layer_norm(*be, x, w, b, 1e-5);
    auto g = grad_of((y * y.detach().cos()).sum(), {x, w, b});
    auto xr = x0.requires_grad_(), wr = w0.requires_grad_(), br = b0.requires_grad_();
    auto yr = at::layer_norm(xr, {16}, wr, br, 1e-5);
    auto gr = grad_of((yr * yr.detach().cos()).sum(), {xr, wr, br});
    expect_close(g[0], gr[0], "layer_norm dx");
    expect_close(g[1], gr[1], "layer_norm dw");
    expect_close(g[2], gr[2], "layer_norm db");
  }
  {  // sdpa with GQA: dq, dk, dv land on q, k, v
    auto q0 = at::randn({1, 4, 5, 8}), k0 = at::randn({1, 2, 5, 8}), v0 = at::randn({1, 2, 5, 8});
    auto q = leaf(q0), k = leaf(k0), v = leaf(v0);
    auto o = lf::ops::sdpa(*be, q, k, v, backend::AttentionMask::causal());
    auto g = grad_of((o * o.detach()).sum(), {q, k, v});
    auto qr = q0.requires_grad_(), kr = k0.requires_grad_(), vr = v0.requires_grad_();
    auto orf = at::scaled_dot_product_attention(qr, kr, vr, {}, 0.0, /*is_causal=*/true,
                                                std::nullopt, /*enable_gqa=*/true);
    auto gr = grad_of((orf * orf.detach()).sum(), {qr, kr, vr});
    expect_close(g[0], gr[0], "sdpa dq");
    expect_close(g[1], gr[1], "sdpa dk");
    expect_close(g[2], gr[2], "sdpa dv");
  }
  {  // sdpa_after_prefix (ChunkPipe): a chunk of 5 queries over 7 earlier keys and its own 5 equals
     // causal attention over the concatenated 12 keys, gradients included (each part's backward
     // from the merged output and lse).
    auto q0 = at::randn({2, 4, 5, 8}), kp0 = at::randn({2, 2, 7, 8}), vp0 = at::randn({2, 2, 7, 8}),
         k0 = at::randn({2, 2, 5, 8}), v0 = at::randn({2, 2, 5, 8});
    auto q = leaf(q0), kp = leaf(kp0), vp = leaf(vp0), k = leaf(k0), v = leaf(v0);
    auto o = lf::ops::sdpa_after_prefix(*be, q, kp, vp, k, v);
    auto g = grad_of((o * o.detach().sin()).sum(), {q, kp, vp, k, v});
    auto qr = q0.requires_grad_(), kpr = kp0.requires_grad_(), vpr = vp0.requires_grad_(),
         kr = k0.requires_grad_(), vr = v0.requires_grad_();
    // Bottom-right causal over [prefix | own]: query i sees keys 0 .. 7 + i.
    auto keep = at::ones({5, 12}, at::kBool).tril(7);
    auto orf = at::scaled_dot_product_attention(qr, at::cat({kpr, kr}, 2), at::cat({vpr, vr}, 2), keep,
                                                0.0, false, std::nullopt, /*enable_gqa=*/true);
    auto gr = grad_of((orf * orf.detach().sin()).sum(), {qr, kpr, vpr, kr, vr});
    expect_close(o.cpu(), orf, "sdpa_after_prefix o");
    const char* names[] = {"dq", "dk_prefix", "dv_prefix", "dk", "dv"};
    for (int i = 0; i < 5; ++i) expect_close(g[i], gr[i], names[i]);
  }
  {  // MoE: permute -> grouped GEMM -> unpermute; dx, dw, dprobs against a dense per-expert
     // composition (every token through every expert, masked by its routing weight)
    const int64_t n = 7, e = 3, h = 8, f = 6;
    auto x0 = at::randn({n, h}), w0 = at::randn({e, f, h}), p0 = at::rand({n, 2});
    auto idx = at::tensor({0, 2, 1, 0, 2, 1, 0, 1, 1, 2, 2, 0, 0, -1}, at::kLong).view({n, 2});
    auto x = leaf(x0), w = leaf(w0), p = leaf(p0);
    auto perm = lf::ops::moe_permute(*be, x, idx.to(dev), e);
    auto y = lf::ops::grouped_gemm(*be, perm.rows, w, perm.tokens_per_expert);
    auto out = lf::ops::moe_unpermute(*be, at::pad(y, {0, h - f}), perm.position, p);
    auto g = grad_of((out * out.detach().cos()).sum(), {x, w, p});
    auto xr = x0.requires_grad_(), wr = w0.requires_grad_(), pr = p0.requires_grad_();
    auto dense = at::einsum("nh,efh->nef", {xr, wr});  // [n, e, f]
    std::vector<at::Tensor> rows;
    for (int64_t t = 0; t < n; ++t) {
      at::Tensor acc = at::zeros({f});
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t ex = idx[t][j].item<int64_t>();
        if (ex >= 0) acc = acc + pr[t][j] * dense[t][ex];
      }
      rows.push_back(at::pad(acc, {0, h - f}));
    }
    auto outr = at::stack(rows);
    auto gr = grad_of((outr * outr.detach().cos()).sum(), {xr, wr, pr});
    expect_close(out.cpu(), outr, "moe out");
    expect_close(g[0], gr[0], "moe dx");
    expect_close(g[1], gr[1], "moe dw");
    expect_close(g[2], gr[2], "moe dprobs");
  }
  {  // rms_norm -> swiglu -> rope -> cross-entropy chained: the graph composes
    auto x0 = at::randn({4, 1, 1, 16}), w0 = at::randn({16});
    auto x = leaf(x0), w = leaf(w0);
    auto h = lf::ops::rms_norm(*be, x, w, 1e-6);                  // [4, 1, 1, 16]
    auto a = lf::ops::swiglu(*be, h);                             // [4, 1, 1, 8]
    auto pos = at::arange(4, at::kFloat).unsqueeze(1) * at::ones({1, 8});
    auto r = lf::ops::rope(*be, a, pos.cos().to(dev), pos.sin().to(dev));
    auto target = at::tensor({1, 7, -100, 3}, at::kLong).to(dev);
    auto loss = lf::ops::softmax_cross_entropy(*be, r.reshape({4, 8}), target).sum();
    auto g = grad_of(loss, {x, w});

    auto xr = x0.requires_grad_(), wr = w0.requires_grad_();
    auto hr = at::rms_norm(xr, {16}, wr, 1e-6);
    auto ar = at::silu(hr.narrow(-1, 0, 8)) * hr.narrow(-1, 8, 8);
    auto rot = at::cat({-ar.narrow(-1, 4, 4), ar.narrow(-1, 0, 4)}, -1);
    auto c = pos.cos().view({4, 1, 1, 8}), s = pos.sin().view({4, 1, 1, 8});
    auto rr = ar * c + rot * s;
    auto lr = at::cross_entropy_loss(rr.reshape({4, 8}), target.cpu(), {}, at::Reduction::Sum,
                                     -100);
    auto gr = grad_of(lr, {xr, wr});
    EXPECT_NEAR(loss.item<double>(), lr.item<double>(), 1e-5);
    expect_close(g[0], gr[0], "chain dx");
    expect_close(g[1], gr[1], "chain dw");
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, FunctionalOnBackend, ::testing::Values("cpu", "xpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// lf::ops::linear's gradient-accumulation fusion: the backward's GEMM writes (or adds) w's gradient
// into the slot the sink names, autograd gets none for w; x's and b's gradients are autograd's.
// Without a slot, in bf16, or with no sink, w's gradient is returned as usual.
struct FakeSlots final : lf::ops::WeightGradSlots {
  mutable std::optional<backend::GradInto> slot;
  mutable int asked = 0;
  std::optional<backend::GradInto> weight_grad_slot(const at::Tensor&) const override {
    ++asked;
    return slot;
  }
};

TEST(LinearGradientFusion, TheBackwardWritesOrAddsIntoTheSlot) {
  auto x0 = at::randn({3, 5, 7}), w0 = at::randn({4, 7}), b0 = at::randn({4}), dy = at::randn({3, 5, 4});
  // The reference: at::linear's gradients.
  auto x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
  at::linear(x, w, b).backward(dy);
  const auto dx_ref = x.grad(), dw_ref = w.grad(), db_ref = b.grad();
  for (const bool accumulate : {false, true}) {
    FakeSlots slots;
    const auto start = at::randn({4, 7});
    slots.slot = backend::GradInto{start.clone(), 1.0, accumulate};
    auto xf = x0.clone().requires_grad_(), wf = w0.clone().requires_grad_(), bf = b0.clone().requires_grad_();
    auto y = lf::ops::linear(xf, wf, bf, &slots);
    EXPECT_TRUE(at::allclose(y, at::linear(x0, w0, b0), 1e-6, 1e-6));
    y.backward(dy);
    EXPECT_EQ(slots.asked, 1);
    EXPECT_FALSE(wf.grad().defined()) << "the gradient went to the slot, not to autograd";
    const auto want = accumulate ? start + dw_ref : dw_ref;
    EXPECT_TRUE(at::allclose(slots.slot->dw, want, 1e-5, 1e-5)) << "accumulate " << accumulate;
    EXPECT_TRUE(at::allclose(xf.grad(), dx_ref, 1e-6, 1e-6));
    EXPECT_TRUE(at::allclose(bf.grad(), db_ref, 1e-6, 1e-6));
  }
  // No slot: autograd's gradient. bf16: the sink is not asked (the slot is fp32). No bias, and
  // an input without a gradient.
  FakeSlots none;
  auto wn = w0.clone().requires_grad_();
  lf::ops::linear(x0, wn, {}, &none).backward(dy);
  EXPECT_EQ(none.asked, 1);
  EXPECT_TRUE(at::allclose(wn.grad(), dw_ref, 1e-5, 1e-5));
  FakeSlots bf16;
  bf16.slot = backend::GradInto{at::zeros({4, 7}), 1.0, false};
  auto wb = w0.to(at::kBFloat16).requires_grad_();
  lf::ops::linear(x0.to(at::kBFloat16), wb, {}, &bf16).backward(dy.to(at::kBFloat16));
  EXPECT_EQ(bf16.asked, 0);
  EXPECT_TRUE(wb.grad().defined());
  EXPECT_EQ(bf16.slot->dw.abs().sum().item<double>(), 0.0);
}

// lf::ops::activated_linear: the activation then linear with a sink (the same GEMMs), for each
// activation, with and without a slot, with and without bias; and the activation's output is not
// held between forward and backward (the graph keeps pre, not act(pre)).
TEST(ActivatedLinear, EqualsTheActivationThenTheLinearAndHoldsOnlyItsInput) {
  const auto& be = backend::cpu_backend();
  using lf::ops::Activation;
  for (const auto act : {Activation::swiglu, Activation::gelu, Activation::gelu_tanh}) {
    const int64_t in = 64, out = 48, pre_width = act == Activation::swiglu ? 2 * in : in;
    const auto pre0 = at::randn({5, 3, pre_width}), w0 = at::randn({out, in}), b0 = at::randn({out});
    const auto dy = at::randn({5, 3, out});
    for (const bool bias : {true, false}) {
      for (const bool slot : {false, true}) {
        // The reference: the activation, then linear with a sink that has no slot (lf::ops::gemm's GEMMs).
        FakeSlots none;
        auto pr = pre0.clone().requires_grad_(), wr = w0.clone().requires_grad_(), br = b0.clone().requires_grad_();
        auto yr = lf::ops::linear(lf::ops::activation(be, act, pr), wr, bias ? br : at::Tensor(), &none);
        yr.backward(dy);
        FakeSlots slots;
        if (slot) slots.slot = backend::GradInto{at::zeros({out, in}), 1.0, false};
        auto pf = pre0.clone().requires_grad_(), wf = w0.clone().requires_grad_(), bf = b0.clone().requires_grad_();
        const int64_t live = be.memory_stats().allocated_bytes;
        auto yf = lf::ops::activated_linear(be, act, pf, wf, bias ? bf : at::Tensor(), &slots);
        // Held after forward: y only (pre and w are the caller's); act(pre) is [5, 3, 64] fp32.
        EXPECT_EQ(be.memory_stats().allocated_bytes - live, yf.nbytes()) << "act(pre) is not kept";
        EXPECT_TRUE(at::equal(yf, yr));
        yf.backward(dy);
        const auto dw = slot ? slots.slot->dw : wf.grad();
        EXPECT_EQ(wf.grad().defined(), !slot);
        EXPECT_TRUE(at::equal(dw, wr.grad())) << static_cast<int>(act) << " slot " << slot;
        EXPECT_TRUE(at::equal(pf.grad(), pr.grad())) << static_cast<int>(act);
        if (bias) {
          EXPECT_TRUE(at::equal(bf.grad(), br.grad()));
        } else {
          EXPECT_FALSE(bf.grad().defined());
        }
      }
    }
    // No sink at all (slots null): w's gradient is returned.
    auto wn = w0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
    lf::ops::activated_linear(be, act, pre0, wn, {}, nullptr).backward(dy);
    at::linear(lf::ops::activation(be, act, pre0), wr).backward(dy);
    EXPECT_TRUE(at::allclose(wn.grad(), wr.grad(), 1e-5, 1e-5));
    // No gradient needed: activation() then linear(), no graph.
    at::NoGradGuard no_grad;
    FakeSlots eval;
    EXPECT_TRUE(at::equal(lf::ops::activated_linear(be, act, pre0, w0, b0, &eval),
                          at::linear(lf::ops::activation(be, act, pre0), w0, b0)));
    EXPECT_EQ(eval.asked, 0);
  }
}

// lf::ops::rms_norm_linear: rms_norm then linear with a sink (the same kernels), with and without a
// slot and bias; the graph keeps x, g and the per-row rstd, not the normed input.
TEST(RmsNormLinear, EqualsTheNormThenTheLinearAndHoldsOnlyItsInput) {
  const auto& be = backend::cpu_backend();
  const int64_t h = 64, out = 40;
  const auto x0 = at::randn({5, 3, h}), g0 = at::randn({h}), w0 = at::randn({out, h}), b0 = at::randn({out});
  const auto dy = at::randn({5, 3, out});
  for (const bool bias : {true, false}) {
    for (const bool slot : {false, true}) {
      FakeSlots none;
      auto xr = x0.clone().requires_grad_(), gr = g0.clone().requires_grad_(), wr = w0.clone().requires_grad_(),
           br = b0.clone().requires_grad_();
      lf::ops::linear(lf::ops::rms_norm(be, xr, gr, 1e-6), wr, bias ? br : at::Tensor(), &none).backward(dy);
      FakeSlots slots;
      if (slot) slots.slot = backend::GradInto{at::zeros({out, h}), 1.0, false};
      auto xf = x0.clone().requires_grad_(), gf = g0.clone().requires_grad_(), wf = w0.clone().requires_grad_(),
           bf = b0.clone().requires_grad_();
      const int64_t live = be.memory_stats().allocated_bytes;
      auto yf = lf::ops::rms_norm_linear(be, xf, gf, 1e-6, wf, bias ? bf : at::Tensor(), &slots);
      // Held after forward: y and rstd (one fp32 per row); the normed [5, 3, 64] is not kept.
      EXPECT_EQ(be.memory_stats().allocated_bytes - live, yf.nbytes() + 15 * 4) << "the normed input is not kept";
      EXPECT_TRUE(at::equal(yf, lf::ops::linear(lf::ops::rms_norm(be, x0, g0, 1e-6), w0, bias ? b0 : at::Tensor(), &none)));
      yf.backward(dy);
      EXPECT_EQ(wf.grad().defined(), !slot);
      EXPECT_TRUE(at::equal(slot ? slots.slot->dw : wf.grad(), wr.grad())) << "slot " << slot;
      EXPECT_TRUE(at::equal(xf.grad(), xr.grad()));
      EXPECT_TRUE(at::equal(gf.grad(), gr.grad()));
      if (bias) {
        EXPECT_TRUE(at::equal(bf.grad(), br.grad()));
      } else {
        EXPECT_FALSE(bf.grad().defined());
      }
    }
  }
  // Only the norm's weight trains (the linear frozen, as under LoRA): its gradient still arrives.
  auto gf = g0.clone().requires_grad_(), gr = g0.clone().requires_grad_();
  lf::ops::rms_norm_linear(be, x0, gf, 1e-6, w0, {}, nullptr).backward(dy);
  at::linear(lf::ops::rms_norm(be, x0, gr, 1e-6), w0).backward(dy);
  EXPECT_TRUE(at::allclose(gf.grad(), gr.grad(), 1e-5, 1e-5));
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(lf::ops::rms_norm_linear(be, x0, g0, 1e-6, w0, b0, nullptr),
                        at::linear(lf::ops::rms_norm(be, x0, g0, 1e-6), w0, b0)));
}

// lf::ops::sdpa returns its output in sequence-major memory, so going back to [b, s, nq dv] or the
// decoder's [s, b, nq dv] is a view: what an output projection saves is the storage attention
// saved, not a second copy. Values and gradients are the head-major kernel's.
TEST(SdpaOutput, IsSequenceMajorSoTheProjectionInputIsAView) {
  const auto& be = backend::cpu_backend();
  const auto q0 = at::randn({2, 4, 8, 16}), k0 = at::randn({2, 2, 8, 16}), v0 = at::randn({2, 2, 8, 16});
  auto q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(), v = v0.clone().requires_grad_();
  const auto o = lf::ops::sdpa(be, q, k, v, backend::AttentionMask::causal());
  EXPECT_TRUE(o.transpose(1, 2).is_contiguous());
  EXPECT_EQ(o.transpose(1, 2).reshape({2, 8, 64}).data_ptr(), o.data_ptr());
  EXPECT_EQ(o.permute({2, 0, 1, 3}).reshape({8, 2, 64}).data_ptr(), o.data_ptr());
  const auto r = be.ops().sdpa_fwd(q0, k0, v0, backend::AttentionMask::causal(), 1.0 / 4.0);
  EXPECT_TRUE(at::equal(o, r.o));
  const auto dy = at::randn({2, 4, 8, 16});
  o.backward(dy);
  const auto g = be.ops().sdpa_bwd(dy, q0, k0, v0, r.o, r.lse, backend::AttentionMask::causal(), 1.0 / 4.0);
  EXPECT_TRUE(at::equal(q.grad(), g.dq));
  EXPECT_TRUE(at::equal(k.grad(), g.dk));
  EXPECT_TRUE(at::equal(v.grad(), g.dv));
}

// lf::ops::embedding's gradient-accumulation fusion: the backward scatters w's gradient (repeated
// ids included) into the slot, zeroing it first unless it already holds gradient this step, and
// autograd gets none for w. Without a slot w's gradient is at::embedding's. In bf16 the slot
// (fp32) takes the rows converted: no dense bf16 [vocab, h] gradient is made.
TEST(EmbeddingGradientFusion, TheBackwardScattersIntoTheSlot) {
  const auto w0 = at::randn({6, 5});
  const auto ids = at::tensor(std::vector<int64_t>{4, 1, 4, 0, 4, 2}).view({2, 3});
  const auto dy = at::randn({2, 3, 5});
  auto w = w0.clone().requires_grad_();
  at::embedding(w, ids).backward(dy);
  const auto dw_ref = w.grad();
  for (const bool accumulate : {false, true}) {
    FakeSlots slots;
    const auto start = at::randn({6, 5});
    slots.slot = backend::GradInto{start.clone(), 1.0, accumulate};
    auto wf = w0.clone().requires_grad_();
    auto y = lf::ops::embedding(wf, ids, &slots);
    EXPECT_TRUE(at::equal(y, at::embedding(w0, ids)));
    y.backward(dy);
    EXPECT_EQ(slots.asked, 1);
    EXPECT_FALSE(wf.grad().defined()) << "the gradient went to the slot, not to autograd";
    const auto want = accumulate ? start + dw_ref : dw_ref;
    EXPECT_TRUE(at::allclose(slots.slot->dw, want, 1e-6, 1e-6)) << "accumulate " << accumulate;
  }
  FakeSlots none;
  auto wn = w0.clone().requires_grad_();
  lf::ops::embedding(wn, ids, &none).backward(dy);
  EXPECT_EQ(none.asked, 1);
  EXPECT_TRUE(at::allclose(wn.grad(), dw_ref, 1e-6, 1e-6));
  FakeSlots bf16;
  bf16.slot = backend::GradInto{at::full({6, 5}, 7.0), 1.0, false};
  auto wb = w0.to(at::kBFloat16).requires_grad_();
  const auto dyb = dy.to(at::kBFloat16);
  lf::ops::embedding(wb, ids, &bf16).backward(dyb);
  EXPECT_EQ(bf16.asked, 1);
  EXPECT_FALSE(wb.grad().defined()) << "the bf16 gradient went to the fp32 slot, not to autograd";
  auto wr = w0.clone().requires_grad_();
  at::embedding(wr, ids).backward(dyb.to(at::kFloat));  // the same rows, summed in fp32
  EXPECT_TRUE(at::allclose(bf16.slot->dw, wr.grad(), 1e-6, 1e-6));
  // No grad mode (evaluation): a plain lookup, the sink is not asked.
  FakeSlots eval;
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(lf::ops::embedding(w0.clone().requires_grad_(), ids, &eval), at::embedding(w0, ids)));
  EXPECT_EQ(eval.asked, 0);
}

}  // namespace
}  // namespace lf::testing

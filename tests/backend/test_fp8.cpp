// FP8 (backend/fp8.h): quantization against hand-computed values and the formats' grids, tiles
// with their own scales, the FP8 linear layer's three GEMMs against the quantized operands
// (which format and which tiles each GEMM uses), gradient-accumulation fusion, and the adaptive
// policy's choices and file (written, read back, and every malformed variant refused with the
// key).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "loongforge/backend/communicator.h"
#include "loongforge/backend/fp8.h"
#include "loongforge/backend/fp8_delayed.h"
#include "loongforge/backend/fp8_grouped.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"

namespace {

using lf::ops::Fp8Format;
using lf::ops::Fp8Gemm;
using lf::ops::Fp8Policy;
using lf::ops::Fp8Recipe;
using lf::ops::Fp8Scaling;

double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

TEST(Fp8, QuantizeScalesToTheFormatsLargestValue) {
  EXPECT_EQ(lf::ops::fp8_max(at::kFloat8_e4m3fn), 448.0);
  EXPECT_EQ(lf::ops::fp8_max(at::kFloat8_e5m2), 57344.0);
  // amax 896 -> scale 448 / 896 = 0.5: 896 -> 448, 1.0 -> 0.5, 3.0 -> 1.5; 100 -> 50 -> 48 (E4M3's
  // grid between 32 and 64 has spacing 4; 50 is the tie between 48 and 52, and round-half-to-even
  // takes 48, whose mantissa is even).
  const auto x = at::tensor({896.0f, -1.0f, 3.0f, 100.0f}).reshape({1, 4});
  const auto q = lf::ops::quantize(x, at::kFloat8_e4m3fn, 0, 0, 0);
  EXPECT_EQ(q.data.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_FLOAT_EQ(q.scale_inv.item<float>(), 2.0f);
  const auto v = q.data.to(at::kFloat);
  EXPECT_FLOAT_EQ(v[0][0].item<float>(), 448.0f);
  EXPECT_FLOAT_EQ(v[0][1].item<float>(), -0.5f);
  EXPECT_FLOAT_EQ(v[0][2].item<float>(), 1.5f);
  EXPECT_FLOAT_EQ(v[0][3].item<float>(), 48.0f);
  EXPECT_TRUE(at::equal(q.dequantize(), at::tensor({896.0f, -1.0f, 3.0f, 96.0f}).reshape({1, 4})));
  // margin 1: half the scale.
  EXPECT_FLOAT_EQ(lf::ops::quantize(x, at::kFloat8_e4m3fn, 0, 0, 1).scale_inv.item<float>(), 4.0f);
  // E5M2: 2 mantissa bits; amax 57344 -> scale 1, 100 -> 96 (spacing 16 between 64 and 128: 96 and
  // 112 are the neighbours, 96 the nearer).
  const auto e5 = lf::ops::quantize(at::tensor({57344.0f, 100.0f}).reshape({1, 2}), at::kFloat8_e5m2, 0, 0, 0);
  EXPECT_FLOAT_EQ(e5.data.to(at::kFloat)[0][1].item<float>(), 96.0f);
  // An all-zero tensor keeps scale 1 (no division by zero) and stays zero.
  const auto z = lf::ops::quantize(at::zeros({2, 3}), at::kFloat8_e4m3fn, 0, 0, 0);
  EXPECT_FLOAT_EQ(z.scale_inv.item<float>(), 1.0f);
  EXPECT_EQ(max_abs(z.dequantize()), 0.0);
  // MX (power-of-two) scales: scale_inv = the power of two at or above amax / 448. amax 896 ->
  // 2 (exactly a power of two: 896 -> 448); amax 900 -> 4 (900 -> 225); amax 3 -> 2^-7 (3 / 448 is
  // between 2^-8 and 2^-7); margin 1 doubles scale_inv.
  EXPECT_FLOAT_EQ(lf::ops::quantize(x, at::kFloat8_e4m3fn, 0, 0, 0, {}, true).scale_inv.item<float>(), 2.0f);
  const auto mx = lf::ops::quantize(at::tensor({900.0f, 1.0f}).reshape({1, 2}), at::kFloat8_e4m3fn, 0, 0, 0, {}, true);
  EXPECT_FLOAT_EQ(mx.scale_inv.item<float>(), 4.0f);
  EXPECT_FLOAT_EQ(mx.data.to(at::kFloat)[0][0].item<float>(), 224.0f);  // 225 -> 224 (spacing 16 in [128, 256))
  EXPECT_FLOAT_EQ(lf::ops::quantize(at::full({1, 1}, 3.0f), at::kFloat8_e4m3fn, 0, 0, 0, {}, true).scale_inv.item<float>(),
                  std::ldexp(1.0f, -7));
  EXPECT_FLOAT_EQ(lf::ops::quantize(x, at::kFloat8_e4m3fn, 0, 0, 1, {}, true).scale_inv.item<float>(), 4.0f);
  // A given amax (e.g. reduced over TP) replaces the tensor's own: values above it saturate.
  const auto sat = lf::ops::quantize(x, at::kFloat8_e4m3fn, 0, 0, 0, at::full({1, 1}, 448.0f));
  EXPECT_FLOAT_EQ(sat.dequantize()[0][0].item<float>(), 448.0f);
}

// Every tile of 1 x 128 / 128 x 128 / 128 x 1 has the scale of its own amax, the last partial
// tiles included; dequantized values are within half an E4M3 step (2^-4 relative) of the input,
// plus the subnormal spacing near zero.
TEST(Fp8, TilesHaveTheirOwnScales) {
  at::manual_seed(3);
  // Rows and columns of very different magnitudes, so a scale shared across tiles would show.
  const auto x = at::randn({200, 300}) * at::pow(10.0, at::arange(300) % 7 - 3).reshape({1, 300}) *
                 at::pow(10.0, at::arange(200) % 5 - 2).reshape({200, 1});
  for (auto [tr, tc] : {std::pair<int64_t, int64_t>{1, 128}, {128, 128}, {128, 1}}) {
    const auto q = lf::ops::quantize(x, at::kFloat8_e4m3fn, tr, tc, 0);
    ASSERT_EQ(q.scale_inv.size(0), (200 + tr - 1) / tr);
    ASSERT_EQ(q.scale_inv.size(1), (300 + tc - 1) / tc);
    for (int64_t i = 0; i < q.scale_inv.size(0); i += std::max<int64_t>(1, q.scale_inv.size(0) / 5))
      for (int64_t j = 0; j < q.scale_inv.size(1); ++j) {
        const auto tile = x.narrow(0, i * tr, std::min(tr, 200 - i * tr)).narrow(1, j * tc, std::min(tc, 300 - j * tc));
        EXPECT_NEAR(q.scale_inv[i][j].item<double>(), max_abs(tile) / 448.0, 1e-6 * max_abs(tile) / 448.0)
            << tr << "x" << tc << " tile " << i << "," << j;
      }
    const auto scale_inv = q.scale_inv.repeat_interleave(tr, 0).repeat_interleave(tc, 1).narrow(0, 0, 200).narrow(1, 0, 300);
    const auto err = (q.dequantize() - x).abs();
    const auto bound = x.abs() * std::ldexp(1.0, -4) + scale_inv * std::ldexp(1.0, -10);
    EXPECT_TRUE((err <= bound * (1 + 1e-6)).all().item<bool>()) << tr << "x" << tc;
    EXPECT_GT(max_abs(err), 0.0);  // it did quantize
  }
  // The tile amax helper pads partial tiles with zeros.
  EXPECT_TRUE(at::allclose(lf::ops::tile_amax(x, 128, 128)[1][2], x.narrow(0, 128, 72).narrow(1, 256, 44).abs().max()));
}

// The reference of one FP8 GEMM: both operands quantized with the given tiles along the reduction
// dim k, dequantized, multiplied in fp64. a [m, k], b [n, k] -> [m, n].
at::Tensor fp8_gemm(const at::Tensor& a, at::ScalarType fa, std::pair<int64_t, int64_t> ta, const at::Tensor& b,
                    at::ScalarType fb, std::pair<int64_t, int64_t> tb, bool pow2) {
  const auto qa = lf::ops::quantize(a, fa, ta.first, ta.second, 0, {}, pow2).dequantize().to(at::kDouble);
  const auto qb = lf::ops::quantize(b, fb, tb.first, tb.second, 0, {}, pow2).dequantize().to(at::kDouble);
  return qa.matmul(qb.t());
}

struct LinearCase {
  Fp8Scaling scaling;
  Fp8Format format;
};

void PrintTo(const LinearCase& c, std::ostream* os) {
  *os << lf::ops::to_string(c.scaling) << " " << lf::ops::to_string(c.format);
}

class Fp8Linear : public ::testing::TestWithParam<LinearCase> {};

// y = Q(x) Q(w)^T, dx = Q(dy) Q(w), dw = Q(dy)^T Q(x), db = sum dy (unquantized), where for the
// blockwise recipe each Q tiles along its GEMM's reduction dim (x and dy in 1 x 128 rows for y and
// dx, in 128 x 1 columns for dw; w in 128 x 128 blocks) and dy is E5M2 under hybrid.
TEST_P(Fp8Linear, GemmsMultiplyTheQuantizedOperands) {
  const auto [scaling, format] = GetParam();
  Fp8Recipe r;
  r.scaling = scaling, r.format = format;
  at::manual_seed(5);
  const int64_t n = 160, in = 192, out = 144;  // partial blocks along every dim
  auto x = (at::randn({2, n / 2, in}) * at::linspace(0.1, 3.0, in)).requires_grad_(true);
  auto w = (at::randn({out, in}) * 0.05).requires_grad_(true);
  auto b = at::randn({out}).requires_grad_(true);
  const auto dy = at::randn({2, n / 2, out}) * at::linspace(0.01, 1.0, out);
  auto y = lf::ops::fp8_linear(x, w, b, r, nullptr, nullptr);
  y.backward(dy);
  using T = std::pair<int64_t, int64_t>;
  const bool blockwise = scaling == Fp8Scaling::blockwise, mx = scaling == Fp8Scaling::mxfp8;
  const int64_t k = mx ? 32 : 128;  // the block
  const T row = blockwise || mx ? T{1, k} : T{0, 0}, col = blockwise || mx ? T{k, 1} : T{0, 0};
  // w: 128 x 128 blocks (blockwise), 1 x 32 along in for the forward and 32 x 1 along out for dx (MX).
  const T blk = blockwise ? T{128, 128} : mx ? T{1, 32} : T{0, 0}, blk_dx = mx ? T{32, 1} : blk;
  const auto e4 = at::kFloat8_e4m3fn, eg = format == Fp8Format::hybrid ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn;
  const auto x2 = x.detach().reshape({n, in}), d2 = dy.reshape({n, out});
  const auto y_ref = fp8_gemm(x2, e4, row, w.detach(), e4, blk, mx) + b.detach().to(at::kDouble);
  // dx = Q(dy) Q(w), w's tiles along out (blockwise: square blocks, the forward's).
  const auto wq = lf::ops::quantize(w.detach(), e4, blk_dx.first, blk_dx.second, 0, {}, mx).dequantize().to(at::kDouble);
  const auto dx_ref = lf::ops::quantize(d2, eg, row.first, row.second, 0, {}, mx).dequantize().to(at::kDouble).matmul(wq);
  // dw = Q(dy^T) Q(x^T)^T with tiles along the tokens: dy and x in k x 1 tiles.
  const auto dw_ref = lf::ops::quantize(d2, eg, col.first, col.second, 0, {}, mx).dequantize().to(at::kDouble).t().matmul(
      lf::ops::quantize(x2, e4, col.first, col.second, 0, {}, mx).dequantize().to(at::kDouble));
  auto rel = [](const at::Tensor& got, const at::Tensor& want) {
    return max_abs(got.to(at::kDouble) - want) / max_abs(want);
  };
  // fp32 accumulation against fp64: ~1e-6 relative.
  EXPECT_LT(rel(y.detach().reshape({n, out}), y_ref), 1e-5);
  EXPECT_LT(rel(x.grad().reshape({n, in}), dx_ref), 1e-5);
  EXPECT_LT(rel(w.grad(), dw_ref), 1e-5);
  EXPECT_TRUE(at::allclose(b.grad(), d2.sum(0), 1e-5, 1e-5));
  // And FP8 is not the fp32 product: quantization error at the percent level, not more.
  const auto y32 = at::linear(x.detach(), w.detach(), b.detach());
  const double e = rel(y.detach(), y32.to(at::kDouble));
  EXPECT_GT(e, 1e-4);
  EXPECT_LT(e, 0.1);
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8Linear,
                         ::testing::Values(LinearCase{Fp8Scaling::tensorwise, Fp8Format::hybrid},
                                           LinearCase{Fp8Scaling::tensorwise, Fp8Format::e4m3},
                                           LinearCase{Fp8Scaling::blockwise, Fp8Format::hybrid},
                                           LinearCase{Fp8Scaling::blockwise, Fp8Format::e4m3},
                                           LinearCase{Fp8Scaling::mxfp8, Fp8Format::hybrid},
                                           LinearCase{Fp8Scaling::mxfp8, Fp8Format::e4m3}),
                         [](const auto& info) {
                           return std::string(lf::ops::to_string(info.param.scaling)) + "_" +
                                  lf::ops::to_string(info.param.format);
                         });

// On a GPU (tools/gpu-check runs it; skipped without one): the CUDA run of each recipe equals the
// CPU's. Tensorwise at k and n multiples of 16 is cuBLASLt's FP8 GEMM (at::_scaled_mm); at n 86 and
// blockwise the dequantized path. The same quantized operands, fp32 sums in another order: 1e-5.
TEST(Fp8Linear, CudaEqualsTheCpu) {
  if (!lf::backend::cuda_device_visible()) GTEST_SKIP() << "no CUDA device visible: run by tools/gpu-check";
  at::globalContext().setAllowTF32CuBLAS(false);
  const auto device = lf::backend::backend_by_name("cuda").device();
  for (Fp8Scaling scaling : {Fp8Scaling::tensorwise, Fp8Scaling::blockwise})
    for (int64_t out : {96, 86}) {
      Fp8Recipe r;
      r.scaling = scaling;
      at::manual_seed(11);
      const auto x = at::randn({2, 32, 128}), w = at::randn({out, 128}) * 0.05, dy = at::randn({2, 32, out});
      auto run = [&](c10::Device d) {
        auto xd = x.to(d).requires_grad_(true), wd = w.to(d).requires_grad_(true);
        auto y = lf::ops::fp8_linear(xd, wd, {}, r, nullptr, nullptr);
        y.backward(dy.to(d));
        return std::vector<at::Tensor>{y.detach().cpu(), xd.grad().cpu(), wd.grad().cpu()};
      };
      const auto cpu = run(at::kCPU), gpu = run(device);
      for (size_t i = 0; i < 3; ++i)
        EXPECT_LT(max_abs(gpu[i] - cpu[i]) / max_abs(cpu[i]), 1e-5)
            << lf::ops::to_string(scaling) << " out " << out << " tensor " << i << " (y, dx, dw)";
    }
}

// The experts' grouped GEMM: each row group exactly the FP8 linear layer of its own rows and
// weight (its own scales), an empty group included; gradients to x and every w[g].
TEST(Fp8Linear, GroupedIsOneFp8LinearPerGroup) {
  at::manual_seed(13);
  for (Fp8Scaling scaling : {Fp8Scaling::tensorwise, Fp8Scaling::blockwise}) {
    Fp8Recipe r;
    r.scaling = scaling;
    const auto counts = at::tensor({5, 0, 17, 9}, at::kLong);
    const auto x = at::randn({31, 24}) * at::linspace(0.1, 4.0, 31).reshape({31, 1});
    const auto w = at::randn({4, 20, 24}) * at::linspace(0.01, 1.0, 4).reshape({4, 1, 1});
    const auto dy = at::randn({31, 20});
    auto xg = x.clone().requires_grad_(true), wg = w.clone().requires_grad_(true);
    auto y = lf::ops::fp8_grouped_linear(xg, wg, counts, r, nullptr);
    y.backward(dy);
    auto xl = x.clone().requires_grad_(true), wl = w.clone().requires_grad_(true);
    std::vector<at::Tensor> parts;
    int64_t off = 0;
    for (int64_t g = 0; g < 4; ++g) {
      const int64_t n = counts[g].item<int64_t>();
      if (n > 0) parts.push_back(lf::ops::fp8_linear(xl.narrow(0, off, n), wl.select(0, g), {}, r, nullptr, nullptr));
      off += n;
    }
    auto yl = at::cat(parts);
    yl.backward(dy);
    const char* what = lf::ops::to_string(scaling);
    EXPECT_TRUE(at::equal(y, yl)) << what;
    EXPECT_TRUE(at::allclose(xg.grad(), xl.grad(), 1e-6, 1e-7)) << what;
    EXPECT_TRUE(at::allclose(wg.grad(), wl.grad(), 1e-6, 1e-7)) << what;
    EXPECT_EQ(max_abs(wg.grad().select(0, 1)), 0.0) << what;  // the empty group's weight
    // Without gradients: the same forward.
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(lf::ops::fp8_grouped_linear(x, w, counts, r, nullptr), y.detach())) << what;
  }
  EXPECT_THROW(lf::ops::fp8_grouped_linear(at::randn({3, 24}), at::randn({4, 20, 24}), at::tensor({1, 1, 0, 0}), Fp8Recipe{},
                                           nullptr),
               lf::Error);  // counts sum to 2, not 3 rows
}

// The grouped GEMM's passes (Fp8GroupedGemm, which the overlapped MoE all-to-all schedules itself):
// the input gradient and the weight gradient asked for separately, in either order, equal the
// autograd function's (and both at once), bit for bit, for every recipe that computes its scales
// from the tensors; a backward of a forward that kept nothing is refused.
TEST(Fp8Linear, GroupedPassesEqualTheAutogradFunction) {
  at::manual_seed(17);
  for (Fp8Scaling scaling : {Fp8Scaling::tensorwise, Fp8Scaling::blockwise, Fp8Scaling::mxfp8}) {
    Fp8Recipe r;
    r.scaling = scaling;
    const std::vector<int64_t> counts{5, 0, 17, 9};
    const auto x = at::randn({31, 64}) * at::linspace(0.1, 4.0, 31).reshape({31, 1});
    const auto w = at::randn({4, 32, 64}) * at::linspace(0.01, 1.0, 4).reshape({4, 1, 1});
    const auto dy = at::randn({31, 32});
    auto xg = x.clone().requires_grad_(true), wg = w.clone().requires_grad_(true);
    auto y = lf::ops::fp8_grouped_linear(xg, wg, at::tensor(counts, at::kLong), r, nullptr);
    y.backward(dy);
    const char* what = lf::ops::to_string(scaling);
    lf::ops::Fp8GroupedGemm gemm(x, w, counts, r, nullptr, true, true);
    EXPECT_TRUE(at::equal(gemm.take_output(), y.detach())) << what;
    EXPECT_THROW(gemm.take_output(), lf::Error) << what;  // handed over once
    const auto [dx, none] = gemm.backward(dy, true, false);
    const auto [nothing, dw] = gemm.backward(dy, false, true);
    EXPECT_FALSE(none.defined()) << what;
    EXPECT_FALSE(nothing.defined()) << what;
    EXPECT_TRUE(at::equal(dx, xg.grad())) << what;
    EXPECT_TRUE(at::equal(dw, wg.grad())) << what;
    const auto [dx2, dw2] = gemm.backward(dy, true, true);
    EXPECT_TRUE(at::equal(dx2, dx) && at::equal(dw2, dw)) << what;
    EXPECT_EQ(max_abs(dw.select(0, 1)), 0.0) << what;  // the empty group's weight
    lf::ops::Fp8GroupedGemm forward_only(x, w, counts, r, nullptr, false, false);
    EXPECT_TRUE(at::equal(forward_only.take_output(), y.detach())) << what;
    EXPECT_THROW(forward_only.backward(dy, true, true), lf::Error) << what;
  }
  EXPECT_THROW(lf::ops::Fp8GroupedGemm(at::randn({3, 24}), at::randn({4, 20, 24}), {1, 1, 0, 0}, Fp8Recipe{}, nullptr,
                                       true, true),
               lf::Error);  // counts sum to 2, not 3 rows
  // No rows at all (no token reached this rank's experts): an empty output, zero gradients.
  lf::ops::Fp8GroupedGemm none(at::randn({0, 24}), at::randn({4, 20, 24}), {0, 0, 0, 0}, Fp8Recipe{}, nullptr, true, true);
  EXPECT_EQ(none.take_output().sizes(), (std::vector<int64_t>{0, 20}));
  const auto [dx0, dw0] = none.backward(at::zeros({0, 20}), true, true);
  EXPECT_EQ(dx0.sizes(), (std::vector<int64_t>{0, 24}));
  EXPECT_EQ(max_abs(dw0), 0.0);
}

// A group of two whose all-reduce leaves the tensor as it is (the other member holds the same
// values) and counts the calls: how many amax reductions a pass makes.
class CountingPair final : public lf::backend::Communicator {
 public:
  int calls = 0;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& ranks() const override { return ranks_; }
  std::shared_ptr<lf::backend::Work> all_reduce(at::Tensor&, lf::backend::ReduceOp, bool) override {
    ++calls;
    return nullptr;
  }
  std::shared_ptr<lf::backend::Work> all_gather(at::Tensor&, const at::Tensor&, bool) override { return unused(); }
  std::shared_ptr<lf::backend::Work> reduce_scatter(at::Tensor&, const at::Tensor&, lf::backend::ReduceOp,
                                                    bool) override {
    return unused();
  }
  std::shared_ptr<lf::backend::Work> broadcast(at::Tensor&, int, bool) override { return unused(); }
  std::shared_ptr<lf::backend::Work> all_to_all(at::Tensor&, const at::Tensor&, const std::vector<int64_t>&,
                                                const std::vector<int64_t>&, bool) override {
    return unused();
  }
  std::shared_ptr<lf::backend::Work> send(const at::Tensor&, int, int, bool) override { return unused(); }
  std::shared_ptr<lf::backend::Work> recv(at::Tensor&, int, int, bool) override { return unused(); }
  void barrier() override { unused(); }

 private:
  static std::shared_ptr<lf::backend::Work> unused() { LF_FAIL("CountingPair: only all_reduce is used"); }
  std::string name_ = "tp";
  std::vector<int> ranks_{0, 1};
};

// The output gradient quantized once (Fp8GroupedGemm::quantize_grad), then the input gradient and,
// later, the weight gradient from that copy (the overlapped MoE's --delay-wgrad-compute): bit for
// bit the autograd function's, for every recipe. Tensorwise with an amax group: one all-reduce for
// the output gradient, none in either GEMM (quantizing again for the weight gradient was a
// second). A gradient the copy was not quantized for, or another GEMM's copy, is refused.
TEST(Fp8Linear, GroupedOutputGradientQuantizedOnceServesBothGemms) {
  at::manual_seed(23);
  for (Fp8Scaling scaling : {Fp8Scaling::tensorwise, Fp8Scaling::delayed, Fp8Scaling::blockwise, Fp8Scaling::mxfp8}) {
    Fp8Recipe r;
    r.scaling = scaling;
    const char* what = lf::ops::to_string(scaling);
    const std::vector<int64_t> counts{7, 0, 12, 13};
    const auto x = at::randn({32, 64}), w = at::randn({4, 48, 64}) * 0.1, dy = at::randn({32, 48});
    CountingPair pair;
    auto xg = x.clone().requires_grad_(true), wg = w.clone().requires_grad_(true);
    // Delayed: the scales of a table that holds wg (1 until an update; both runs record into it).
    std::optional<lf::ops::Fp8DelayedScaling> table;
    if (scaling == Fp8Scaling::delayed) {
      table.emplace(r);
      table->add_group({{"w", wg}}, {});
      r.delayed = &*table;
    }
    lf::ops::fp8_grouped_linear(xg, wg, at::tensor(counts, at::kLong), r, &pair).backward(dy);
    lf::ops::Fp8GroupedGemm gemm(x, wg.detach(), counts, r, &pair, true, true);
    gemm.take_output();
    EXPECT_EQ(gemm.one_grad_copy(), scaling == Fp8Scaling::tensorwise || scaling == Fp8Scaling::delayed) << what;
    pair.calls = 0;
    const auto q = gemm.quantize_grad(dy, true, true);
    EXPECT_EQ(pair.calls, scaling == Fp8Scaling::tensorwise ? 1 : 0) << what;
    const auto dx = gemm.backward(q, true, false).first;
    const auto dw = gemm.backward(q, false, true).second;
    EXPECT_EQ(pair.calls, scaling == Fp8Scaling::tensorwise ? 1 : 0) << what;
    EXPECT_TRUE(at::equal(dx, xg.grad())) << what;
    EXPECT_TRUE(at::equal(dw, wg.grad())) << what;
    // Quantized for one GEMM only: the other is refused.
    EXPECT_THROW(gemm.backward(gemm.quantize_grad(dy, true, false), false, true), lf::Error) << what;
    EXPECT_THROW(gemm.backward(gemm.quantize_grad(dy, false, true), true, false), lf::Error) << what;
    EXPECT_THROW(gemm.quantize_grad(dy.narrow(0, 0, 31), true, true), lf::Error) << what;  // not the output's rows
    // Another grouped GEMM's quantized gradient is refused.
    lf::ops::Fp8GroupedGemm other(x, wg.detach(), {32, 0, 0, 0}, r, &pair, true, true);
    EXPECT_THROW(other.backward(q, true, true), lf::Error) << what;
  }
}

// The autograd function keeps its FP8 copies beside, not inside, its output's graph: once the
// output and its gradient are gone, nothing holds the output (a node that held its own output
// through its saved state would never be freed: every MoE layer's copies, every micro-batch).
TEST(Fp8Linear, GroupedFunctionDoesNotHoldItsOutput) {
  Fp8Recipe r;
  auto x = at::randn({6, 16}).requires_grad_(true), w = at::randn({2, 8, 16}).requires_grad_(true);
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> weak;
  {
    auto y = lf::ops::fp8_grouped_linear(x, w, at::tensor({4, 2}, at::kLong), r, nullptr);
    weak.emplace(y.getIntrusivePtr());
    y.sum().backward();
  }
  EXPECT_TRUE(weak->expired());
  EXPECT_TRUE(x.grad().defined() && w.grad().defined());
  {  // without a backward (the graph dropped): freed as well
    auto y = lf::ops::fp8_grouped_linear(x, w, at::tensor({4, 2}, at::kLong), r, nullptr);
    weak.emplace(y.getIntrusivePtr());
  }
  EXPECT_TRUE(weak->expired());
}

class OneSlot : public lf::ops::WeightGradSlots {
 public:
  explicit OneSlot(at::Tensor dw, bool accumulate) : dw_(std::move(dw)), accumulate_(accumulate) {}
  std::optional<lf::backend::GradInto> weight_grad_slot(const at::Tensor&) const override {
    lf::backend::GradInto g;
    g.dw = dw_;
    g.accumulate = accumulate_;
    return g;
  }

 private:
  at::Tensor dw_;
  bool accumulate_;
};

// bf16 activations and weights: y and dx come back in bf16, w's fp32 gradient goes into the slot
// (added to what it holds) and autograd gets none; without grad mode the forward alone, the same y.
TEST(Fp8Linear, Bf16WithGradientSlot) {
  at::manual_seed(7);
  Fp8Recipe r;
  auto x = at::randn({4, 8, 64}).to(at::kBFloat16).requires_grad_(true);
  auto w = (at::randn({32, 64}) * 0.1).to(at::kBFloat16).requires_grad_(true);
  const auto dy = at::randn({4, 8, 32}).to(at::kBFloat16);
  auto plain = lf::ops::fp8_linear(x, w, {}, r, nullptr, nullptr);
  plain.backward(dy);
  const auto dw_plain = w.grad().clone();
  EXPECT_EQ(plain.scalar_type(), at::kBFloat16);
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  EXPECT_EQ(dw_plain.scalar_type(), at::kBFloat16);
  w.mutable_grad() = at::Tensor();
  const auto held = at::ones({32, 64});
  OneSlot slot(held, true);
  lf::ops::fp8_linear(x, w, {}, r, &slot, nullptr).backward(dy);
  EXPECT_FALSE(w.grad().defined());
  EXPECT_TRUE(at::allclose(held - 1, dw_plain.to(at::kFloat), 1e-2, 1e-2));
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(lf::ops::fp8_linear(x, w, {}, r, nullptr, nullptr), plain.detach()));
}

TEST(Fp8Policy, ChoosesByGemmAndTokenCount) {
  const Fp8Recipe named = Fp8Recipe::from_names("e4m3", "blockwise", 2);
  EXPECT_EQ(named.format, Fp8Format::e4m3);
  EXPECT_EQ(named.scaling, Fp8Scaling::blockwise);
  EXPECT_EQ(named.margin, 2);
  EXPECT_EQ(Fp8Recipe::from_names("hybrid", "tensorwise", 0), Fp8Recipe{});
  EXPECT_THROW(Fp8Recipe::from_names("e5m2", "tensorwise", 0), lf::Error);
  EXPECT_EQ(Fp8Recipe::from_names("e4m3", "mxfp8", 0).scaling, Fp8Scaling::mxfp8);
  EXPECT_THROW(Fp8Recipe::from_names("hybrid", "nvfp4", 0), lf::Error);
  Fp8Recipe r;
  Fp8Policy all(r);
  for (Fp8Gemm g : lf::ops::kFp8Gemms) EXPECT_EQ(all.choose(g, 1), &all.recipe());
  Fp8Policy p(r);
  p.set_steps(Fp8Gemm::fc1, {{0, false}, {1024, true}, {8192, false}});
  EXPECT_EQ(p.choose(Fp8Gemm::fc1, 1023), nullptr);
  EXPECT_NE(p.choose(Fp8Gemm::fc1, 1024), nullptr);
  EXPECT_NE(p.choose(Fp8Gemm::fc1, 8191), nullptr);
  EXPECT_EQ(p.choose(Fp8Gemm::fc1, 8192), nullptr);
  EXPECT_NE(p.choose(Fp8Gemm::qkv, 1), nullptr);  // no steps: FP8
  EXPECT_THROW(p.set_steps(Fp8Gemm::fc2, {{16, true}}), lf::Error);                 // not from 0
  EXPECT_THROW(p.set_steps(Fp8Gemm::fc2, {{0, true}, {0, false}}), lf::Error);      // not rising
  EXPECT_THROW(p.set_steps(Fp8Gemm::fc2, {}), lf::Error);
  // The benchmark's choice: FP8 where it was faster, from that measured count on.
  using M = Fp8Policy::Measurement;
  std::vector<M> m;
  for (Fp8Gemm g : lf::ops::kFp8Gemms)
    for (int64_t t : {512, 2048, 8192}) m.push_back({g, t, 1.0, g == Fp8Gemm::proj ? 2.0 : (t >= 2048 ? 0.5 : 1.5)});
  const auto chosen = Fp8Policy::from_measurements(r, m);
  EXPECT_EQ(chosen.choose(Fp8Gemm::proj, 100000), nullptr);
  EXPECT_EQ(chosen.choose(Fp8Gemm::fc1, 2047), nullptr);
  EXPECT_NE(chosen.choose(Fp8Gemm::fc1, 2048), nullptr);
  EXPECT_EQ(chosen.choose(Fp8Gemm::qkv, 1), nullptr);  // below the smallest: the smallest's choice
  m.erase(std::remove_if(m.begin(), m.end(), [](const M& x) { return x.gemm == Fp8Gemm::fc2; }), m.end());
  EXPECT_THROW(Fp8Policy::from_measurements(r, m), lf::Error);
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const lf::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Written then read back: the same choices. Each malformed variant is refused naming the file
// and the key.
TEST(Fp8Policy, FileRoundTripsAndMalformedFilesAreRefusedWithTheKey) {
  const auto dir = std::filesystem::temp_directory_path() / ("lf_fp8_policy_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "policy.json").string();
  Fp8Recipe r;
  r.scaling = Fp8Scaling::blockwise;
  Fp8Policy p(r);
  p.set_steps(Fp8Gemm::qkv, {{0, false}, {4096, true}});
  p.write(path, "cpu, test", {{Fp8Gemm::qkv, 4096, 1.0, 0.5}});
  const auto back = Fp8Policy::read(path, r);
  EXPECT_EQ(back.source(), path);
  for (Fp8Gemm g : lf::ops::kFp8Gemms)
    for (int64_t t : {1, 4095, 4096, 100000}) EXPECT_EQ(back.choose(g, t) == nullptr, p.choose(g, t) == nullptr);
  nlohmann::json good;
  std::ifstream(path) >> good;
  auto refused = [&](const std::function<void(nlohmann::json&)>& mutate, const std::string& want,
                     const Fp8Recipe& run) {
    nlohmann::json j = good;
    mutate(j);
    const std::string bad = (dir / "bad.json").string();
    std::ofstream(bad) << j.dump();
    const std::string msg = message_of([&] { Fp8Policy::read(bad, run); });
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
    EXPECT_NE(msg.find(want), std::string::npos) << "want '" << want << "' in: " << msg;
  };
  refused([](auto& j) { j["format"] = "other"; }, "\"format\"", r);
  refused([](auto& j) { j["format"] = 3; }, "\"format\"", r);
  refused([](auto& j) { j["version"] = 2; }, "\"version\" 2", r);
  refused([](auto& j) { j.erase("gemms"); }, "gemms is missing", r);
  refused([](auto& j) { j["gemms"].erase("fc2"); }, "gemms.fc2 is missing", r);
  refused([](auto& j) { j["gemms"]["fc3"] = j["gemms"]["fc2"]; }, "gemms.fc3 is not a GEMM kind", r);
  refused([](auto& j) { j["policy"] = "fast"; }, "policy is not a key of this file", r);
  refused([](auto& j) { j["gemms"]["qkv"][0]["max_tokens"] = 8; }, "gemms.qkv[0].max_tokens is not a key", r);
  refused([](auto& j) { j["gemms"]["qkv"][0] = 3; }, "gemms.qkv[0] is not an object", r);
  refused([](auto& j) { j["gemms"]["qkv"][1]["precision"] = "fp4"; }, "gemms.qkv[1].precision", r);
  refused([](auto& j) { j["gemms"]["qkv"][1]["min_tokens"] = -1; }, "gemms.qkv[1].min_tokens", r);
  refused([](auto& j) { j["gemms"]["qkv"][1].erase("min_tokens"); }, "gemms.qkv[1].min_tokens is missing", r);
  refused([](auto& j) { j["gemms"]["qkv"][0]["min_tokens"] = 8; }, "gemms.qkv: the first step starts at min_tokens 8",
          r);
  refused([](auto& j) { j["gemms"]["qkv"][1]["min_tokens"] = 0; }, "gemms.qkv[1]: min_tokens 0 does not rise", r);
  refused([](auto&) {}, "measured for recipe \"blockwise\"", Fp8Recipe{});  // the run is tensorwise
  const std::string not_json = (dir / "nope.json").string();
  std::ofstream(not_json) << "{";
  EXPECT_NE(message_of([&] { Fp8Policy::read(not_json, r); }).find("not JSON"), std::string::npos);
  EXPECT_NE(message_of([&] { Fp8Policy::read((dir / "absent.json").string(), r); }).find("cannot open"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace

// lf::ops::gemm (loongforge/backend/gemm.h): the linear layers' GEMMs. Large fp32 CPU products go
// to oneDNN; these pin that they are taken there and equal an fp64 product (forward, both
// gradients' shapes, the accumulating write into a gradient slot, the bias), and that operands
// oneDNN must not see (a broadcast row, a small product, bf16, an autograd graph to record) stay
// on ATen's path, correct.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include "loongforge/backend/gemm.h"

namespace lf::testing {
namespace {

namespace gemm = lf::ops::gemm;

// fp32 against fp64: relative to the product's scale (k terms of unit-variance products).
void expect_product(const at::Tensor& got, const at::Tensor& want64, const char* what) {
  const double err = (got.to(at::kDouble) - want64).abs().max().item<double>();
  const double scale = want64.abs().max().item<double>();
  EXPECT_LT(err, 2e-6 * scale + 1e-6) << what << ": max error " << err << " at scale " << scale;
}

TEST(Gemm, LargeFp32ProductsTakeOneDnnAndAreExact) {
  at::manual_seed(3);
  // The bench's MLP shapes: [388, 256] x [256, 512] (forward), its input gradient and the
  // weight gradient (a transposed operand).
  auto x = at::randn({388, 256}), w = at::randn({512, 256}), dy = at::randn({388, 512});
  ASSERT_TRUE(gemm::takes_onednn(x, w.t()));
  ASSERT_TRUE(gemm::takes_onednn(dy, w));
  ASSERT_TRUE(gemm::takes_onednn(dy.t(), x));
  auto x64 = x.to(at::kDouble), w64 = w.to(at::kDouble), dy64 = dy.to(at::kDouble);
  expect_product(gemm::mm(x, w.t()), x64.mm(w64.t()), "forward");
  expect_product(gemm::mm(dy, w), dy64.mm(w64), "input gradient");
  auto dw = at::randn({512, 256});
  auto before = dw.to(at::kDouble);
  gemm::mm_into(dw, dy.t(), x, /*accumulate=*/true);
  expect_product(dw, before + dy64.t().mm(x64), "accumulated weight gradient");
  gemm::mm_into(dw, dy.t(), x, /*accumulate=*/false);
  expect_product(dw, dy64.t().mm(x64), "written weight gradient");
  // linear over [b, s, in] with and without a bias.
  auto x3 = x.view({4, 97, 256}), bias = at::randn({512});
  auto y = gemm::linear(x3, w, bias);
  ASSERT_EQ(y.sizes(), (at::IntArrayRef{4, 97, 512}));
  expect_product(y.view({388, 512}), x64.mm(w64.t()) + bias.to(at::kDouble), "linear with bias");
  expect_product(gemm::linear(x3, w, std::nullopt).view({388, 512}), x64.mm(w64.t()), "linear");
}

TEST(Gemm, OperandsOneDnnMustNotSeeStayOnAten) {
  at::manual_seed(4);
  auto w = at::randn({512, 256});
  // A broadcast gradient (stride 0 across rows, as the gradient of a sum is).
  auto row = at::randn({1, 512}).expand({388, 512});
  EXPECT_FALSE(gemm::takes_onednn(row, w));
  expect_product(gemm::mm(row, w), row.to(at::kDouble).mm(w.to(at::kDouble)), "broadcast rows");
  // Below the threshold, and bf16.
  auto small = at::randn({16, 256});
  EXPECT_FALSE(gemm::takes_onednn(small, w.t()));
  EXPECT_FALSE(gemm::takes_onednn(at::randn({388, 256}).to(at::kBFloat16), w.t().to(at::kBFloat16)));
  expect_product(gemm::linear(small, w, std::nullopt), small.to(at::kDouble).mm(w.to(at::kDouble).t()), "small");
  // An operand requiring grad with grad mode on: oneDNN would record no graph, so ATen's path,
  // whose result carries the gradient.
  auto x = at::randn({388, 256}).requires_grad_(true);
  EXPECT_FALSE(gemm::takes_onednn(x, w.t()));
  auto y = gemm::linear(x, w, std::nullopt);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  expect_product(x.grad(), at::ones({388, 512}, at::kDouble).mm(w.to(at::kDouble)), "gradient through linear");
  {
    at::NoGradGuard no_grad;  // as inside an autograd Function
    EXPECT_TRUE(gemm::takes_onednn(x, w.t()));
  }
}

}  // namespace
}  // namespace lf::testing

// GradBuffer across real processes (Gloo): bucket layout, gradients equal to a plain all-reduce
// of autograd's own gradients (with accumulation over micro-batches), reductions launched from
// the hooks while backward still runs, and ZeRO-1 shard bounds.
#include <gtest/gtest.h>

#include <ATen/core/grad_mode.h>

#include <string>

#include "dp_test_util.h"
#include "loongforge/parallel/data/grad_buffer.h"

namespace {
using namespace lf::testing;
using lf::parallel::GradBuffer;
using lf::parallel::GradBufferOptions;

bool arg_flag(const std::string& name) {
  for (const auto& a : worker_args())
    if (a == name + "=1") return true;
  return false;
}

// Reference: autograd's .grad on hook-free copies, accumulated over two micro-batches, summed
// over DP and divided by dp. Exact equality is expected: the buffer adds the same fp32 values in
// the same order (0 + g1 + g2), and dividing by dp = 2 before the sum is exact.
LF_WORKER_CASE(buckets_match_all_reduce) {
  const bool zero = arg_flag("zero"), overlap = arg_flag("overlap");
  auto tc = make_context(1);
  auto& dp = tc.ctx->dp();
  const int rank = dp.rank(), n = dp.size();
  auto params = chain_params();
  auto plain = chain_params();
  GradBuffer buffer(params, &dp, nullptr,
                    {.bucket_size = 16, .overlap_grad_reduce = overlap, .distributed_optimizer = zero});
  const auto& buckets = buffer.buckets();
  ASSERT_GE(buckets.size(), 3u);
  // Layout: buckets tile the buffer, each parameter in one bucket, reverse order.
  int64_t next = 0;
  int expect_param = static_cast<int>(params.size()) - 1;
  for (const auto& b : buckets) {
    EXPECT_EQ(b.offset, next);
    for (int i : b.params) {
      EXPECT_EQ(i, expect_param--);
      EXPECT_EQ(buffer.slots()[static_cast<size_t>(i)].bucket, &b - buckets.data());
    }
    next = b.offset + b.numel;
    if (zero) {
      EXPECT_EQ(b.numel % n, 0) << "bucket padded to a multiple of dp";
      EXPECT_EQ(b.owned_end - b.owned_begin, b.numel / n);
      EXPECT_EQ(b.owned_begin, b.offset + rank * (b.numel / n));
    } else {
      EXPECT_EQ(b.owned_begin, b.offset);
      EXPECT_EQ(b.owned_end, b.offset + b.numel);
    }
  }
  EXPECT_EQ(next, buffer.main_grad().numel());
  EXPECT_EQ(expect_param, -1);

  for (int step = 0; step < 2; ++step) {  // the second step checks zero_grad's reset
    for (int mb = 0; mb < 2; ++mb) {
      buffer.begin_micro_batch(mb == 1);
      chain_loss(params, rank, mb + step).backward();
      chain_loss(plain, rank, mb + step).backward();
      if (mb == 1 && overlap) {
        // Launched from the hooks: bucket 0 (the last parameters) before the last hook fired.
        EXPECT_GE(buckets[0].launched_after_hooks, 1);
        EXPECT_LT(buckets[0].launched_after_hooks, static_cast<int64_t>(params.size()));
        for (size_t b = 1; b < buckets.size(); ++b)
          EXPECT_GE(buckets[b].launched_after_hooks, buckets[b - 1].launched_after_hooks);
      }
    }
    for (const auto& p : params) EXPECT_FALSE(p.tensor.grad().defined()) << "moved to main grad";
    if (!overlap)
      for (const auto& b : buckets) EXPECT_EQ(b.launched_after_hooks, -1);
    buffer.finish_grad_sync();

    at::Tensor ref = at::zeros_like(buffer.main_grad());
    for (size_t i = 0; i < plain.size(); ++i) {
      const auto& s = buffer.slots()[i];
      ref.narrow(0, s.offset, s.numel).copy_(plain[i].tensor.grad().reshape({-1}));
      plain[i].tensor.mutable_grad() = at::Tensor();
    }
    dp.all_reduce(ref);
    ref.div_(n);
    for (size_t b = 0; b < buckets.size(); ++b) {
      const auto& bk = buckets[b];
      at::Tensor want = ref.narrow(0, bk.owned_begin, bk.owned_end - bk.owned_begin);
      const at::Tensor& got = buffer.reduced_grad(static_cast<int>(b));
      if (n == 2)
        EXPECT_TRUE(at::equal(got, want)) << "bucket " << b << " max diff " << max_abs(got, want);
      else  // dividing by 3 before or after the sum, and Gloo's chunk order, round differently
        EXPECT_TRUE(at::allclose(got, want, 1e-6, 1e-7)) << "bucket " << b << " max diff "
                                                         << max_abs(got, want);
    }
    // Owned pieces cover exactly the owned ranges minus padding; across ranks, every element.
    int64_t owned = 0;
    for (const auto& piece : buffer.owned_pieces()) owned += piece.numel;
    at::Tensor total = at::full({1}, static_cast<double>(owned), at::kDouble);
    dp.all_reduce(total);
    int64_t numel = 0;
    for (const auto& p : params) numel += p.tensor.numel();
    EXPECT_EQ(total.item<double>(), static_cast<double>(zero ? numel : numel * n));
    buffer.zero_grad();
    // A step without any gradient: finish_grad_sync zeroes every slot still holding the last one.
    buffer.begin_micro_batch(true);
    buffer.finish_grad_sync();
    EXPECT_EQ(buffer.main_grad().abs().sum().item<double>(), 0.0);
    buffer.zero_grad();
  }
}

TEST(GradBuffer, AllReduceEqualsPlainAllReduce) {
  expect_all_ok(run_workers("buckets_match_all_reduce", {.world_size = 2}));
}
TEST(GradBuffer, OverlappedAllReduceStartsDuringBackward) {
  expect_all_ok(run_workers("buckets_match_all_reduce", {.world_size = 2, .args = {"overlap=1"}}));
}
TEST(GradBuffer, Zero1ReduceScatterShardsMatchAllReduce) {
  expect_all_ok(
      run_workers("buckets_match_all_reduce", {.world_size = 2, .args = {"zero=1", "overlap=1"}}));
}
TEST(GradBuffer, Zero1OverThreeRanksPadsBuckets) {
  expect_all_ok(run_workers("buckets_match_all_reduce", {.world_size = 3, .args = {"zero=1"}}));
}

// Single process: bf16 parameters accumulate into fp32 main grads across micro-batches.
TEST(GradBuffer, Bf16GradientsAccumulateInFp32) {
  auto params = chain_params(at::kBFloat16);
  GradBuffer buffer(params, nullptr, nullptr, {});
  EXPECT_EQ(buffer.buckets().size(), 1u);
  EXPECT_EQ(buffer.main_grad().scalar_type(), at::kFloat);
  at::Tensor want = at::zeros_like(buffer.main_grad());
  for (int mb = 0; mb < 3; ++mb) {
    buffer.begin_micro_batch(mb == 2);
    auto copy = chain_params(at::kBFloat16);
    chain_loss(copy, 0, mb).backward();
    for (size_t i = 0; i < copy.size(); ++i) {
      const auto& s = buffer.slots()[i];
      want.narrow(0, s.offset, s.numel).add_(copy[i].tensor.grad().reshape({-1}));
    }
    chain_loss(params, 0, mb).backward();
  }
  buffer.finish_grad_sync();
  EXPECT_TRUE(at::equal(buffer.main_grad(), want));
}
}  // namespace

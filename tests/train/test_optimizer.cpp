// The optimizer side of data/tensor parallelism: the global gradient norm under TP with sharded,
// replicated and sequence-parallel parameters (hand-computed), with and without ZeRO-1; AdamW
// under ZeRO-1 equal to the unsharded AdamW; bf16 parameters with fp32 masters; weight decay
// groups.
#include <gtest/gtest.h>

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "dp_test_util.h"
#include "loongforge/backend/registry.h"
#include "loongforge/train/grad_clip.h"
#include "loongforge/train/loss_scaler.h"
#include "loongforge/train/optimizer.h"
#include "loongforge/train/tensorboard.h"

namespace {
using namespace lf::testing;
using lf::parallel::GradBuffer;

// Gradient values of fake parameter `which` as TP rank `tp` sees them.
at::Tensor fake_grad(int which, int tp, int64_t n) {
  return (at::arange(n, at::kFloat) * 0.3 + which + 10 * tp).sin();
}

// World = tp 2 x dp (1 or 2). A: TP-sharded (each TP rank its own half), B: replicated, C:
// replicated but sequence-parallel (each TP rank a partial gradient to be summed).
// norm^2 = |A_0|^2 + |A_1|^2 + |B|^2 + |C_0 + C_1|^2, counted once however many ranks hold them.
LF_WORKER_CASE(clip_under_tp) {
  const bool zero = worker_args().size() > 0 && worker_args()[0] == "zero=1";
  auto tc = make_context(2);
  auto& ctx = *tc.ctx;
  const int tp = ctx.tp_rank();
  std::vector<lf::parallel::Parameter> params(3);
  const int64_t sizes[3] = {6, 5, 3};
  for (int i = 0; i < 3; ++i) {
    params[static_cast<size_t>(i)].name = std::string(1, static_cast<char>('A' + i));
    params[static_cast<size_t>(i)].tensor = at::zeros({sizes[i]}).set_requires_grad(true);
  }
  for (auto& p : params) {
    p.tp_size = 2;
    p.tp_rank = tp;
  }
  params[0].sharding = lf::parallel::Sharding::along(0);
  params[2].sequence_parallel = true;
  lf::backend::Communicator* dp = ctx.dp_size() > 1 ? &ctx.dp() : nullptr;
  GradBuffer buffer(params, dp, &ctx.tp(), {.bucket_size = 4, .distributed_optimizer = zero});
  // Every DP rank holds the same local gradients, so the DP average is those gradients.
  buffer.main_grad(0).copy_(fake_grad(0, tp, 6));
  buffer.main_grad(1).copy_(fake_grad(1, 0, 5));
  buffer.main_grad(2).copy_(fake_grad(2, tp, 3));
  buffer.finish_grad_sync();

  double want = 0;
  for (int r = 0; r < 2; ++r) want += fake_grad(0, r, 6).to(at::kDouble).pow(2).sum().item<double>();
  want += fake_grad(1, 0, 5).to(at::kDouble).pow(2).sum().item<double>();
  at::Tensor c_sum = fake_grad(2, 0, 3) + fake_grad(2, 1, 3);
  want += c_sum.to(at::kDouble).pow(2).sum().item<double>();
  want = std::sqrt(want);
  const double norm = lf::train::global_grad_norm({&buffer}, &ctx.world());
  EXPECT_NEAR(norm, want, 1e-6 * want) << "tp rank " << tp << " dp rank " << ctx.dp_rank();
  if (!zero) EXPECT_TRUE(at::allclose(buffer.main_grad(2), c_sum, 1e-6, 1e-7));

  const double coeff = lf::train::clip_grads({&buffer}, norm, want / 2);
  EXPECT_NEAR(coeff, (want / 2) / (norm + 1e-6), 1e-12);
  const double after = lf::train::global_grad_norm({&buffer}, &ctx.world());
  EXPECT_NEAR(after, want / 2, 1e-5 * want);
  EXPECT_EQ(lf::train::clip_grads({&buffer}, after, want), 1.0) << "below the limit: untouched";
}

TEST(GradClip, GlobalNormUnderTpCountsReplicatedOnce) {
  expect_all_ok(run_workers("clip_under_tp", {.world_size = 2}));
}
TEST(GradClip, GlobalNormUnderTpAndZero1) {
  expect_all_ok(run_workers("clip_under_tp", {.world_size = 4, .args = {"zero=1"}}));
}

lf::config::OptimizerConfig adam_config() {
  lf::config::OptimizerConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  c.clip_grad = 1e-4;  // small enough to clip every step: exercises the shard-wise norm
  return c;
}

// Two copies of the chain, one under ZeRO-1 and one not, over the same DP group: after three
// steps their parameters agree to fp32 rounding (the element-wise update is the same; only the
// norm's summation order differs), and ZeRO-1 keeps 1/dp of the optimizer state.
LF_WORKER_CASE(zero1_equals_adamw) {
  const bool bf16 = worker_args().size() > 0 && worker_args()[0] == "bf16=1";
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  auto tc = make_context(1);
  auto& dp = tc.ctx->dp();
  const auto& backend = lf::backend::cpu_backend();
  auto plain_params = chain_params(dtype), zero_params = chain_params(dtype);
  GradBuffer plain(plain_params, &dp, nullptr, {.bucket_size = 16, .overlap_grad_reduce = true});
  GradBuffer zero(zero_params, &dp, nullptr,
                  {.bucket_size = 16, .overlap_grad_reduce = true, .distributed_optimizer = true});
  lf::train::Optimizer plain_opt({&plain}, adam_config(), backend, &tc.ctx->world()),
      zero_opt({&zero}, adam_config(), backend, &tc.ctx->world());
  // ZeRO-1 holds 1/dp of the moments (fp32: the parameters are the masters on both sides; bf16: also
  // 1/dp of the fp32 masters).
  EXPECT_LT(zero_opt.state_bytes(), plain_opt.state_bytes() * 0.6);
  for (int step = 1; step <= 3; ++step) {
    for (auto* b : {&plain, &zero}) b->begin_micro_batch(true);
    chain_loss(plain_params, dp.rank(), step).backward();
    chain_loss(zero_params, dp.rank(), step).backward();
    plain.finish_grad_sync();
    zero.finish_grad_sync();
    auto a = plain_opt.step(1e-2), b = zero_opt.step(1e-2);
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-6 * a.grad_norm);
    EXPECT_LT(a.clip_coeff, 1.0);
    plain.zero_grad();
    zero.zero_grad();
  }
  for (size_t i = 0; i < plain_params.size(); ++i) {
    const auto& p = plain_params[i].tensor;
    EXPECT_EQ(p.scalar_type(), dtype);
    // fp32: a few ulps of rounding in the clip coefficient. bf16: one bf16 ulp (2^-8 relative)
    // where the fp32 masters straddle a rounding boundary.
    const double tol = bf16 ? 8e-3 : 1e-6;
    EXPECT_LE(max_abs(p, zero_params[i].tensor), tol) << plain_params[i].name;
    EXPECT_GT(max_abs(p, chain_params(dtype)[i].tensor), 0.0) << "it moved";
  }
  if (bf16) {  // the model holds the masters rounded to bf16
    for (const auto& piece : plain.owned_pieces()) {
      at::Tensor m = plain_opt.state(0, "master")[static_cast<size_t>(piece.bucket)].narrow(
          0, piece.reduced_offset, piece.numel);
      at::Tensor p = plain_params[static_cast<size_t>(piece.param)].tensor.detach().reshape({-1})
                         .narrow(0, piece.param_offset, piece.numel);
      EXPECT_TRUE(at::equal(p, m.to(at::kBFloat16)));
    }
  }
}

TEST(DistributedOptimizer, Zero1EqualsAdamWFp32) {
  expect_all_ok(run_workers("zero1_equals_adamw", {.world_size = 2}));
}
TEST(DistributedOptimizer, Zero1EqualsAdamWBf16) {
  expect_all_ok(run_workers("zero1_equals_adamw", {.world_size = 2, .args = {"bf16=1"}}));
}

// Decoupled weight decay on matrices only: with zero gradients and lr 0.1, a matrix shrinks by
// exactly (1 - lr * wd) in fp32 and a vector (norm, bias) stays as it was.
TEST(AdamW, NoWeightDecayOnNormsAndBiases) {
  auto params = chain_params();
  GradBuffer buffer(params, nullptr, nullptr, {});
  auto config = adam_config();
  config.clip_grad = 0;
  lf::train::Optimizer opt({&buffer}, config, lf::backend::cpu_backend());
  buffer.finish_grad_sync();  // all-zero gradients
  auto r = opt.step(0.1);
  EXPECT_EQ(r.grad_norm, 0.0);
  auto before = chain_params();
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor want = params[i].no_weight_decay ? before[i].tensor.detach()
                                                : before[i].tensor.detach() * (1 - 0.1 * 0.1);
    EXPECT_LE(max_abs(params[i].tensor, want), 1e-7) << params[i].name;
  }
}

// fp32 parameters are their own masters: the optimizer moves them into one flat buffer laid out
// as the gradient buffer (same parameter objects, new storage), its master shards are views of
// that buffer, and a second optimizer over the same gradient buffer finds the parameters already
// there and uses the same storage (so either one's update is the model's).
TEST(AdamW, Fp32ParametersAreTheMastersAndStayInPlace) {
  auto params = chain_params();
  const auto values = chain_params();
  GradBuffer buffer(params, nullptr, nullptr, {});
  lf::train::Optimizer first({&buffer}, adam_config(), lf::backend::cpu_backend());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(at::equal(params[i].tensor, values[i].tensor)) << params[i].name << " kept its values";
    EXPECT_EQ(params[i].tensor.storage_offset(), buffer.slots()[i].offset) << params[i].name;
    EXPECT_TRUE(params[i].tensor.storage().is_alias_of(params[0].tensor.storage())) << params[i].name;
  }
  EXPECT_EQ(first.state(0, "master").front().data_ptr(), params[0].tensor.storage().data()) << "masters are views";
  const void* storage = params[0].tensor.storage().data();
  lf::train::Optimizer second({&buffer}, adam_config(), lf::backend::cpu_backend());
  EXPECT_EQ(params[0].tensor.storage().data(), storage) << "not moved again";
  buffer.main_grad(0).fill_(1.0);
  buffer.finish_grad_sync();
  second.step(0.1);
  EXPECT_FALSE(at::equal(params[0].tensor, values[0].tensor)) << "the update reached the model";
  EXPECT_TRUE(at::equal(first.state(0, "master").front().narrow(0, buffer.slots()[0].offset, params[0].tensor.numel())
                            .view(params[0].tensor.sizes()),
                        params[0].tensor))
      << "the first optimizer's masters see it too";
}

TEST(AdamW, NonFiniteNormStopsOrSkips) {
  auto params = chain_params();
  GradBuffer buffer(params, nullptr, nullptr, {});
  lf::train::Optimizer opt({&buffer}, adam_config(), lf::backend::cpu_backend());
  buffer.main_grad(3).fill_(std::nan(""));
  buffer.finish_grad_sync();
  try {
    opt.step(0.1);
    ADD_FAILURE() << "expected an error";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer step 1"), std::string::npos) << e.what();
  }
  auto r = opt.step(0.1, /*skip_nonfinite=*/true);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(opt.steps_taken(), 0);
  EXPECT_TRUE(at::equal(params[0].tensor, chain_params()[0].tensor)) << "nothing updated";
}
}  // namespace

namespace {
// torch.optim.SGD (momentum, L2 weight decay, dampening 0) written out for two steps on one
// parameter: d = g + wd p; buf = d (first step), momentum buf + d after; p -= lr buf.
TEST(Sgd, MatchesTorchSgdWithMomentumAndWeightDecay) {
  lf::parallel::Parameter p;
  p.name = "w";
  p.tensor = at::tensor({1.0f, -2.0f, 0.5f}).set_requires_grad(true);
  GradBuffer buffer({p}, nullptr, nullptr, {});
  lf::config::OptimizerConfig c;
  c.optimizer = "sgd";
  c.lr = 0.1;
  c.weight_decay = 0.01;
  c.sgd_momentum = 0.9;
  c.clip_grad = 0;
  lf::train::Optimizer opt({&buffer}, c, lf::backend::cpu_backend());
  EXPECT_EQ(opt.moment_kinds(), (std::vector<std::string>{"momentum_buffer"}));
  std::vector<double> w = {1.0, -2.0, 0.5}, buf(3, 0.0);
  const std::vector<std::vector<double>> grads = {{0.3, -0.1, 0.2}, {-0.5, 0.4, 0.1}};
  for (int step = 0; step < 2; ++step) {
    buffer.zero_grad();
    buffer.main_grad(0).copy_(at::tensor(std::vector<float>(grads[step].begin(), grads[step].end())));
    buffer.finish_grad_sync();
    opt.step(c.lr);
    for (int i = 0; i < 3; ++i) {
      const double d = grads[step][i] + c.weight_decay * w[i];
      buf[i] = step == 0 ? d : c.sgd_momentum * buf[i] + d;
      w[i] -= c.lr * buf[i];
      EXPECT_NEAR(p.tensor[i].item<double>(), w[i], 1e-6) << "step " << step << " element " << i;
    }
  }
}

// Megatron's DynamicGradScaler: an overflow spends the hysteresis before halving (down to the
// minimum), `window` clean steps double the scale and restore the hysteresis.
TEST(LossScaler, DynamicScaleFollowsHysteresisAndWindow) {
  lf::train::LossScaler s(1024, 256, /*window=*/3, /*hysteresis=*/2, /*dynamic=*/true);
  std::vector<double> seen;
  for (bool inf : {true, true, true, false, false, false, true, true, true, true})
    s.update(inf), seen.push_back(s.scale());
  EXPECT_EQ(seen, (std::vector<double>{1024, 512, 256, 256, 256, 512, 512, 256, 256, 256}));
  auto st = s.state();
  lf::train::LossScaler t(1, 1, 3, 2, true);
  t.set_state(st);
  t.update(false);
  s.update(false);
  EXPECT_EQ(t.scale(), s.scale());
  // Constant: --loss-scale, in any precision; fp16 without it: dynamic from initial_loss_scale.
  lf::config::TrainingConfig tc;
  tc.loss_scale = 128;
  lf::train::LossScaler constant(tc);
  constant.update(true);
  EXPECT_EQ(constant.scale(), 128);
  EXPECT_FALSE(constant.dynamic());
  EXPECT_TRUE(constant.active());
  lf::config::TrainingConfig fp16;
  fp16.fp16 = true;
  EXPECT_TRUE(lf::train::LossScaler(fp16).dynamic());
  EXPECT_EQ(lf::train::LossScaler(fp16).scale(), 4294967296.0);
  EXPECT_FALSE(lf::train::LossScaler(lf::config::TrainingConfig{}).active());
}

TEST(TensorBoard, Crc32cOfTheStandardCheckValue) {
  EXPECT_EQ(lf::train::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(lf::train::crc32c("", 0), 0u);
}
}  // namespace

// The MoE layer under expert parallelism (each of 2 ranks holds half the experts whole) against
// the same layer with every expert on every rank, rank by rank on that rank's own tokens: the
// output, the input's and the router's gradients, and the expert weights' gradients (the
// reference's summed over both ranks' tokens, this rank's experts), for the all-to-all and
// all-gather dispatchers and the overlapped all-to-all (CCT, 2 and 3 chunks). Also with a router
// that sends every token to experts 0 and 1 (a zero router: ties go to the lower index), so rank 1
// receives no rows at all: empty dispatches and experts without tokens must work.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "loongforge/backend/registry.h"
#include "loongforge/models/blocks/moe.h"
#include "multiprocess.h"
#include "tp_testing.h"

namespace {

using lf::models::MoeConfig;
using lf::models::MoeLayer;
using lf::models::ParamBuilder;
using lf::testing::max_abs_diff;

struct Layer {
  MoeLayer layer;
  std::vector<lf::parallel::Parameter> params;
  at::Tensor get(const std::string& suffix) const {
    for (const auto& p : params)
      if (p.name == "mlp." + suffix) return p.tensor;
    ADD_FAILURE() << "no parameter mlp." << suffix;
    return {};
  }
};

Layer build(const MoeConfig& c, const lf::parallel::TensorParallel& tp, bool zero_router) {
  ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(11), at::kFloat, c10::Device(c10::kCPU), tp);
  Layer out;
  out.layer = MoeLayer(b, "mlp", c);
  out.params = b.take();
  if (zero_router) {
    at::NoGradGuard no_grad;
    out.get("router.weight").zero_();
  }
  return out;
}

struct Result {
  at::Tensor out, dx, drouter, dfc1, dfc2;
};

Result run(const Layer& l, const lf::parallel::TensorParallel& tp, const at::Tensor& x, const at::Tensor& g) {
  for (const auto& p : l.params) p.tensor.mutable_grad() = at::Tensor();
  auto xi = x.clone().requires_grad_(true);
  auto y = l.layer.forward(lf::backend::cpu_backend(), tp, xi, /*training=*/true, false, nullptr, 0, 1);
  (y * g).sum().backward();
  return {y.detach(), xi.grad(), l.get("router.weight").grad(), l.get("experts.linear_fc1.weight").grad(),
          l.get("experts.linear_fc2.weight").grad()};
}

LF_WORKER_CASE(ep_moe_layer) {
  const int rank = lf::testing::worker_rank();
  auto ctx = lf::testing::make_context(1);
  auto experts = lf::testing::make_expert_context(1, 2);
  MoeConfig c;
  c.hidden_size = 16;
  c.num_experts = 8;
  c.ffn_hidden_size = 12;
  c.topk = 2;
  c.aux_loss_coeff = 1e-2;  // the auxiliary loss's gradient path too
  c.z_loss_coeff = 1e-3;
  c.init_std = c.out_std = 0.3;
  // This rank's tokens [s, b, h] and output gradient (different on each rank).
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + rank);
  const at::Tensor x = at::normal(0.0, 1.0, {7, 2, 16}, gen, at::kFloat);
  const at::Tensor g = at::normal(0.0, 1.0, {7, 2, 16}, gen, at::kFloat);
  const lf::parallel::TensorParallel none;
  struct Mode {
    const char* name;
    bool allgather;
    int chunks;
  };
  for (bool zero_router : {false, true}) {
    const Layer ref_layer = build(c, none, zero_router);
    const Result ref = run(ref_layer, none, x, g);
    // The expert weights' gradient over both ranks' tokens.
    at::Tensor fc1 = ref.dfc1.clone(), fc2 = ref.dfc2.clone();
    ctx->world().all_reduce(fc1);
    ctx->world().all_reduce(fc2);
    for (const Mode m : {Mode{"all-to-all", false, 0}, Mode{"all-gather", true, 0}, Mode{"overlapped x2", false, 2},
                         Mode{"overlapped x3", false, 3}}) {
      SCOPED_TRACE(std::string(m.name) + (zero_router ? ", every token to experts 0 and 1" : ""));
      lf::parallel::TensorParallel tp;
      tp.ep = &experts->tp();
      tp.ep_allgather = m.allgather;
      tp.ep_overlap_chunks = m.chunks;
      const Layer ep_layer = build(c, tp, zero_router);
      ASSERT_EQ(ep_layer.get("experts.linear_fc1.weight").size(0), 4);
      const Result got = run(ep_layer, tp, x, g);
      // fp32, the same rows through the same GEMMs: a few ulps.
      EXPECT_LE(max_abs_diff(got.out, ref.out), 1e-5);
      EXPECT_LE(max_abs_diff(got.dx, ref.dx), 1e-5);
      EXPECT_LE(max_abs_diff(got.drouter, ref.drouter), 1e-5);
      EXPECT_LE(max_abs_diff(got.dfc1, fc1.narrow(0, 4 * rank, 4)), 1e-5);
      EXPECT_LE(max_abs_diff(got.dfc2, fc2.narrow(0, 4 * rank, 4)), 1e-5);
      if (zero_router && rank == 1) EXPECT_EQ(got.dfc1.abs().max().item<float>(), 0.0f);  // no rows reached it
    }
  }
}

TEST(ExpertParallelMoeLayer, EqualsEveryExpertOnEveryRank) {
  lf::testing::expect_all_ok(lf::testing::run_workers("ep_moe_layer", {.world_size = 2}));
}

}  // namespace

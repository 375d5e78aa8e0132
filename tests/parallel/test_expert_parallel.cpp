// The MoE layer under expert parallelism (each of 2 ranks holds half the experts whole) against
// the same layer with every expert on every rank, rank by rank on that rank's own tokens: the
// output, the input's and the router's gradients, and the expert weights' gradients (the
// reference's summed over both ranks' tokens, this rank's experts), for the all-to-all and
// all-gather dispatchers and the overlapped all-to-all (CCT, 2 and 3 chunks). Also with a router
// that sends every token to experts 0 and 1 (a zero router: ties go to the lower index), so rank 1
// receives no rows at all: empty dispatches and experts without tokens must work. And the
// overlapped dispatcher with --delay-wgrad-compute: the same results, with the backend's grouped
// GEMM backward calls showing every chunk's input gradient before any weight gradient.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "loongforge/backend/device_backend.h"
#include "loongforge/backend/reference_ops.h"
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

// The reference ops, logging each grouped GEMM backward call by what it computes: "dx+dw", "dx", "dw".
struct LoggingOps final : lf::backend::ReferenceOps {
  mutable std::vector<std::string> log;
  lf::backend::GroupedGemmBwd grouped_gemm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                               const at::Tensor& counts, lf::backend::GemmGrads want) const override {
    log.push_back(want.dx && want.dw ? "dx+dw" : want.dx ? "dx" : "dw");
    return ReferenceOps::grouped_gemm_bwd(dy, x, w, counts, want);
  }
};

// The CPU backend with LoggingOps as its op table.
struct LoggingBackend final : lf::backend::DeviceBackend {
  const lf::backend::DeviceBackend& cpu = lf::backend::cpu_backend();
  LoggingOps table;
  const std::string& name() const override { return cpu.name(); }
  c10::Device device() const override { return cpu.device(); }
  bool is_available() const override { return true; }
  int device_count() const override { return cpu.device_count(); }
  void set_device_index(int i) const override { cpu.set_device_index(i); }
  lf::backend::MemoryStats memory_stats() const override { return cpu.memory_stats(); }
  void reset_peak_memory() const override { cpu.reset_peak_memory(); }
  void synchronize() const override { cpu.synchronize(); }
  c10::Stream current_stream() const override { return cpu.current_stream(); }
  c10::Stream new_stream() const override { return cpu.new_stream(); }
  void set_current_stream(const c10::Stream& s) const override { cpu.set_current_stream(s); }
  void stream_wait_event(const c10::Stream& s, const lf::backend::Event& e) const override { cpu.stream_wait_event(s, e); }
  std::unique_ptr<lf::backend::Event> create_event(bool timing) const override { return cpu.create_event(timing); }
  void manual_seed(uint64_t seed) const override { cpu.manual_seed(seed); }
  std::vector<uint8_t> rng_state() const override { return cpu.rng_state(); }
  void set_rng_state(const std::vector<uint8_t>& s) const override { cpu.set_rng_state(s); }
  std::unique_ptr<lf::backend::Communicator> create_communicator(const lf::backend::CommunicatorSpec& spec) const override {
    return cpu.create_communicator(spec);
  }
  const lf::backend::OpTable& ops() const override { return table; }
};

Result run(const Layer& l, const lf::parallel::TensorParallel& tp, const at::Tensor& x, const at::Tensor& g,
           const lf::backend::DeviceBackend& be = lf::backend::cpu_backend()) {
  for (const auto& p : l.params) p.tensor.mutable_grad() = at::Tensor();
  auto xi = x.clone().requires_grad_(true);
  auto y = l.layer.forward(be, tp, xi, /*training=*/true, false, nullptr, 0, 1);
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
    bool delay_wgrad = false;
  };
  for (bool zero_router : {false, true}) {
    const Layer ref_layer = build(c, none, zero_router);
    const Result ref = run(ref_layer, none, x, g);
    // The expert weights' gradient over both ranks' tokens.
    at::Tensor fc1 = ref.dfc1.clone(), fc2 = ref.dfc2.clone();
    ctx->world().all_reduce(fc1);
    ctx->world().all_reduce(fc2);
    Result undelayed;
    for (const Mode m : {Mode{"all-to-all", false, 0}, Mode{"all-gather", true, 0}, Mode{"overlapped x2", false, 2},
                         Mode{"overlapped x3", false, 3}, Mode{"overlapped x3, delayed wgrad", false, 3, true}}) {
      SCOPED_TRACE(std::string(m.name) + (zero_router ? ", every token to experts 0 and 1" : ""));
      lf::parallel::TensorParallel tp;
      tp.ep = &experts->tp();
      tp.ep_allgather = m.allgather;
      tp.ep_overlap_chunks = m.chunks;
      tp.ep_delay_wgrad = m.delay_wgrad;
      const Layer ep_layer = build(c, tp, zero_router);
      ASSERT_EQ(ep_layer.get("experts.linear_fc1.weight").size(0), 4);
      LoggingBackend logging;
      const Result got = run(ep_layer, tp, x, g, logging);
      if (m.chunks > 1) {
        // Per chunk fc2's then fc1's backward; delayed: every chunk's input gradients (each sent
        // before the next chunk's), then the weight gradients of all chunks.
        std::vector<std::string> want;
        for (int k = 0; k < 2 * m.chunks; ++k) want.push_back(m.delay_wgrad ? "dx" : "dx+dw");
        if (m.delay_wgrad)
          for (int k = 0; k < 2 * m.chunks; ++k) want.push_back("dw");
        EXPECT_EQ(logging.table.log, want);
      }
      if (m.chunks == 3 && !m.delay_wgrad) undelayed = got;
      if (m.delay_wgrad)  // the same GEMMs on the same rows, summed in the same order: bit for bit
        for (auto [a, b] : {std::pair{got.dx, undelayed.dx}, {got.dfc1, undelayed.dfc1}, {got.dfc2, undelayed.dfc2}})
          EXPECT_TRUE(at::equal(a, b));
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

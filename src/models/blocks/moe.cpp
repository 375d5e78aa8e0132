#include "loongforge/models/blocks/moe.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include "loongforge/backend/fp8.h"
#include "loongforge/backend/fp8_grouped.h"
#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/models/recompute.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Identity on the layer output whose backward also hands the auxiliary loss its gradient, the
// term's weight this step (Megatron's MoEAuxLossAutoScaler): the loss joins the objective without
// travelling to the last pipeline stage.
struct AttachAuxLoss : torch::autograd::Function<AttachAuxLoss> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& out, const at::Tensor& aux, double weight) {
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["aux_dtype"] = static_cast<int64_t>(aux.scalar_type());
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto dt = static_cast<at::ScalarType>(ctx->saved_data["aux_dtype"].toInt());
    auto daux = at::full({}, ctx->saved_data["weight"].toDouble(), g[0].options().dtype(dt));
    return {g[0], daux, at::Tensor()};
  }
};

// The regrouping of rows received from every expert-parallel rank ([source][local expert] blocks)
// into [local expert][source] order: order[i] is the received row placed at i, inverse its inverse,
// per_expert the rows per local expert (CPU int64).
struct Regroup {
  at::Tensor order, inverse, per_expert;
};

Regroup regroup(const int64_t* got, int64_t ranks, int64_t local, c10::Device device) {
  std::vector<int64_t> start(static_cast<size_t>(ranks * local));
  int64_t at_row = 0;
  for (int64_t src = 0; src < ranks; ++src)
    for (int64_t l = 0; l < local; ++l) start[src * local + l] = at_row, at_row += got[src * local + l];
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(at_row));
  Regroup r;
  r.per_expert = at::zeros({local}, at::TensorOptions().dtype(at::kLong));
  auto* pe = r.per_expert.data_ptr<int64_t>();
  for (int64_t l = 0; l < local; ++l)
    for (int64_t src = 0; src < ranks; ++src) {
      const int64_t n = got[src * local + l], b = start[src * local + l];
      for (int64_t j = 0; j < n; ++j) order.push_back(b + j);
      pe[l] += n;
    }
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  const auto opts = at::TensorOptions().dtype(at::kLong);
  r.order = at::tensor(order, opts).to(device);
  r.inverse = at::tensor(inverse, opts).to(device);
  return r;
}

// What the overlapped dispatch needs besides tensors: the group, the chunks' splits and
// regroupings (filled by forward), how the experts compute.
struct OverlapPlan {
  lf::backend::Communicator* ep = nullptr;
  const lf::backend::DeviceBackend* be = nullptr;
  bool swiglu = true;
  bool recompute = false;    // selective recompute: the activation's output recomputed in backward
  bool delay_wgrad = false;  // --delay-wgrad-compute
  lf::TraceSpans* trace = nullptr;  // --pipeline-trace: spans of the exchanges and the experts
  // The overlap across micro-batches: before each wait for an all-to-all, the other micro-batch's
  // stream (a forward's or a backward's) runs until it waits for one of its own (null: none).
  lf::StreamPair* streams = nullptr;
  std::string layer;                // the spans' prefix ("L<moe layer> ")
  std::vector<int64_t> rows;                      // per chunk: rows this rank sends in all
  std::vector<std::vector<int64_t>> send, recv;  // per chunk: rows to / from each rank
  std::vector<Regroup> groups;                    // per chunk
  // FP8 (null: none): fc1 / fc2 as the policy chooses at each chunk's rows, tensorwise amaxes
  // reduced over amax_group (TP when the experts are split over it); record: delayed scaling
  // records amaxes (training, not evaluation).
  const lf::ops::Fp8Policy* fp8 = nullptr;
  lf::backend::Communicator* amax_group = nullptr;
  bool record = false;
};

// CCT: the all-to-all dispatch of C token chunks overlapped with the experts' computation. Forward
// launches every chunk's dispatch at once (asynchronous), computes chunk c's experts as soon as
// its rows have arrived while the later chunks are in flight, and launches chunk c's combine
// before computing chunk c + 1. Backward mirrors it: the combines' gradients go out for every
// chunk at once, each chunk's expert backward runs as its gradient arrives, and its rows'
// gradient returns while the next chunk computes. The experts' forward and backward are the
// backend's grouped GEMM and activation ops called directly (per chunk: x -> fc1 -> act -> fc2),
// so backward can split each GEMM's gradients: with --delay-wgrad-compute every chunk's input
// gradient is computed and sent first, and the expert weights' gradients of all chunks are
// computed after the last send, while those all-to-alls are in flight (Megatron's delayed wgrad;
// the same values, summed over the chunks in the same order). In FP8 (OverlapPlan::fp8) a chunk's
// fc1 / fc2 are lf::ops::Fp8GroupedGemm's passes, which keep their quantized operands: the input
// and, for fc2, the activation's output are not kept in the training dtype.
struct OverlappedExperts : torch::autograd::Function<OverlappedExperts> {
  static constexpr const char* kCommRow = "MoE all-to-all";
  static constexpr const char* kExpertRow = "MoE experts";
  // Records a span [start, now) of chunk c when the step is traced (an exchange's span ends when
  // its wait returned: launched -> seen complete).
  static void span(const OverlapPlan& plan, const char* what, size_t c, const char* row, double start) {
    if (plan.trace) plan.trace->add(plan.layer + what + " " + std::to_string(c), row, start, lf::TraceSpans::now_us());
  }
  static double now(const OverlapPlan& plan) { return plan.trace ? lf::TraceSpans::now_us() : 0; }
  // Before a wait: the other micro-batch's stream runs while this exchange is in flight.
  static void hand_over(const OverlapPlan& plan) {
    if (plan.streams) plan.streams->yield();
  }

  // all_rows: every chunk's rows one after the other (plan->rows: each chunk's count); returns
  // every chunk's combined rows the same way.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& all_rows, const at::Tensor& fc1,
                            const at::Tensor& fc2, std::shared_ptr<OverlapPlan> plan) {
    auto& ep = *plan->ep;
    const auto& ops = plan->be->ops();
    const variable_list rows = all_rows.split_with_sizes(plan->rows, 0);
    const size_t chunks = rows.size();
    std::vector<at::Tensor> arrived(chunks), back(chunks);
    at::Tensor combined = at::empty_like(all_rows);  // the chunks' results land in their slices
    std::vector<std::shared_ptr<lf::backend::Work>> dispatch(chunks), combine(chunks);
    std::vector<double> sent(chunks), back_sent(chunks);
    // Every chunk's arriving rows in one buffer (one allocation of a size the cache serves again,
    // not one per chunk of sizes that change with the routing every step).
    std::vector<int64_t> arriving(chunks);
    for (size_t c = 0; c < chunks; ++c)
      arriving[c] = std::accumulate(plan->recv[c].begin(), plan->recv[c].end(), int64_t{0});
    const auto arrived_all =
        at::empty({std::accumulate(arriving.begin(), arriving.end(), int64_t{0}), all_rows.size(1)}, all_rows.options());
    for (size_t c = 0; c < chunks; ++c) {
      arrived[c] = arrived_all.narrow(0, offset_of(arriving, c), arriving[c]);
      sent[c] = now(*plan);
      dispatch[c] = ep.all_to_all(arrived[c], rows[c].contiguous(), plan->recv[c], plan->send[c], true);
    }
    variable_list saved;  // per chunk: the experts' input, fc1's output, the activation's (or undefined)
    auto fp8 = c10::make_intrusive<Fp8Chunks>();  // per chunk: fc1's and fc2's FP8 passes, if in FP8
    fp8->fc1.resize(chunks), fp8->fc2.resize(chunks);
    for (size_t c = 0; c < chunks; ++c) {
      hand_over(*plan);
      dispatch[c]->wait();
      span(*plan, "dispatch", c, kCommRow, sent[c]);
      const double computing = now(*plan);
      const Regroup& g = plan->groups[c];
      at::Tensor in = arrived[c].index_select(0, g.order);
      const int64_t m = in.size(0);
      const auto* r1 = plan->fp8 ? plan->fp8->choose(lf::ops::Fp8Gemm::fc1, m) : nullptr;
      const auto* r2 = plan->fp8 ? plan->fp8->choose(lf::ops::Fp8Gemm::fc2, m) : nullptr;
      std::vector<int64_t> counts;
      if (r1 || r2) counts.assign(g.per_expert.data_ptr<int64_t>(), g.per_expert.data_ptr<int64_t>() + g.per_expert.numel());
      at::Tensor h1;
      if (r1) {
        fp8->fc1[c].emplace(in, fc1, counts, *r1, plan->amax_group, plan->record, plan->record);
        h1 = fp8->fc1[c]->take_output();
      } else {
        h1 = ops.grouped_gemm_fwd(in, fc1, g.per_expert);
      }
      at::Tensor a = activation(*plan, h1), y;
      if (r2) {
        fp8->fc2[c].emplace(a, fc2, counts, *r2, plan->amax_group, plan->record, plan->record);
        y = fp8->fc2[c]->take_output();
      } else {
        y = ops.grouped_gemm_fwd(a, fc2, g.per_expert);
      }
      saved.insert(saved.end(), {r1 ? at::Tensor() : in, h1, plan->recompute || r2 ? at::Tensor() : a});
      at::Tensor y_src = y.index_select(0, g.inverse).contiguous();
      span(*plan, "experts", c, kExpertRow, computing);
      back[c] = combined.narrow(0, offset_of(plan->rows, c), plan->rows[c]);
      back_sent[c] = now(*plan);
      combine[c] = ep.all_to_all(back[c], y_src, plan->send[c], plan->recv[c], true);
    }
    for (size_t c = 0; c < chunks; ++c) {
      hand_over(*plan);
      combine[c]->wait();
      span(*plan, "combine", c, kCommRow, back_sent[c]);
    }
    ctx->saved_data["plan"] = c10::IValue::make_capsule(c10::make_intrusive<PlanHolder>(plan));
    ctx->saved_data["chunks"] = saved;
    ctx->saved_data["fp8"] = c10::IValue::make_capsule(fp8);
    ctx->save_for_backward({fc1, fc2});
    return combined;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto plan = static_cast<PlanHolder*>(ctx->saved_data["plan"].toCapsule().get())->plan;
    const auto& ops = plan->be->ops();
    const at::Tensor grad_all = grad_out[0].contiguous();
    const variable_list grads = grad_all.split_with_sizes(plan->rows, 0);
    at::Tensor rows_all = at::empty_like(grad_all);  // the rows' gradients land in their slices
    auto& ep = *plan->ep;
    const auto saved = ctx->saved_data["chunks"].toTensorVector();
    // Holds the capsule while backward runs (its saved_data entry is erased at the end).
    const auto fp8_ref = ctx->saved_data["fp8"].toCapsule();
    const auto& fp8 = *static_cast<Fp8Chunks*>(fp8_ref.get());
    const auto weights = ctx->get_saved_variables();
    const at::Tensor &w1 = weights[0], &w2 = weights[1];
    const bool want_w1 = ctx->needs_input_grad(1), want_w2 = ctx->needs_input_grad(2);
    const size_t chunks = grads.size();
    std::vector<at::Tensor> arrived(chunks), rows_grad(chunks);
    std::vector<std::shared_ptr<lf::backend::Work>> dispatch(chunks), combine(chunks);
    std::vector<double> sent(chunks), back_sent(chunks);
    std::vector<int64_t> arriving(chunks);  // one buffer for every chunk, as in forward
    for (size_t c = 0; c < chunks; ++c) arriving[c] = plan->groups[c].order.size(0);
    const auto arrived_all =
        at::empty({std::accumulate(arriving.begin(), arriving.end(), int64_t{0}), grad_all.size(1)}, grad_all.options());
    for (size_t c = 0; c < chunks; ++c) {  // the combines' gradients back to the experts' ranks
      arrived[c] = arrived_all.narrow(0, offset_of(arriving, c), arriving[c]);
      sent[c] = now(*plan);
      combine[c] = ep.all_to_all(arrived[c], grads[c].contiguous(), plan->recv[c], plan->send[c], true);
    }
    at::Tensor dw1, dw2;
    // Per chunk, for the delayed weight gradients: fc2's output gradient and input, fc1's output
    // gradient; for a GEMM in FP8 under tensorwise or delayed scaling, its output gradient's
    // quantized copy instead (q2, q1).
    std::vector<at::Tensor> gy(chunks), act_out(chunks), dh1(chunks);
    std::vector<std::optional<lf::ops::Fp8GroupedGemm::Grad>> q2(chunks), q1(chunks);
    const lf::backend::GemmGrads now2{true, want_w2 && !plan->delay_wgrad}, now1{true, want_w1 && !plan->delay_wgrad};
    for (size_t c = 0; c < chunks; ++c) {
      hand_over(*plan);
      combine[c]->wait();
      span(*plan, "combine grad", c, kCommRow, sent[c]);
      const double computing = now(*plan);
      const Regroup& g = plan->groups[c];
      const at::Tensor &in = saved[3 * c], &h1 = saved[3 * c + 1];
      gy[c] = arrived[c].index_select(0, g.order);
      // fc2's input: kept, recomputed, or (FP8) its quantized copy inside fc2's pass.
      if (!fp8.fc2[c]) act_out[c] = saved[3 * c + 2].defined() ? saved[3 * c + 2] : activation(*plan, h1);
      const bool later2 = plan->delay_wgrad && want_w2, later1 = plan->delay_wgrad && want_w1;
      auto g2 = gemm_grads(fp8.fc2[c], ops, gy[c], act_out[c], w2, g.per_expert, now2, later2 ? &q2[c] : nullptr);
      if (q2[c]) gy[c] = at::Tensor();  // its quantized copy serves the weight gradient
      dh1[c] = plan->swiglu ? ops.swiglu_bwd(g2.dx, h1) : ops.gelu_bwd(g2.dx, h1);
      auto g1 = gemm_grads(fp8.fc1[c], ops, dh1[c], in, w1, g.per_expert, now1, later1 ? &q1[c] : nullptr);
      if (q1[c]) dh1[c] = at::Tensor();
      if (now2.dw) accumulate(dw2, g2.dw);
      if (now1.dw) accumulate(dw1, g1.dw);
      at::Tensor to_src = g1.dx.index_select(0, g.inverse).contiguous();
      span(*plan, plan->delay_wgrad ? "experts dgrad" : "experts backward", c, kExpertRow, computing);
      rows_grad[c] = rows_all.narrow(0, offset_of(plan->rows, c), plan->rows[c]);
      back_sent[c] = now(*plan);
      dispatch[c] = ep.all_to_all(rows_grad[c], to_src, plan->send[c], plan->recv[c], true);
      if (!plan->delay_wgrad) gy[c] = act_out[c] = dh1[c] = at::Tensor();
    }
    if (plan->delay_wgrad)  // every chunk's input gradient is on its way: the weights' gradients now
      for (size_t c = 0; c < chunks; ++c) {
        const double computing = now(*plan);
        const Regroup& g = plan->groups[c];
        if (want_w2) accumulate(dw2, delayed_dw(fp8.fc2[c], q2[c], ops, gy[c], act_out[c], w2, g.per_expert));
        if (want_w1) accumulate(dw1, delayed_dw(fp8.fc1[c], q1[c], ops, dh1[c], saved[3 * c], w1, g.per_expert));
        q2[c].reset(), q1[c].reset();
        span(*plan, "experts wgrad", c, kExpertRow, computing);
      }
    for (size_t c = 0; c < chunks; ++c) {
      hand_over(*plan);
      dispatch[c]->wait();
      span(*plan, "dispatch grad", c, kCommRow, back_sent[c]);
    }
    // What forward kept goes now, not when the graph is destroyed (backward runs once).
    ctx->saved_data.erase("chunks");
    ctx->saved_data.erase("fp8");
    return {rows_all, dw1, dw2, at::Tensor()};
  }

  // Per chunk: fc1's and fc2's FP8 passes (empty: that GEMM in the training dtype).
  struct Fp8Chunks : torch::CustomClassHolder {
    std::vector<std::optional<lf::ops::Fp8GroupedGemm>> fc1, fc2;
  };
  // One grouped GEMM's gradients from its output gradient dy: its FP8 pass's, or the backend's on
  // its input x (the training dtype). With `later` (the weight gradient delayed) and a recipe
  // whose one quantized copy of dy serves both GEMMs (tensorwise, delayed), that copy is kept
  // there for delayed_dw: dy is quantized once (tensorwise: one amax all-reduce), and the FP8
  // copy, not dy, waits for the weight gradient. Blockwise and MX keep dy (their weight-gradient
  // tiles are another quantization, made in the delayed pass after the sends).
  static lf::backend::GroupedGemmBwd gemm_grads(const std::optional<lf::ops::Fp8GroupedGemm>& f,
                                                const lf::backend::OpTable& ops, const at::Tensor& dy,
                                                const at::Tensor& x, const at::Tensor& w, const at::Tensor& per_expert,
                                                lf::backend::GemmGrads want,
                                                std::optional<lf::ops::Fp8GroupedGemm::Grad>* later = nullptr) {
    if (!f) return ops.grouped_gemm_bwd(dy, x, w, per_expert, want);
    const bool keep = later != nullptr && f->one_grad_copy();
    auto q = f->quantize_grad(dy, want.dx, want.dw || keep);
    auto [dx, dw] = f->backward(q, want.dx, want.dw);
    if (keep) *later = std::move(q);
    // In w's dtype, as the backend's (a chunk's FP8 GEMM gives fp32), so that the chunks' sum does
    // not depend on which chunks ran in FP8.
    return {dx, dw.defined() ? dw.to(w.scalar_type()) : dw};
  }
  // A delayed weight gradient: from the output gradient's kept FP8 copy q, from dy (FP8 without a
  // kept copy), or (training dtype) from dy and x.
  static at::Tensor delayed_dw(const std::optional<lf::ops::Fp8GroupedGemm>& f,
                               const std::optional<lf::ops::Fp8GroupedGemm::Grad>& q, const lf::backend::OpTable& ops,
                               const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                               const at::Tensor& per_expert) {
    if (!f) return ops.grouped_gemm_bwd(dy, x, w, per_expert, {false, true}).dw;
    LF_CHECK(q.has_value() || dy.defined(), "MoE overlap: an FP8 chunk's delayed weight gradient without its output gradient");
    return (q ? f->backward(*q, false, true) : f->backward(dy, false, true)).second.to(w.scalar_type());
  }

  // sum += d, in place after the first chunk (d is the backend's fresh tensor: the first one is kept).
  static void accumulate(at::Tensor& sum, const at::Tensor& d) {
    if (sum.defined())
      sum.add_(d);
    else
      sum = d;
  }
  static at::Tensor activation(const OverlapPlan& plan, const at::Tensor& h1) {
    return plan.swiglu ? plan.be->ops().swiglu_fwd(h1) : plan.be->ops().gelu_fwd(h1);
  }
  static int64_t offset_of(const std::vector<int64_t>& rows, size_t c) {
    return std::accumulate(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(c), int64_t{0});
  }
  struct PlanHolder : torch::CustomClassHolder {
    explicit PlanHolder(std::shared_ptr<OverlapPlan> p) : plan(std::move(p)) {}
    std::shared_ptr<OverlapPlan> plan;
  };
};

// Sum of a statistic (no gradient) over the ranks a sequence's tokens are split over.
at::Tensor sum_over(const at::Tensor& v, lf::backend::Communicator& group) {
  at::Tensor out = v.detach().clone();
  group.all_reduce(out, lf::backend::ReduceOp::sum);
  return out;
}

// A loss term's value: this rank's, or the sum of the parts over `split`.
double total_over(const at::Tensor& term, lf::backend::Communicator* split) {
  at::Tensor v = term.detach().to(at::kDouble).reshape({1});
  if (split) split->all_reduce(v, lf::backend::ReduceOp::sum);
  return v.item<double>();
}

// Indices of the k largest entries per row, ties to the lower expert index (a stable sort), so
// routing never depends on a kernel's tie order.
at::Tensor topk_indices(const at::Tensor& scores, int64_t k) {
  return std::get<1>(at::sort(scores, /*stable=*/true, /*dim=*/-1, /*descending=*/true)).narrow(-1, 0, k).contiguous();
}

}  // namespace

double MoeStep::weight(const std::string& term) const {
  if (!weights_) return 1.0;
  auto it = weights_->find(term);
  LF_CHECK(it != weights_->end(), "MoE auxiliary loss '", term, "' has no weight this step",
           lf::hint("internal: the model's loss_counts() must count it"));
  return it->second;
}

void MoeStep::record(size_t layer, size_t layers, const at::Tensor& counts, const std::map<std::string, double>& losses) {
  if (!load_.defined() || load_.size(0) != static_cast<int64_t>(layers) || load_.size(1) != counts.size(0))
    load_ = at::zeros({static_cast<int64_t>(layers), counts.size(0)}, at::TensorOptions().dtype(at::kFloat));
  load_[static_cast<int64_t>(layer)] += counts.to(at::kCPU).to(at::kFloat);
  for (const auto& [name, v] : losses) sums_[name] += v;
}

void MoeStep::add_losses(const std::map<std::string, double>& losses) {
  for (const auto& [name, v] : losses) sums_[name] += v;
}

at::Tensor attach_aux_loss(const at::Tensor& out, const at::Tensor& aux, double weight) {
  return AttachAuxLoss::apply(out, aux, weight);
}

void MoeStep::clear() {
  if (load_.defined()) load_.zero_();
  for (auto& [name, v] : sums_) v = 0;
}

MoeLayer::MoeLayer(ParamBuilder& b, const std::string& prefix, const MoeConfig& c) : c_(c) {
  const int64_t h = c.hidden_size, e = c.num_experts, f = c.ffn_hidden_size, in = c.swiglu ? 2 * f : f;
  LF_CHECK(e > 0 && c.topk >= 1 && c.topk <= e, "MoE layer ", prefix, ": top-k ", c.topk, " must lie in [1, ",
           e, "] (num_experts)");
  // Under tensor parallelism every rank routes the whole sequence (the router replicated, its
  // gradient partial per rank: each rank backpropagates its experts' shards) and holds every
  // expert's TP shard, split as the dense MLP: fc1's gate and up rows each, fc2's columns.
  router_ = b.add(prefix + ".router.weight", b.normal({e, h}, c.init_std), Sharding::replicated(), false, ParamBuilder::TpGrad::partial);
  if (c.expert_bias) expert_bias_ = b.add_state(prefix + ".router.expert_bias", at::zeros({e}, at::kFloat));
  if (b.tp().ep) {
    // Expert parallelism: this rank holds experts [ep_rank * E / ep, ...), whole (expert TP 1) or
    // their TP shards (expert TP = TP, split within each expert as below).
    ep_size_ = b.tp().ep->size();
    ep_rank_ = b.tp().ep->rank();
    LF_CHECK(e % ep_size_ == 0, "MoE layer ", prefix, ": ", e, " experts do not split over ", ep_size_,
             " expert-parallel ranks", lf::hint("choose --expert-model-parallel-size dividing num_experts"));
    fc1_ = b.add_expert(prefix + ".experts.linear_fc1.weight", b.normal({e, in, h}, c.init_std),
                        Sharding::along(1, c.swiglu ? 2 : 1));
    fc2_ = b.add_expert(prefix + ".experts.linear_fc2.weight", b.normal({e, h, f}, c.out_std), Sharding::along(2));
  } else {
    fc1_ = b.add(prefix + ".experts.linear_fc1.weight", b.normal({e, in, h}, c.init_std),
                 Sharding::along(1, c.swiglu ? 2 : 1), false);
    fc2_ = b.add(prefix + ".experts.linear_fc2.weight", b.normal({e, h, f}, c.out_std), Sharding::along(2), false);
  }
  if (c.shared_ffn_hidden_size > 0) {
    has_shared_ = true;
    shared_ = Mlp(b, prefix + ".shared_experts",
                  MlpConfig{h, c.shared_ffn_hidden_size, c.swiglu, false, c.init_std, c.out_std, 0});
    if (c.shared_gate)
      shared_gate_ = b.add(prefix + ".shared_experts.gate_weight", b.normal({1, h}, c.init_std),
                           Sharding::replicated(), false);
  }
}

MoeLayer::Routing MoeLayer::route(const at::Tensor& x2d) const {
  const int64_t t = x2d.size(0), e = c_.num_experts, k = c_.topk;
  Routing r;
  // The router in fp32 whatever the training dtype (Megatron's --moe-router-dtype fp32); fp64 stays.
  const auto ct = x2d.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  r.logits = at::matmul(x2d.to(ct), router_.to(ct).t());
  const bool sigmoid = c_.score_function == "sigmoid";
  at::Tensor scores = sigmoid ? at::sigmoid(r.logits) : c_.pre_softmax ? at::softmax(r.logits, -1) : r.logits;
  at::Tensor choice = scores.detach();
  if (expert_bias_.defined()) choice = choice + expert_bias_.to(choice.device());
  if (c_.num_groups > 0) {
    const int64_t g = c_.num_groups, per = e / g;
    auto grouped = choice.view({t, g, per});
    auto group_scores = std::get<0>(grouped.topk(k / c_.group_topk, -1)).sum(-1);  // [t, g]
    auto keep = at::zeros({t, g}, at::TensorOptions().dtype(at::kBool).device(choice.device()));
    keep.scatter_(1, topk_indices(group_scores, c_.group_topk), true);
    choice = choice.masked_fill(~keep.unsqueeze(-1).expand({t, g, per}).reshape({t, e}),
                                -std::numeric_limits<float>::infinity());
  }
  r.indices = topk_indices(choice, k);
  at::Tensor picked = scores.gather(1, r.indices);
  if (sigmoid)
    r.probs = k > 1 ? picked / (picked.sum(-1, true) + 1e-20) : picked;
  else
    r.probs = c_.pre_softmax ? picked : at::softmax(picked, -1);
  if (c_.scaling_factor > 0) r.probs = r.probs * c_.scaling_factor;
  if (c_.capacity_factor > 0) {
    // Per expert, keep the first `capacity` slots by routing weight (or by token order).
    const int64_t capacity = static_cast<int64_t>(std::ceil(static_cast<double>(t * k) / e * c_.capacity_factor));
    auto flat = r.indices.reshape({-1}).clone();
    auto weight = r.probs.detach().reshape({-1});
    for (int64_t x = 0; x < e; ++x) {
      auto slots = (flat == x).nonzero().squeeze(1);
      if (slots.size(0) <= capacity) continue;
      at::Tensor order = c_.drop_by_position
                             ? at::arange(slots.size(0), slots.options())
                             : std::get<1>(at::sort(weight.index_select(0, slots), true, 0, true));
      flat.index_fill_(0, slots.index_select(0, order.narrow(0, capacity, slots.size(0) - capacity)), -1);
    }
    r.indices = flat.view({t, k});
  }
  return r;
}

at::Tensor MoeLayer::forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp,
                             const at::Tensor& x, bool training, bool selective_recompute, MoeStep* step,
                             size_t moe_index, size_t moe_layers, const lf::parallel::ContextParallel* cp,
                             const lf::ops::Fp8Policy* fp8) const {
  LF_CHECK(x.dim() == 3, "MoE layer: x must be [s(/tp), b, h], got ", x.sizes());
  // Expert TP = TP: enter the TP region (the whole sequence on every rank; SP: gathered), and under
  // expert parallelism dispatch it among the ranks of the same TP rank. Expert parallelism with
  // expert TP 1: each rank routes its own tokens (under TP its sequence-parallel chunk) and the
  // dispatcher moves them to the ranks holding their experts.
  const bool ep_mode = tp.ep != nullptr;
  const int tps = tp.size();
  const bool enter_tp = tps > 1 && (!ep_mode || tp.ep_split_over_tp);
  // Expert TP 1 under TP: training needs SP (each TP rank its own chunk); without it (generation)
  // the TP ranks route the same tokens and each gets every token's result.
  lf::backend::Communicator* tp_split = ep_mode && !enter_tp && tps > 1 && tp.sequence_parallel ? tp.tp : nullptr;
  // The ranks a sequence's tokens are spread over: TP (expert parallelism under SP), CP, or both.
  // Token counts are summed over all of them; a loss term's reported value over TP only (each CP
  // rank's term is its tokens' part, and the trainer sums the parts over CP).
  const bool cp_on = cp && cp->on();
  LF_CHECK(!cp_on || !tp_split || cp->with_tp, "MoE under context and sequence parallelism needs the TP x CP group");
  lf::backend::Communicator* split = cp_on ? (tp_split ? cp->with_tp : cp->group) : tp_split;
  at::Tensor xf = x;
  if (enter_tp)
    xf = tp.sequence_parallel ? lf::parallel::gather_from_sequence_parallel(x, *tp.tp) : lf::parallel::copy_to_tp(x, *tp.tp);
  const int64_t s = xf.size(0), bsz = xf.size(1), h = xf.size(2), t = s * bsz, e = c_.num_experts, k = c_.topk;
  auto x2d = xf.reshape({t, h});
  Routing r = route(x2d);

  const bool swiglu = c_.swiglu;
  const lf::backend::DeviceBackend* bep = &be;
  auto act = [bep, swiglu](const at::Tensor& a) { return swiglu ? lf::ops::swiglu(*bep, a) : lf::ops::gelu(*bep, a); };
  // This rank's experts on rows grouped by expert (counts: rows per local expert, CPU int64).
  // FP8 (the MLP's fc1 / fc2 choices at this grouped GEMM's rows): the experts' shards are split
  // over TP exactly when the layer enters the TP region, and then their amax is reduced over it.
  lf::backend::Communicator* amax_group = enter_tp ? tp.tp : nullptr;
  auto experts = [&](const at::Tensor& rows, const at::Tensor& counts) {
    const int64_t m = rows.size(0);
    const lf::ops::Fp8Recipe* r1 = fp8 ? fp8->choose(lf::ops::Fp8Gemm::fc1, m) : nullptr;
    const lf::ops::Fp8Recipe* r2 = fp8 ? fp8->choose(lf::ops::Fp8Gemm::fc2, m) : nullptr;
    auto fc1 = r1 ? lf::ops::fp8_grouped_linear(rows, fc1_, counts, *r1, amax_group)
                  : lf::ops::grouped_gemm(be, rows, fc1_, counts);
    at::Tensor a = selective_recompute
                       ? lf::models::recompute([act](const std::vector<at::Tensor>& v) { return act(v[0]); }, {fc1})
                       : act(fc1);
    return r2 ? lf::ops::fp8_grouped_linear(a, fc2_, counts, *r2, amax_group) : lf::ops::grouped_gemm(be, a, fc2_, counts);
  };
  at::Tensor out;  // [t, h]: the routed experts' weighted sum (expert TP = TP: this rank's partial sum)
  if (!ep_mode || ep_size_ == 1) {
    auto perm = lf::ops::moe_permute(be, x2d, r.indices, e);
    out = lf::ops::moe_unpermute(be, experts(perm.rows, perm.tokens_per_expert), perm.position, r.probs);
  } else if (tp.ep_allgather) {
    out = dispatch_allgather(be, *tp.ep, x2d, r, experts);
  } else if (tp.ep_overlap_chunks > 0) {
    out = dispatch_alltoall_overlapped(be, *tp.ep, x2d, r, tp.ep_overlap_chunks, selective_recompute,
                                       tp.ep_delay_wgrad, step ? step->trace() : nullptr,
                                       step ? step->streams() : nullptr, moe_index, fp8, amax_group);
  } else {
    out = dispatch_alltoall(be, *tp.ep, x2d, r, experts);
  }
  // Leave the TP region: the partial sums reduced (SP: and scattered back to the sequence chunks).
  auto finish = [&](at::Tensor routed) {
    routed = routed.view({s, bsz, h});
    if (enter_tp)
      routed = tp.sequence_parallel ? lf::parallel::reduce_scatter_to_sequence_parallel(routed, *tp.tp)
                                    : lf::parallel::reduce_from_tp(routed, *tp.tp);
    if (!has_shared_) return routed;
    // x: this rank's chunk under SP
    at::Tensor shared = shared_.forward(be, tp, x, selective_recompute, nullptr, nullptr, nullptr, fp8);
    if (shared_gate_.defined()) shared = shared * at::sigmoid(at::matmul(x, shared_gate_.t()));
    return routed + shared;
  };

  // Auxiliary losses and statistics, only for a pass whose graph is backpropagated.
  const bool counted = training && at::GradMode::is_enabled();
  if (!counted) return finish(out);
  std::map<std::string, double> values;
  at::Tensor aux;
  if (c_.load_balancing != "none" && c_.aux_loss_coeff > 0) {
    // Megatron's formulation: scores over every expert (softmax, or sigmoid normalised per token)
    // and the plain top-k routing of those scores (no bias, no group limit, no capacity).
    at::Tensor full = c_.score_function == "sigmoid"
                          ? [&] { auto sg = at::sigmoid(r.logits); return sg / (sg.sum(-1, true) + 1e-20); }()
                          : at::softmax(r.logits, -1);
    auto routed = at::zeros({t, e}, full.options()).scatter_(1, topk_indices(full.detach(), k), 1.0);
    // Tokens split over TP (expert parallelism under SP) or CP: the token counts are summed over
    // the split first, so that each rank's term covers its tokens' probabilities and the terms add
    // up to the loss of the whole sequence.
    const double parts = split ? split->size() : 1;
    if (c_.load_balancing == "aux_loss") {
      // coeff * E / (k T^2) * sum_e tokens_e * sum_t p_te
      at::Tensor counts = routed.sum(0);
      if (split) counts = sum_over(counts, *split);
      const double tt = static_cast<double>(t) * parts;
      aux = c_.aux_loss_coeff * e / (static_cast<double>(k) * tt * tt) * (counts * full.sum(0)).sum();
    } else {  // seq_aux_loss: per sequence (tokens are [s, b] row-major), then the mean over sequences
      const double ss = static_cast<double>(s) * parts;
      at::Tensor counts = routed.view({s, bsz, e}).sum(0);
      if (split) counts = sum_over(counts, *split);
      counts = counts * (static_cast<double>(e) / (ss * k));
      aux = c_.aux_loss_coeff * (counts * (full.view({s, bsz, e}).sum(0) / ss)).sum(1).mean();
    }
    values[MoeStep::kLoadBalancingLoss] = total_over(aux, tp_split);
    // Expert TP = TP: every TP rank computes the same loss from the whole sequence; each takes
    // 1/tp of its gradient so that the TP sums of the router's and the input's gradients count it
    // once. Split tokens: each rank's term is its own part.
    const double w = (step ? step->weight(MoeStep::kLoadBalancingLoss) : 1.0) / (enter_tp ? tps : 1);
    out = AttachAuxLoss::apply(out, aux, w);
  }
  if (c_.z_loss_coeff > 0) {
    const double tt = static_cast<double>(t) * (split ? split->size() : 1);
    auto z = c_.z_loss_coeff * at::logsumexp(r.logits, -1).square().sum() / tt;
    values[MoeStep::kZLoss] = total_over(z, tp_split);
    const double w = (step ? step->weight(MoeStep::kZLoss) : 1.0) / (enter_tp ? tps : 1);
    out = AttachAuxLoss::apply(out, z, w);
  }
  if (step) {
    // Tokens per expert (kept slots) of the sequence.
    auto kept = r.indices.reshape({-1});
    at::Tensor load = at::bincount(kept.masked_select(kept.ge(0)).cpu(), {}, e).to(at::kFloat);
    if (split) load = sum_over(load.to(x.device()), *split).cpu();
    step->record(moe_index, moe_layers, load, values);
  }
  return finish(out);
}

// The all-gather dispatcher (Megatron's MoEAllGatherTokenDispatcher): every rank of the
// expert-parallel group gathers all the group's tokens and routing, computes its own experts' rows
// (the other slots dropped), and the weighted sums are reduce-scattered back to the tokens' ranks.
// Gradients: the gathers' backward sums each token's gradient over the group.
at::Tensor MoeLayer::dispatch_allgather(const lf::backend::DeviceBackend& be, lf::backend::Communicator& ep,
                                        const at::Tensor& x2d, const Routing& r, const ExpertFn& experts) const {
  const int64_t local = c_.num_experts / ep_size_, first = ep_rank_ * local;
  at::Tensor xg = lf::parallel::gather_from_sequence_parallel(x2d, ep);
  at::Tensor probs = lf::parallel::gather_from_sequence_parallel(r.probs, ep);
  at::Tensor idx = at::empty({r.indices.size(0) * ep_size_, r.indices.size(1)}, r.indices.options());
  ep.all_gather(idx, r.indices.contiguous());
  const auto mine = idx.ge(first).logical_and(idx.lt(first + local));
  at::Tensor local_idx = at::where(mine, idx - first, at::full({}, -1, idx.options()));
  auto perm = lf::ops::moe_permute(be, xg, local_idx, local);
  at::Tensor out = lf::ops::moe_unpermute(be, experts(perm.rows, perm.tokens_per_expert), perm.position, probs);
  return lf::parallel::reduce_scatter_to_sequence_parallel(out, ep);
}

// The all-to-all dispatcher (Megatron's MoEAlltoAllTokenDispatcher): the tokens' rows permuted by
// expert go to the ranks holding those experts with uneven splits (the counts exchanged first),
// are regrouped there by local expert, computed, and return the same way; the weighted sum is
// taken on the tokens' own rank. Every step moves rows only: gradients take the reverse path.
at::Tensor MoeLayer::dispatch_alltoall(const lf::backend::DeviceBackend& be, lf::backend::Communicator& ep,
                                       const at::Tensor& x2d, const Routing& r, const ExpertFn& experts) const {
  const int64_t e = c_.num_experts, local = e / ep_size_, ranks = ep_size_;
  auto perm = lf::ops::moe_permute(be, x2d, r.indices, e);
  // counts[d][l]: rows this rank sends to rank d's local expert l; got[src][l]: rows it receives.
  at::Tensor counts = perm.tokens_per_expert.to(at::kLong).cpu().contiguous();
  at::Tensor got = at::empty_like(counts);
  {
    at::Tensor c = counts.to(x2d.device()), g = at::empty_like(c);
    ep.all_to_all(g, c, {}, {});
    got = g.cpu().contiguous();
  }
  const int64_t* cs = counts.data_ptr<int64_t>();
  const int64_t* gs = got.data_ptr<int64_t>();
  std::vector<int64_t> send(static_cast<size_t>(ranks), 0), recv(static_cast<size_t>(ranks), 0);
  for (int64_t d = 0; d < ranks; ++d)
    for (int64_t l = 0; l < local; ++l) send[d] += cs[d * local + l], recv[d] += gs[d * local + l];
  at::Tensor rows = lf::parallel::all_to_all_rows(perm.rows, ep, recv, send);
  // Received: [source][local expert][rows]; regroup as [local expert][source][rows].
  const Regroup g = regroup(gs, ranks, local, x2d.device());
  at::Tensor y = experts(rows.index_select(0, g.order), g.per_expert).index_select(0, g.inverse);
  at::Tensor back = lf::parallel::all_to_all_rows(y, ep, send, recv);
  return lf::ops::moe_unpermute(be, back, perm.position, r.probs);
}

// The all-to-all dispatcher with the communication overlapped (CCT, --overlap-moe-expert-parallel-comm):
// the tokens in `chunks` contiguous chunks, each permuted by expert on its own; one exchange of
// every chunk's counts, then OverlappedExperts moves and computes the chunks in a pipeline.
at::Tensor MoeLayer::dispatch_alltoall_overlapped(const lf::backend::DeviceBackend& be, lf::backend::Communicator& ep,
                                                  const at::Tensor& x2d, const Routing& r, int chunks,
                                                  bool selective_recompute, bool delay_wgrad,
                                                  lf::TraceSpans* trace, lf::StreamPair* streams,
                                                  size_t moe_index, const lf::ops::Fp8Policy* fp8,
                                                  lf::backend::Communicator* amax_group) const {
  const int64_t e = c_.num_experts, local = e / ep_size_, ranks = ep_size_, t = x2d.size(0);
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>(chunks, t));
  // One permutation for every chunk: token j of chunk c goes to "expert" c * E + its expert, so the
  // rows come out chunk by chunk, each chunk grouped by expert (no per-chunk copies).
  at::Tensor chunk_of = at::empty({t}, r.indices.options());
  for (int64_t c = 0; c < n; ++c) chunk_of.narrow(0, t * c / n, t * (c + 1) / n - t * c / n).fill_(c);
  at::Tensor idx = at::where(r.indices.ge(0), r.indices + chunk_of.unsqueeze(1) * e, r.indices);
  auto perm = lf::ops::moe_permute(be, x2d, idx, n * e);
  // counts[dest][chunk][l]: rows of chunk c for rank dest's local expert l; got[source][chunk][l].
  at::Tensor counts = perm.tokens_per_expert.to(at::kLong).cpu().view({n, ranks, local}).permute({1, 0, 2}).contiguous();
  at::Tensor got;
  {
    at::Tensor cd = counts.to(x2d.device()), gd = at::empty_like(cd);
    auto work = ep.all_to_all(gd, cd, {}, {}, true);
    if (streams) streams->yield();  // the overlap across micro-batches: the other stream runs meanwhile
    work->wait();
    got = gd.cpu().contiguous();
  }
  auto plan = std::make_shared<OverlapPlan>();
  plan->ep = &ep;
  plan->be = &be;
  plan->swiglu = c_.swiglu;
  plan->recompute = selective_recompute;
  plan->delay_wgrad = delay_wgrad;
  plan->trace = trace;
  plan->streams = streams;
  plan->fp8 = fp8;
  plan->amax_group = amax_group;
  plan->record = at::GradMode::is_enabled();  // (OverlappedExperts::forward runs without grad mode)
  if (trace) plan->layer = "L" + std::to_string(moe_index) + " ";
  const int64_t* cs = counts.data_ptr<int64_t>();
  const int64_t* gs = got.data_ptr<int64_t>();
  for (int64_t c = 0; c < n; ++c) {
    std::vector<int64_t> send(static_cast<size_t>(ranks), 0), recv(static_cast<size_t>(ranks), 0),
        mine(static_cast<size_t>(ranks * local));
    int64_t rows = 0;
    for (int64_t d = 0; d < ranks; ++d)
      for (int64_t l = 0; l < local; ++l) {
        send[d] += cs[(d * n + c) * local + l];
        recv[d] += gs[(d * n + c) * local + l];
        mine[d * local + l] = gs[(d * n + c) * local + l];
      }
    for (int64_t v : send) rows += v;
    plan->send.push_back(send);
    plan->recv.push_back(recv);
    plan->rows.push_back(rows);
    plan->groups.push_back(regroup(mine.data(), ranks, local, x2d.device()));
  }
  at::Tensor back = OverlappedExperts::apply(perm.rows, fc1_, fc2_, plan);
  return lf::ops::moe_unpermute(be, back, perm.position, r.probs);
}

void MoeLayer::update_expert_bias(const at::Tensor& load) const {
  if (!expert_bias_.defined()) return;
  at::NoGradGuard no_grad;
  auto l = load.to(expert_bias_.device()).to(at::kFloat);
  expert_bias_.add_(at::sign(l.mean() - l) * c_.bias_update_rate);
}

}  // namespace lf::models

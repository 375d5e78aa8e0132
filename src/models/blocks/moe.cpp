#include "loongforge/models/blocks/moe.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

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
  router_ = b.add(prefix + ".router.weight", b.normal({e, h}, c.init_std), Sharding::replicated(), false, true);
  if (c.expert_bias) expert_bias_ = b.add_state(prefix + ".router.expert_bias", at::zeros({e}, at::kFloat));
  fc1_ = b.add(prefix + ".experts.linear_fc1.weight", b.normal({e, in, h}, c.init_std),
               Sharding::along(1, c.swiglu ? 2 : 1), false);
  fc2_ = b.add(prefix + ".experts.linear_fc2.weight", b.normal({e, h, f}, c.out_std), Sharding::along(2), false);
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
                             size_t moe_index, size_t moe_layers) const {
  LF_CHECK(x.dim() == 3, "MoE layer: x must be [s(/tp), b, h], got ", x.sizes());
  // Enter the TP region: the whole sequence on every rank (SP: gathered).
  const int tps = tp.size();
  at::Tensor xf = x;
  if (tps > 1)
    xf = tp.sequence_parallel ? lf::parallel::gather_from_sequence_parallel(x, *tp.tp) : lf::parallel::copy_to_tp(x, *tp.tp);
  const int64_t s = xf.size(0), bsz = xf.size(1), h = xf.size(2), t = s * bsz, e = c_.num_experts, k = c_.topk;
  auto x2d = xf.reshape({t, h});
  Routing r = route(x2d);

  auto perm = lf::ops::moe_permute(be, x2d, r.indices, e);
  auto fc1 = lf::ops::grouped_gemm(be, perm.rows, fc1_, perm.tokens_per_expert);
  const bool swiglu = c_.swiglu;
  const lf::backend::DeviceBackend* bep = &be;
  auto act = [bep, swiglu](const at::Tensor& a) { return swiglu ? lf::ops::swiglu(*bep, a) : lf::ops::gelu(*bep, a); };
  at::Tensor a = selective_recompute
                     ? lf::models::recompute([act](const std::vector<at::Tensor>& v) { return act(v[0]); }, {fc1})
                     : act(fc1);
  auto y = lf::ops::grouped_gemm(be, a, fc2_, perm.tokens_per_expert);
  at::Tensor out = lf::ops::moe_unpermute(be, y, perm.position, r.probs);  // [t, h], this rank's partial sum
  // Leave the TP region: the partial sums reduced (SP: and scattered back to the sequence chunks).
  auto finish = [&](at::Tensor routed) {
    routed = routed.view({s, bsz, h});
    if (tps > 1)
      routed = tp.sequence_parallel ? lf::parallel::reduce_scatter_to_sequence_parallel(routed, *tp.tp)
                                    : lf::parallel::reduce_from_tp(routed, *tp.tp);
    if (!has_shared_) return routed;
    at::Tensor shared = shared_.forward(be, tp, x, selective_recompute);  // x: this rank's chunk under SP
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
    if (c_.load_balancing == "aux_loss") {
      // coeff * E / (k T^2) * sum_e tokens_e * sum_t p_te
      aux = c_.aux_loss_coeff * e / (static_cast<double>(k) * t * t) * (routed.sum(0) * full.sum(0)).sum();
    } else {  // seq_aux_loss: per sequence (tokens are [s, b] row-major), then the mean over sequences
      auto counts = routed.view({s, bsz, e}).sum(0) * (static_cast<double>(e) / (static_cast<double>(s) * k));
      aux = c_.aux_loss_coeff * (counts * full.view({s, bsz, e}).mean(0)).sum(1).mean();
    }
    values[MoeStep::kLoadBalancingLoss] = aux.detach().item<double>();
    // Every TP rank computes the same loss from the whole sequence; each takes 1/tp of its
    // gradient so that the TP sums of the router's and the input's gradients count it once.
    const double w = (step ? step->weight(MoeStep::kLoadBalancingLoss) : 1.0) / tps;
    out = AttachAuxLoss::apply(out, aux, w);
  }
  if (c_.z_loss_coeff > 0) {
    auto z = c_.z_loss_coeff * at::logsumexp(r.logits, -1).square().mean();
    values[MoeStep::kZLoss] = z.detach().item<double>();
    const double w = (step ? step->weight(MoeStep::kZLoss) : 1.0) / tps;
    out = AttachAuxLoss::apply(out, z, w);
  }
  if (step) step->record(moe_index, moe_layers, perm.tokens_per_expert.to(at::kFloat), values);
  return finish(out);
}

void MoeLayer::update_expert_bias(const at::Tensor& load) const {
  if (!expert_bias_.defined()) return;
  at::NoGradGuard no_grad;
  auto l = load.to(expert_bias_.device()).to(at::kFloat);
  expert_bias_.add_(at::sign(l.mean() - l) * c_.bias_update_rate);
}

}  // namespace lf::models

// The mixture-of-experts MLP (Megatron's MoELayer; Qwen3-MoE, DeepSeek-V2/V3, Mixtral): a router
// (softmax or sigmoid scores, top-k, DeepSeek's group-limited routing, the routed scaling factor,
// the aux-loss-free expert bias), the routed experts as two grouped GEMMs over the tokens permuted
// by expert (backend ops moe_permute / grouped_gemm / moe_unpermute), optional shared experts
// (Qwen2-MoE's sigmoid gate optional), an optional capacity limit (dropless by default), and the
// router's auxiliary losses: load balancing per batch (Switch) or per sequence (DeepSeek), and the
// z-loss. Auxiliary losses do not travel with the activations: their gradient enters at the
// layer's output in backward (scaled by the weight the trainer gives the term this step) and their
// values are summed in the MoeStep the layer context carries. Under tensor parallelism every rank
// routes the whole sequence and holds each expert's TP shard (split as the dense MLP: expert TP =
// TP); the routed output's partial sums are reduced like a row-parallel layer's. Under expert
// parallelism (TensorParallel::ep set: expert TP 1) each rank holds num_experts / ep experts whole
// and routes its own tokens (under TP its sequence-parallel chunk); an all-gather or all-to-all
// dispatcher brings the tokens to their experts and the results back.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/core/stream_pair.h"
#include "loongforge/core/trace_spans.h"
#include "loongforge/models/blocks/mlp.h"
#include "loongforge/models/blocks/param_builder.h"
#include "loongforge/parallel/context/context_parallel.h"

namespace lf::models {

struct MoeConfig {
  int64_t hidden_size = 0;
  int64_t num_experts = 0;
  int64_t ffn_hidden_size = 0;  // per routed expert
  int64_t topk = 2;
  bool swiglu = true;
  // Router scores. softmax: pre_softmax false takes the top-k logits and softmaxes them (weights
  // sum to 1), true softmaxes every logit and takes the top k (unnormalised). sigmoid: top-k of
  // sigmoid(logits), normalised to sum 1 when k > 1 (DeepSeek-V3).
  std::string score_function = "softmax";
  bool pre_softmax = false;
  int64_t num_groups = 0;     // group-limited routing: experts in num_groups groups, tokens pick
  int64_t group_topk = 0;     // group_topk groups by the sum of their top (topk / group_topk) scores
  double scaling_factor = 0;  // multiplies the routing weights (0: none)
  std::string load_balancing = "aux_loss";  // aux_loss | seq_aux_loss | none
  double aux_loss_coeff = 0;
  double z_loss_coeff = 0;
  bool expert_bias = false;   // aux-loss-free balancing: a per-expert bias added for selection only
  double bias_update_rate = 1e-3;
  int64_t shared_ffn_hidden_size = 0;  // 0: no shared experts
  bool shared_gate = false;            // sigmoid(x . gate) scales the shared experts' output
  double capacity_factor = 0;          // 0: dropless; else per-expert capacity ceil(T k / E * factor)
  bool drop_by_position = false;       // over capacity: drop the latest tokens (else the lowest weights)
  double init_std = 0.02, out_std = 0.02;
};

// One training step's routing statistics of this rank's MoE layers and the weights of the
// auxiliary losses (owned by the model, passed in through the layer context). Filled only by
// training passes whose graph is backpropagated (grad mode on), so a fully recomputed layer counts
// once.
class MoeStep {
 public:
  static constexpr const char* kLoadBalancingLoss = "load balancing loss";
  static constexpr const char* kZLoss = "z loss";
  // DSA's indexer KL loss (DeepSeek-V3.2; blocks/mla.h): recorded here too, as a layer's loss term.
  static constexpr const char* kIndexerLoss = "indexer loss";

  // The gradient weight of an auxiliary loss term this step (1 when none was set: a plain
  // backward of one micro-batch's loss).
  double weight(const std::string& term) const;
  void set_weights(const std::map<std::string, double>* w) { weights_ = w; }

  // Adds one forward's values: counts [E] fp32 tokens per expert of MoE layer `layer` (the
  // model's local MoE layer index, of `layers`), and the auxiliary losses' values.
  void record(size_t layer, size_t layers, const at::Tensor& counts, const std::map<std::string, double>& losses);
  // Adds loss values only (layers other than MoE's: DSA's indexer loss).
  void add_losses(const std::map<std::string, double>& losses);
  // [layers, E] fp32 on the CPU: the step's tokens per expert (undefined before any record).
  const at::Tensor& load() const { return load_; }
  const std::map<std::string, double>& loss_sums() const { return sums_; }
  void clear();
  // Where the overlapped all-to-all dispatcher records its spans (--pipeline-trace; null: nowhere).
  void set_trace(lf::TraceSpans* spans) { trace_ = spans; }
  lf::TraceSpans* trace() const { return trace_; }
  // The streams of the overlap across micro-batches (the trainer's, during a paired forward and
  // backward; null otherwise): the overlapped dispatcher yields to the other stream before it
  // waits for an all-to-all.
  void set_streams(lf::StreamPair* streams) { streams_ = streams; }
  lf::StreamPair* streams() const { return streams_; }

 private:
  const std::map<std::string, double>* weights_ = nullptr;
  lf::TraceSpans* trace_ = nullptr;
  lf::StreamPair* streams_ = nullptr;
  at::Tensor load_;
  std::map<std::string, double> sums_;
};

// Identity on a layer output `out` whose backward also hands `aux` (a scalar loss) the gradient
// `weight` (Megatron's MoEAuxLossAutoScaler): the loss joins the objective where it is computed.
at::Tensor attach_aux_loss(const at::Tensor& out, const at::Tensor& aux, double weight);

class MoeLayer {
 public:
  MoeLayer() = default;
  // Registers, in this order: prefix.router.weight [E, h] (replicated), prefix.router.expert_bias
  // [E] (expert_bias; model state, not trained: ParamBuilder::add_state),
  // prefix.experts.linear_fc1.weight [E, 2 f, h] ([gate; up] per expert; GELU: [E, f, h]),
  // prefix.experts.linear_fc2.weight [E, h, f], then the shared experts as an Mlp under
  // prefix.shared_experts (+ prefix.shared_experts.gate_weight [1, h]).
  MoeLayer(ParamBuilder& b, const std::string& prefix, const MoeConfig& c);
  // x: [s(/tp), b, h] -> [s(/tp), b, h]. moe_index: this layer's index among the rank's MoE layers (of
  // moe_layers) in `step`; step may be null (no statistics, auxiliary-loss weight 1). cp (on): x
  // holds this rank's tokens of sequences split over the context-parallel group; the load-balancing
  // statistics are the whole sequences' and each rank's loss term is its tokens' part. fp8: the
  // routed experts' fc1 / fc2 grouped GEMMs and the shared experts' linear layers in FP8 where it
  // chooses (by the GEMM's rows on this rank; the overlapped all-to-all: by each chunk's rows).
  at::Tensor forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp, const at::Tensor& x,
                     bool training, bool selective_recompute, MoeStep* step, size_t moe_index, size_t moe_layers,
                     const lf::parallel::ContextParallel* cp = nullptr, const lf::ops::Fp8Policy* fp8 = nullptr) const;

  // The router alone on [T, h] rows (tests, tools): the chosen experts [T, k] int64 (-1: dropped
  // by the capacity limit) and their weights [T, k] fp32.
  struct Routing {
    at::Tensor logits;   // [T, E] fp32
    at::Tensor indices;  // [T, k]
    at::Tensor probs;    // [T, k]
  };
  Routing route(const at::Tensor& x2d) const;

  // The aux-loss-free update: bias += rate * sign(mean load - load) for a layer's global load [E].
  void update_expert_bias(const at::Tensor& load) const;
  const MoeConfig& config() const { return c_; }

 private:
  using ExpertFn = std::function<at::Tensor(const at::Tensor& rows, const at::Tensor& counts)>;
  at::Tensor dispatch_allgather(const lf::backend::DeviceBackend& be, lf::backend::Communicator& ep,
                                const at::Tensor& x2d, const Routing& r, const ExpertFn& experts) const;
  at::Tensor dispatch_alltoall(const lf::backend::DeviceBackend& be, lf::backend::Communicator& ep,
                               const at::Tensor& x2d, const Routing& r, const ExpertFn& experts) const;
  at::Tensor dispatch_alltoall_overlapped(const lf::backend::DeviceBackend& be, lf::backend::Communicator& ep,
                                          const at::Tensor& x2d, const Routing& r, int chunks,
                                          bool selective_recompute, bool delay_wgrad, lf::TraceSpans* trace,
                                          lf::StreamPair* streams, size_t moe_index, const lf::ops::Fp8Policy* fp8,
                                          lf::backend::Communicator* amax_group) const;

  MoeConfig c_;
  int ep_size_ = 1, ep_rank_ = 0;  // expert parallelism: this rank holds experts [rank, rank + 1) * E / size
  at::Tensor router_, expert_bias_, fc1_, fc2_, shared_gate_;
  Mlp shared_;
  bool has_shared_ = false;
};

}  // namespace lf::models

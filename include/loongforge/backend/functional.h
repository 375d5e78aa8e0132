// Autograd entry points for the fused ops: each is a torch::autograd::Function whose forward
// calls the backend's *_fwd and whose backward calls its *_bwd, so models written against these
// run unchanged on cpu, cuda and xpu. Not the op math (backend/op_table.h; backends/cpu is the
// reference). The backend must outlive the autograd graphs built with it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "loongforge/backend/device_backend.h"

namespace lf::ops {

using lf::backend::AttentionMask;
using lf::backend::DeviceBackend;

// x: [.., h], w: [h] -> [.., h]
at::Tensor rms_norm(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& w,
                    double eps);
// x: [.., h], w: [h], b: [h] or undefined -> [.., h]
at::Tensor layer_norm(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& w,
                      const at::Tensor& b, double eps);
// x: [s, b, n, d], cos/sin: [s, r] (constants: no gradient flows to them) -> [s, b, n, d]
at::Tensor rope(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& cos,
                const at::Tensor& sin, bool interleaved = false);
// gate_up: [.., 2f] -> [.., f]
at::Tensor swiglu(const DeviceBackend& be, const at::Tensor& gate_up);
// x: [..] -> gelu(x), erf form
at::Tensor gelu(const DeviceBackend& be, const at::Tensor& x);
// x: [..] -> gelu(x), tanh form (torch's approximate='tanh')
at::Tensor gelu_tanh(const DeviceBackend& be, const at::Tensor& x);
// gate, up: [..] of one shape -> gelu_tanh(gate) * up (GeGLU)
at::Tensor geglu_tanh(const DeviceBackend& be, const at::Tensor& gate, const at::Tensor& up);
// logits: [n, v], target: [n] -> per-token loss [n] fp32 (0 at ignore_index; reduce it yourself)
at::Tensor softmax_cross_entropy(const DeviceBackend& be, const at::Tensor& logits,
                                 const at::Tensor& target, int64_t ignore_index = -100);
// The output layer and the cross entropy in one op, never holding [n, v] logits (the backend
// chunks them): x [n, h], w [v_local, h], target [n], weight [n] fp32 -> the scalar
// sum_i weight_i loss_i (fp32), with gradients to x and w. Under tensor parallelism `shard` names
// this rank's vocabulary rows and reduces over the ranks; x's gradient is then this rank's share
// (enter the TP region with copy_to_tp / gather_from_sequence_parallel before calling).
//
// With `into` (gradient-accumulation fusion, the trainer's gradient buffer slot): w's gradient is
// written (or added) into into->dw during the forward, already multiplied by the weight the loss
// sum will get (into->scale), so it never exists as a tensor of its own; backward checks that the
// loss sum's incoming gradient is that weight (a mismatch is an error, not a wrong gradient) and
// returns no gradient for w (w's post-accumulate-grad hook still fires, with none).
at::Tensor linear_cross_entropy_sum(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& w,
                                    const at::Tensor& target, const at::Tensor& weight,
                                    const lf::backend::VocabShard& shard = {}, int64_t ignore_index = -100,
                                    int64_t chunk_tokens = 0, const lf::backend::GradInto* into = nullptr);
// Gradient-accumulation fusion for linear layers (Megatron's): where a layer's backward writes its
// weight's gradient instead of handing it to autograd. weight_grad_slot(w) is asked during the
// backward, when the gradient (fp32) is about to be computed: the destination (GradInto::dw, w's
// shape, fp32, contiguous) and whether it already holds gradient this step (accumulate: added
// to) or not (written); nullopt: the gradient goes to autograd as usual. Asking marks the slot as
// written, so ask only to write.
class WeightGradSlots {
 public:
  virtual ~WeightGradSlots() = default;
  virtual std::optional<lf::backend::GradInto> weight_grad_slot(const at::Tensor& w) const = 0;
};
// A linear layer's weight gradient d2^T x2 (d2 [n, out], x2 [n, in]): written into (or, when it
// holds gradient already, added onto) the slot slots->weight_grad_slot(w) names when d2 and x2 are
// fp32 and there is a slot (returns undefined); else returned.
at::Tensor linear_weight_grad(const WeightGradSlots* slots, const at::Tensor& w, const at::Tensor& d2,
                              const at::Tensor& x2);
// A weight gradient g computed already (w's shape): into the slot as linear_weight_grad writes (g
// fp32; returns undefined), else returned in w's dtype.
at::Tensor store_weight_grad(const WeightGradSlots* slots, const at::Tensor& w, const at::Tensor& g);
// y = x w^T (+ b): x [.., in], w [out, in], b [out] or undefined. slots null: at::linear. Else,
// for fp32 x and w, w's gradient is the backward's GEMM written into (or accumulated with beta 1
// onto) the slot slots->weight_grad_slot(w) names, and autograd gets none for w (its
// post-accumulate-grad hook still runs, with no gradient); without a slot, or in another dtype, it
// is returned as usual.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const WeightGradSlots* slots);
// The activation between an MLP's two linear layers: swiglu (pre = [gate; up] on the last dim,
// silu(gate) * up), gelu (erf form) or gelu_tanh.
enum class Activation { swiglu, gelu, gelu_tanh };
// swiglu(), gelu() or gelu_tanh() by name.
at::Tensor activation(const DeviceBackend& be, Activation act, const at::Tensor& pre);
// activation(be, act, pre) then linear(.., w, b, slots), keeping only pre and w for backward: the
// activation's output [.., in] is recomputed there instead of being held from forward to backward
// (in an MLP, one [tokens, ffn] tensor per layer less at the peak). The GEMMs are lf::ops::gemm's
// (those of linear() with a sink; slots may be null, w's gradient is then returned); without
// gradients (no grad mode, or no input needs one) it is exactly activation() then linear().
// pre: [.., 2 in] for swiglu, [.., in] otherwise; w [out, in]; b [out] or undefined.
at::Tensor activated_linear(const DeviceBackend& be, Activation act, const at::Tensor& pre, const at::Tensor& w,
                            const at::Tensor& b, const WeightGradSlots* slots);
// linear(rms_norm(be, x, g, eps), w, b, slots) keeping x, g, the norm's rstd and w for backward:
// the normed input is recomputed there instead of being held from forward to backward (a layer's
// linear_qkv and linear_fc1: one [tokens, h] tensor each less at the peak). GEMMs and the
// no-gradient case as activated_linear.
at::Tensor rms_norm_linear(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& g, double eps,
                           const at::Tensor& w, const at::Tensor& b, const WeightGradSlots* slots);
// w[ids] (at::embedding): ids [...] int64, w [rows, h] -> [..., h]. slots null, or w not on the
// CPU (CUDA's index_add_ is not deterministic): at::embedding. Else, for fp32 w and gradient, w's gradient is scattered (index_add over the ids, in their
// order) straight into the slot slots->weight_grad_slot(w) names, zeroed first unless it already
// holds gradient this step, and autograd gets none for w; without a slot it is returned as usual.
at::Tensor embedding(const at::Tensor& w, const at::Tensor& ids, const WeightGradSlots* slots);
// q: [b, nq, s, d], k: [b, nkv, t, d], v: [b, nkv, t, dv] -> [b, nq, s, dv].
// scale defaults to 1/sqrt(d). An explicit mask gets no gradient.
at::Tensor sdpa(const DeviceBackend& be, const at::Tensor& q, const at::Tensor& k,
                const at::Tensor& v, const AttentionMask& mask,
                std::optional<double> scale = std::nullopt);

// Attention of a chunk of a sequence over the keys of the chunks before it (ChunkPipe): q [b, nq,
// s, d] sees every key of k_prefix/v_prefix [b, nkv, t, d] and its own chunk's k/v [b, nkv, s, d]
// causally. Equals sdpa(q, cat(k_prefix, k), cat(v_prefix, v), causal) (gradients to all five
// inputs) without concatenating: two attentions merged by their log-sum-exp, so the prefix is
// never copied and each part can use a flash kernel.
at::Tensor sdpa_after_prefix(const DeviceBackend& be, const at::Tensor& q, const at::Tensor& k_prefix,
                             const at::Tensor& v_prefix, const at::Tensor& k, const at::Tensor& v,
                             std::optional<double> scale = std::nullopt);
// The same with the own chunk's keys under `own` (causal: bottom-right aligned, so t own keys
// may outnumber the s queries, as for a context-parallel rank's piece of a chunk; or an explicit
// mask [b|1, 1, s, t]).
at::Tensor sdpa_after_prefix(const DeviceBackend& be, const at::Tensor& q, const at::Tensor& k_prefix,
                             const at::Tensor& v_prefix, const at::Tensor& k, const at::Tensor& v, double scale,
                             const AttentionMask& own);

// MoE dispatch: x [n, h] routed by indices [n, k] (-1: a dropped slot) -> rows [m, h] grouped by
// expert (gradient to x), with each slot's row (position [n, k], -1 if dropped) and the rows per
// expert (tokens_per_expert [E] int64 on the CPU): op_table.h's moe_permute.
struct MoePermuted {
  at::Tensor rows, position, tokens_per_expert;
};
MoePermuted moe_permute(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& indices,
                        int64_t num_experts);
// The experts' rows y [m, h] back to the tokens, weighted: out [n, h] = sum_j probs[t, j] *
// y[position[t, j]] (gradients to y and probs).
at::Tensor moe_unpermute(const DeviceBackend& be, const at::Tensor& y, const at::Tensor& position,
                         const at::Tensor& probs);
// x [m, k_in] in groups of counts [G] rows (CPU int64), w [G, n_out, k_in] -> [m, n_out], row
// group g times w_g^T (gradients to x and w).
at::Tensor grouped_gemm(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts);

// DSA (DeepSeek Sparse Attention; op_table.h). The indexer's top-k keys per query: qi [b, sq, nh,
// di], ki [b, sk, di], w [b, sq, nh] -> [b, sq, topk] int64 (-1: none). No gradient.
at::Tensor dsa_indexer_topk(const DeviceBackend& be, const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                            double scale, int64_t topk);
// The indexer's scores at the selected keys: [b, sq, topk] fp32 (-inf at -1 slots); gradients to
// qi, ki and w.
at::Tensor dsa_indexer_scores(const DeviceBackend& be, const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                              const at::Tensor& indices, double scale);
// Attention of q [b, nq, sq, d] over the selected keys of k [b, nkv, sk, d] / v [b, nkv, sk, dv]:
// o [b, nq, sq, dv] (gradients to q, k, v) and head_prob [b, sq, topk] fp32 (no gradient): the
// probabilities of the selected keys summed over the heads.
struct DsaAttention {
  at::Tensor o, head_prob;
};
DsaAttention dsa_sparse_attention(const DeviceBackend& be, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& indices, double scale);

}  // namespace lf::ops

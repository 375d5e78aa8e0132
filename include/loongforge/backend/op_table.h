// OpTable: the fused ops models reach through a DeviceBackend, each as an explicit forward and
// backward pair (forward returns what backward needs). Not autograd: backend/functional.h wraps
// these pairs in autograd Functions; models call those.
//
// Conventions shared by every implementation (the CPU reference in backends/cpu pins them):
// - Math runs in fp32 (fp64 inputs stay fp64; bf16/fp16 are upcast). Outputs named like an input
//   (y, o, dx, dlogits ...) have that input's dtype; statistics (rstd, mean, lse, loss) are fp32
//   (fp64 for fp64 inputs).
// - Inputs may be non-contiguous; outputs are contiguous.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>

namespace lf::backend {

struct RmsNormFwd {
  at::Tensor y;     // [.., h], x's dtype
  at::Tensor rstd;  // [..] = 1 / sqrt(mean(x^2) + eps)
};
struct GatedBwd {
  at::Tensor dgate, dup;  // the shapes and dtype of gate and up
};
struct RmsNormBwd {
  at::Tensor dx;  // [.., h]
  at::Tensor dw;  // [h], w's dtype
};

struct LayerNormFwd {
  at::Tensor y;     // [.., h]
  at::Tensor mean;  // [..]
  at::Tensor rstd;  // [..] = 1 / sqrt(biased var + eps)
};
struct LayerNormBwd {
  at::Tensor dx, dw;
  at::Tensor db;  // undefined when the forward had no bias
};

struct CrossEntropyFwd {
  at::Tensor loss;  // [n] fp32, 0 where target == ignore_index
  at::Tensor lse;   // [n] fp32 logsumexp of the logits row
};

// Attention masks. Causal is aligned bottom-right (query i sees keys j <= i + t - s, as in
// FlashAttention), which equals the usual lower triangle when s == t and is what decoding with a
// KV cache needs. A row that sees no key gives o = 0 and lse = -inf, and no gradient.
enum class MaskKind : int32_t {
  none = 0,
  causal = 1,
  explicit_bool = 2,      // mask: bool [b|1, nq|1, s, t], true = may attend
  explicit_additive = 3,  // mask: float [b|1, nq|1, s, t], added to the scaled scores
};
const char* to_string(MaskKind kind);

struct AttentionMask {
  MaskKind kind = MaskKind::none;
  at::Tensor mask;  // only for the explicit kinds

  static AttentionMask none() { return {}; }
  static AttentionMask causal() { return {MaskKind::causal, {}}; }
  static AttentionMask boolean(at::Tensor m) { return {MaskKind::explicit_bool, std::move(m)}; }
  static AttentionMask additive(at::Tensor m) {
    return {MaskKind::explicit_additive, std::move(m)};
  }
};

struct SdpaFwd {
  at::Tensor o;    // [b, nq, s, dv], q's dtype
  at::Tensor lse;  // [b, nq, s] fp32, logsumexp of the masked, scaled scores
};
struct SdpaBwd {
  at::Tensor dq, dk, dv;  // shapes and dtypes of q, k, v (GQA: summed over each kv group)
};

// Decoupled weight decay (Loshchilov & Hutter; torch.optim.AdamW):
//   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  int64_t step = 1;  // 1-based count of this update, for bias correction
  // Multiplies every gradient before use (the loss scaler's 1/scale times the clipping
  // coefficient), so unscaling and clipping cost no pass of their own. The grads are not written.
  double grad_scale = 1.0;
};

// This rank's columns of an output layer whose vocabulary is split over tensor-parallel ranks.
struct VocabShard {
  int64_t start = 0;   // global id of local row 0 of w
  int64_t valid = -1;  // local rows that are real vocabulary (the rest is padding); -1: all
  // In place on a [k, n] fp32 tensor: max (max = true) or sum over the ranks sharing the
  // vocabulary. Empty: this rank holds the whole vocabulary.
  std::function<void(at::Tensor&, bool max)> all_reduce;
};

// The output layer and the cross entropy in one op, its gradients computed in the forward for the
// weighted sum L = sum_i weight_i loss_i (the backward only scales them by dL).
struct LinearCrossEntropyFwd {
  at::Tensor loss;  // [n] fp32 per-token loss, 0 where target == ignore_index
  at::Tensor dx;    // [n, h] x's dtype: dL/dx from this rank's columns (summed over TP by the caller)
  at::Tensor dw;    // [v_local, h] w's dtype: dL/dw (padding rows 0)
};

// Where linear_cross_entropy puts dL/dw instead of returning it: the gradient buffer's fp32 slot
// for w (Megatron's gradient-accumulation fusion, for the output layer). dw receives scale * dL/dw,
// written over its contents or added to them; the result's dw is then undefined. The output layer's
// weight gradient then never exists as a tensor of its own, held from forward to backward.
struct GradInto {
  at::Tensor dw;  // fp32 [v_local, h], contiguous; undefined: return dw as usual
  double scale = 1.0;
  bool accumulate = false;
  bool skip = false;  // the weight is frozen (LoRA): dL/dw is not computed at all; the result's dw is undefined
};

// Mixture of experts: each of n tokens goes to k experts (indices [n, k], -1: the slot was dropped
// by a capacity limit), and the experts' rows are laid out grouped by expert.
struct MoePermuteFwd {
  at::Tensor permuted;           // [m, h] x's dtype: the routed (token, slot) rows grouped by expert,
                                 // expert 0's first; within an expert in token order, then slot order
  at::Tensor source;             // [m] int64: the token each permuted row came from
  at::Tensor position;           // [n, k] int64: the permuted row of token t's slot j, -1 if dropped
  at::Tensor tokens_per_expert;  // [E] int64 on the CPU (sums to m): the grouped GEMM's groups
};
struct MoeUnpermuteBwd {
  at::Tensor dy;      // [m, h] y's dtype
  at::Tensor dprobs;  // [n, k] probs' dtype (0 at dropped slots)
};
// Which gradients of a GEMM's backward to compute.
struct GemmGrads {
  bool dx = true, dw = true;
};
struct GroupedGemmBwd {
  at::Tensor dx;  // [m, k_in] x's dtype
  at::Tensor dw;  // [G, n_out, k_in] w's dtype (0 for empty groups)
};

// DeepSeek Sparse Attention (DSA, DeepSeek-V3.2). The lightning indexer scores key t for query s
//   I[b, s, t] = sum_j w[b, s, j] relu(scale <qi[b, s, j], ki[b, t]>)
// with its own heads (qi [b, sq, nh, di], one key head ki [b, sk, di], per-head weights w [b, sq,
// nh]) under the bottom-right causal mask (key t visible from query s iff t <= s + sk - sq); each
// query keeps its topk best keys (indices [b, sq, topk] int64, by score descending, ties to the
// lower key index; -1 fills the slots of a query that sees fewer than topk keys). Attention then
// runs over the selected keys only. ReferenceOps materialises [b, sq, sk] and [b, nq, sq, sk]
// (dense math under masks); a fused implementation works on blocks of queries and the gathered
// selected keys, so its memory grows linearly with the sequence.
struct DsaAttentionFwd {
  at::Tensor o;          // [b, nq, sq, dv] q's dtype
  at::Tensor lse;        // [b, nq, sq] fp32 over the selected keys (-inf: none selected)
  at::Tensor head_prob;  // [b, sq, topk] fp32: the attention probability of each selected key
                         // summed over the heads (0 at -1 slots); the indexer loss's target before
                         // its L1 normalisation. No gradient.
};
struct DsaAttentionBwd {
  at::Tensor dq, dk, dv;  // shapes and dtypes of q, k, v (GQA: summed over each kv group)
};
struct DsaIndexerBwd {
  at::Tensor dq;  // [b, sq, nh, di] qi's dtype
  at::Tensor dk;  // [b, sk, di] ki's dtype
  at::Tensor dw;  // [b, sq, nh] w's dtype
};

class OpTable {
 public:
  virtual ~OpTable() = default;

  // x: [.., h], w: [h]
  virtual RmsNormFwd rms_norm_fwd(const at::Tensor& x, const at::Tensor& w, double eps) const = 0;
  // dy, x: [.., h], w: [h], rstd: [..]
  virtual RmsNormBwd rms_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                  const at::Tensor& rstd) const = 0;

  // x: [.., h], w: [h], b: [h] or undefined
  virtual LayerNormFwd layer_norm_fwd(const at::Tensor& x, const at::Tensor& w,
                                      const at::Tensor& b, double eps) const = 0;
  virtual LayerNormBwd layer_norm_bwd(const at::Tensor& dy, const at::Tensor& x,
                                      const at::Tensor& w, bool has_bias, const at::Tensor& mean,
                                      const at::Tensor& rstd) const = 0;

  // x: [s, b, n, d]; cos, sin: [s, r] with r <= d and r even (the first r dims rotate, the rest
  // pass through). interleaved = false rotates halves (x[:r/2], x[r/2:r]) as in Megatron/HF;
  // true rotates pairs (x[2i], x[2i+1]) as in GPT-J. cos/sin are laid out to match.
  virtual at::Tensor rope_fwd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                              bool interleaved) const = 0;
  // The rotation is orthogonal, so the backward is the forward with sin negated.
  virtual at::Tensor rope_bwd(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin,
                              bool interleaved) const = 0;

  // gate_up: [.., 2f] = cat(gate, up) along the last dim -> y: [.., f] = silu(gate) * up
  virtual at::Tensor swiglu_fwd(const at::Tensor& gate_up) const = 0;
  // dy: [.., f] -> dgate_up: [.., 2f]
  virtual at::Tensor swiglu_bwd(const at::Tensor& dy, const at::Tensor& gate_up) const = 0;

  // x: [..] -> y = x * Phi(x) (the exact, erf form; torch's gelu(approximate='none'))
  virtual at::Tensor gelu_fwd(const at::Tensor& x) const = 0;
  // dy: [..] -> dx = dy * (Phi(x) + x * phi(x))
  virtual at::Tensor gelu_bwd(const at::Tensor& dy, const at::Tensor& x) const = 0;
  // x: [..] -> y = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3) (torch's
  // gelu(approximate='tanh'); Gemma, SigLIP, DiT MLPs)
  virtual at::Tensor gelu_tanh_fwd(const at::Tensor& x) const = 0;
  // dy: [..] -> dx = dy * ((1 + tanh(u)) / 2 + x/2 (1 - tanh(u)^2) du/dx)
  virtual at::Tensor gelu_tanh_bwd(const at::Tensor& dy, const at::Tensor& x) const = 0;
  // GeGLU, tanh form (Gemma's and pi0.5's MLPs): gate, up: [..] of one shape -> y = gelu_tanh(gate) * up,
  // computed in fp32 and rounded once
  virtual at::Tensor geglu_tanh_fwd(const at::Tensor& gate, const at::Tensor& up) const = 0;
  // dy: [..] -> dgate = dy * up * gelu_tanh'(gate), dup = dy * gelu_tanh(gate)
  virtual GatedBwd geglu_tanh_bwd(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up) const = 0;

  // logits: [n, v], target: [n] int64
  virtual CrossEntropyFwd softmax_cross_entropy_fwd(const at::Tensor& logits,
                                                    const at::Tensor& target,
                                                    int64_t ignore_index) const = 0;
  // dloss: [n] -> dlogits: [n, v]
  virtual at::Tensor softmax_cross_entropy_bwd(const at::Tensor& dloss, const at::Tensor& logits,
                                               const at::Tensor& target, const at::Tensor& lse,
                                               int64_t ignore_index) const = 0;

  // x: [n, h], w: [v_local, h] (logits z = x w^T), target: [n] int64 global ids, weight: [n]
  // fp32 (0 for tokens whose loss does not count). Never holds more than chunk_tokens rows of
  // fp32 logits at once (<= 0: the backend's choice, a function of w's rows and dtype only, not of
  // shard.valid). Under a vocabulary split every rank makes the same shard.all_reduce calls in
  // the same order with the same shapes (its padding-only shard included), or the group's
  // collectives would not match.
  virtual LinearCrossEntropyFwd linear_cross_entropy(const at::Tensor& x, const at::Tensor& w,
                                                     const at::Tensor& target,
                                                     const at::Tensor& weight,
                                                     int64_t ignore_index, const VocabShard& shard,
                                                     int64_t chunk_tokens, const GradInto& into = {}) const = 0;

  // q: [b, nq, s, d], k: [b, nkv, t, d], v: [b, nkv, t, dv], nq % nkv == 0 (GQA: query head h
  // uses kv head h / (nq / nkv)). scale multiplies q k^T (usually 1 / sqrt(d)).
  virtual SdpaFwd sdpa_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionMask& mask, double scale) const = 0;
  // dout: [b, nq, s, dv]; o, lse: from the forward. Or those of a larger attention whose keys
  // include these (the rows' total over several key blocks, merged by lse): the result is then
  // this block's share of the gradient. Hence D = rowsum(dout * o) must come from the given o.
  virtual SdpaBwd sdpa_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
                           const AttentionMask& mask, double scale) const = 0;

  // MoE token permutation. x: [n, h], indices: [n, k] int64 in [0, num_experts) or -1 (dropped).
  virtual MoePermuteFwd moe_permute_fwd(const at::Tensor& x, const at::Tensor& indices,
                                        int64_t num_experts) const = 0;
  // dpermuted: [m, h] -> dx: [n, h] (each token's slots summed).
  virtual at::Tensor moe_permute_bwd(const at::Tensor& dpermuted, const at::Tensor& source,
                                     int64_t num_tokens) const = 0;
  // The weighted return: y [m, h] (the experts' rows), position [n, k] (from the permute),
  // probs [n, k] -> out [n, h] = sum_j probs[t, j] * y[position[t, j]] (dropped slots add nothing),
  // y's dtype, accumulated in fp32.
  virtual at::Tensor moe_unpermute_fwd(const at::Tensor& y, const at::Tensor& position,
                                       const at::Tensor& probs) const = 0;
  // dout: [n, h] -> dy = probs * dout at each slot's row, dprobs = <dout[t], y[position[t, j]]>.
  virtual MoeUnpermuteBwd moe_unpermute_bwd(const at::Tensor& dout, const at::Tensor& y,
                                            const at::Tensor& position,
                                            const at::Tensor& probs) const = 0;
  // Grouped GEMM: x [m, k_in] holds G groups of consecutive rows (counts [G] int64 on the CPU,
  // summing to m); w [G, n_out, k_in]; y [m, n_out] with y_g = x_g w_g^T. Runs in x's dtype
  // (bf16: fp32 accumulation) like the model's dense linear layers; x and w share a dtype.
  virtual at::Tensor grouped_gemm_fwd(const at::Tensor& x, const at::Tensor& w,
                                      const at::Tensor& counts) const = 0;
  // dy: [m, n_out] -> dx_g = dy_g w_g, dw_g = dy_g^T x_g. Only the wanted ones are computed (the
  // other left undefined): the input's gradient alone, or the weights' alone later
  // (--delay-wgrad-compute), or a frozen weight's never.
  virtual GroupedGemmBwd grouped_gemm_bwd(const at::Tensor& dy, const at::Tensor& x,
                                          const at::Tensor& w, const at::Tensor& counts,
                                          GemmGrads want) const = 0;

  // DSA (see DsaAttentionFwd). The indexer's top-k: qi [b, sq, nh, di], ki [b, sk, di], w [b, sq,
  // nh] -> indices [b, sq, topk] int64 (1 <= topk <= sk). Not differentiable.
  virtual at::Tensor dsa_indexer_topk(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                                      double scale, int64_t topk) const = 0;
  // The indexer's scores at the selected keys: [b, sq, topk] fp32, I[b, s, indices[b, s, j]]
  // (-inf at -1 slots). The indexer loss backpropagates through them.
  virtual at::Tensor dsa_indexer_scores_fwd(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                                            const at::Tensor& indices, double scale) const = 0;
  // dscores: [b, sq, topk] (ignored at -1 slots). dk sums over every (query, head) that selected
  // the key: accumulated in fp64 (rounded to ki's dtype at the end).
  virtual DsaIndexerBwd dsa_indexer_scores_bwd(const at::Tensor& dscores, const at::Tensor& qi,
                                               const at::Tensor& ki, const at::Tensor& w,
                                               const at::Tensor& indices, double scale) const = 0;
  // Sparse attention: q [b, nq, sq, d], k [b, nkv, sk, d], v [b, nkv, sk, dv] (GQA as sdpa), each
  // query over its selected keys indices [b, sq, topk] (shared by the heads; -1: none), scores
  // scaled by scale.
  virtual DsaAttentionFwd dsa_sparse_attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& indices, double scale) const = 0;
  // dout: [b, nq, sq, dv]; o, lse from the forward.
  virtual DsaAttentionBwd dsa_sparse_attention_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const at::Tensor& indices,
                                                   const at::Tensor& o, const at::Tensor& lse,
                                                   double scale) const = 0;

  // In place on fp32 master params and their states (equal-length lists, matching shapes);
  // grads may be any floating dtype. No backward.
  virtual void adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avg,
                          at::TensorList exp_avg_sq, const AdamWHyper& hyper) const = 0;

  // sum over every tensor of sum(t^2), accumulated in fp64: a [1] fp64 tensor on the tensors'
  // device (the global gradient norm's local part). Deterministic for a given list.
  virtual at::Tensor squared_norm(at::TensorList tensors) const = 0;
};

}  // namespace lf::backend

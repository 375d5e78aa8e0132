// ReferenceOps: the reference OpTable, written as explicit ATen math with explicit backward
// formulas (no autograd, no fused ATen kernels such as at::scaled_dot_product_attention). It is
// what every other backend is tested against. It runs on the device of its inputs, so the CUDA
// backend starts from it and overrides ops one kernel at a time. Not tuned for speed.
#pragma once

#include "loongforge/backend/op_table.h"

namespace lf::backend {

class ReferenceOps : public OpTable {
 public:
  RmsNormFwd rms_norm_fwd(const at::Tensor& x, const at::Tensor& w, double eps) const override;
  RmsNormBwd rms_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                          const at::Tensor& rstd) const override;
  LayerNormFwd layer_norm_fwd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                              double eps) const override;
  LayerNormBwd layer_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                              bool has_bias, const at::Tensor& mean,
                              const at::Tensor& rstd) const override;
  at::Tensor rope_fwd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      bool interleaved) const override;
  at::Tensor rope_bwd(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin,
                      bool interleaved) const override;
  at::Tensor swiglu_fwd(const at::Tensor& gate_up) const override;
  at::Tensor swiglu_bwd(const at::Tensor& dy, const at::Tensor& gate_up) const override;
  at::Tensor gelu_fwd(const at::Tensor& x) const override;
  at::Tensor gelu_bwd(const at::Tensor& dy, const at::Tensor& x) const override;
  at::Tensor gelu_tanh_fwd(const at::Tensor& x) const override;
  at::Tensor gelu_tanh_bwd(const at::Tensor& dy, const at::Tensor& x) const override;
  at::Tensor geglu_tanh_fwd(const at::Tensor& gate, const at::Tensor& up) const override;
  GatedBwd geglu_tanh_bwd(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up) const override;
  CrossEntropyFwd softmax_cross_entropy_fwd(const at::Tensor& logits, const at::Tensor& target,
                                            int64_t ignore_index) const override;
  at::Tensor softmax_cross_entropy_bwd(const at::Tensor& dloss, const at::Tensor& logits,
                                       const at::Tensor& target, const at::Tensor& lse,
                                       int64_t ignore_index) const override;
  SdpaFwd sdpa_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const AttentionMask& mask, double scale) const override;
  SdpaBwd sdpa_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
                   const AttentionMask& mask, double scale) const override;
  // Unchunked: the whole [n, v] logits (reference_loss_ops.cpp).
  LinearCrossEntropyFwd linear_cross_entropy(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                                             const at::Tensor& weight, int64_t ignore_index,
                                             const VocabShard& shard, int64_t chunk_tokens,
                                             const GradInto& into = {}) const override;
  void adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avg,
                  at::TensorList exp_avg_sq, const AdamWHyper& hyper) const override;
  at::Tensor squared_norm(at::TensorList tensors) const override;
  // reference_moe_ops.cpp: a stable sort by expert, index_select/index_add, one GEMM per group
  // written into its rows of the output.
  MoePermuteFwd moe_permute_fwd(const at::Tensor& x, const at::Tensor& indices,
                                int64_t num_experts) const override;
  at::Tensor moe_permute_bwd(const at::Tensor& dpermuted, const at::Tensor& source,
                             int64_t num_tokens) const override;
  at::Tensor moe_unpermute_fwd(const at::Tensor& y, const at::Tensor& position,
                               const at::Tensor& probs) const override;
  MoeUnpermuteBwd moe_unpermute_bwd(const at::Tensor& dout, const at::Tensor& y, const at::Tensor& position,
                                    const at::Tensor& probs) const override;
  at::Tensor grouped_gemm_fwd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) const override;
  GroupedGemmBwd grouped_gemm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                  const at::Tensor& counts, GemmGrads want) const override;
  // reference_dsa_ops.cpp: dense [b, sq, sk] index scores and [b, nq, sq, sk] attention under the
  // selection's mask (the sdpa reference with an explicit mask); the top-k by a stable sort.
  at::Tensor dsa_indexer_topk(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w, double scale,
                              int64_t topk) const override;
  at::Tensor dsa_indexer_scores_fwd(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                                    const at::Tensor& indices, double scale) const override;
  DsaIndexerBwd dsa_indexer_scores_bwd(const at::Tensor& dscores, const at::Tensor& qi, const at::Tensor& ki,
                                       const at::Tensor& w, const at::Tensor& indices, double scale) const override;
  DsaAttentionFwd dsa_sparse_attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& indices, double scale) const override;
  DsaAttentionBwd dsa_sparse_attention_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& indices, const at::Tensor& o,
                                           const at::Tensor& lse, double scale) const override;
};

// Shape checks shared by every backend, so all of them reject bad input with the same message.
void check_rms_norm_args(const at::Tensor& x, const at::Tensor& w);
void check_rope_args(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
void check_swiglu_args(const at::Tensor& gate_up);
// gate and up (and dy, when given) of one shape and dtype, on one device.
void check_geglu_args(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& dy = {});
void check_cross_entropy_args(const at::Tensor& logits, const at::Tensor& target);
void check_linear_cross_entropy_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                                     const at::Tensor& weight, const VocabShard& shard);
void check_grad_into(const GradInto& into, const at::Tensor& w);
// Which targets this vocabulary shard owns, shared by every linear_cross_entropy: ignored [n]
// (target == ignore_index), mine [n] (a real row of this shard), safe [n] (the local row, 0
// where not mine). Without a reduction (one rank) a target neither ignored nor in [0, valid) is
// an error naming the vocabulary size.
struct ShardTargets {
  at::Tensor ignored, mine, safe;
};
ShardTargets shard_targets(const at::Tensor& target, const VocabShard& shard, int64_t valid, int64_t ignore_index);
void check_moe_permute_args(const at::Tensor& x, const at::Tensor& indices, int64_t num_experts);
void check_moe_unpermute_args(const at::Tensor& y, const at::Tensor& position, const at::Tensor& probs);
void check_grouped_gemm_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts);
void check_dsa_indexer_args(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w);
void check_dsa_indices(const at::Tensor& indices, int64_t b, int64_t sq, int64_t sk);
void check_dsa_attention_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& indices);
void check_sdpa_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionMask& mask);

}  // namespace lf::backend

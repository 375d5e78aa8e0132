// The CPU backend's op table: the reference math (backend/reference_ops.h) with attention routed
// to our grouped-query kernel (cpu_attention.h: fp32, bf16 widened to fp32; no mask, a
// bottom-right causal mask or an fp32 additive one, K/V never copied per query head) when the
// call has a (batch, kv head) task per thread, else to
// ATen's fused CPU flash-attention kernels where they apply (no mask, or a causal mask over a
// square score matrix; fp32/bf16; equal q/v head sizes), and one-pass kernels for RMSNorm, SwiGLU,
// GELU (tanh form) and RoPE (cpu_fused.cpp), and DSA fused by query blocks (cpu_dsa.cpp). Everything else, and every other case, is the reference. The op
// harness checks this table against ReferenceOps on every case.
#pragma once

#include "loongforge/backend/reference_ops.h"

namespace lf::backend {

class CpuOps final : public ReferenceOps {
 public:
  // Fused one-pass kernels (cpu_fused.cpp) for contiguous fp32/bf16 input; else the reference.
  RmsNormFwd rms_norm_fwd(const at::Tensor& x, const at::Tensor& w, double eps) const override;
  RmsNormBwd rms_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                          const at::Tensor& rstd) const override;
  at::Tensor swiglu_fwd(const at::Tensor& gate_up) const override;
  at::Tensor swiglu_bwd(const at::Tensor& dy, const at::Tensor& gate_up) const override;
  // contiguous fp32/bf16 (bf16 through the fp32 kernels on widened blocks); else the reference
  at::Tensor gelu_tanh_fwd(const at::Tensor& x) const override;
  at::Tensor gelu_tanh_bwd(const at::Tensor& dy, const at::Tensor& x) const override;
  at::Tensor geglu_tanh_fwd(const at::Tensor& gate, const at::Tensor& up) const override;
  GatedBwd geglu_tanh_bwd(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up) const override;
  // Fused for non-interleaved RoPE on fp32/bf16 x (any view with a unit-stride last dim) with fp32
  // or bf16 tables; interleaved: the reference.
  at::Tensor rope_fwd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      bool interleaved) const override;
  at::Tensor rope_bwd(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin,
                      bool interleaved) const override;

  // cpu_train_ops.cpp: chunked (fp32/bf16), flat one-pass (fp32 lists), fixed-block fp64.
  LinearCrossEntropyFwd linear_cross_entropy(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                                             const at::Tensor& weight, int64_t ignore_index,
                                             const VocabShard& shard, int64_t chunk_tokens,
                                             const GradInto& into = {}) const override;
  void adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avg,
                  at::TensorList exp_avg_sq, const AdamWHyper& hyper) const override;
  at::Tensor squared_norm(at::TensorList tensors) const override;

  SdpaFwd sdpa_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const AttentionMask& mask, double scale) const override;
  SdpaBwd sdpa_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
                   const AttentionMask& mask, double scale) const override;

  // cpu_dsa.cpp: DSA fused by blocks of queries over the gathered selected keys (never [b, nq, sq, sk]).
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

}  // namespace lf::backend

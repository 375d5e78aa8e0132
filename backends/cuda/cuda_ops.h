// The CUDA backend's op table: the reference math run by ATen on CUDA tensors, with the ops that
// have a hand-written kernel (kernels/) or a library kernel (the experts' grouped GEMM: torch's
// CUTLASS grouped GEMM) overridden. Private to the CUDA module. Still on the reference: LayerNorm,
// the GELU family, the plain cross entropy (the models use the fused output layer + cross
// entropy, which has kernels), SDPA, the MoE permutation's forward (a stable sort and a row gather, both
// ATen kernels), the DSA indexer's backward and sparse attention (dense [b, nq, sq, sk] under the
// selection mask).
#pragma once

#include "loongforge/backend/reference_ops.h"

namespace lf::backend::cuda {

class CudaOps final : public ReferenceOps {
 public:
  RmsNormFwd rms_norm_fwd(const at::Tensor& x, const at::Tensor& w, double eps) const override;
  RmsNormBwd rms_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                          const at::Tensor& rstd) const override;
  at::Tensor rope_fwd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      bool interleaved) const override;
  at::Tensor rope_bwd(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin,
                      bool interleaved) const override;
  at::Tensor swiglu_fwd(const at::Tensor& gate_up) const override;
  at::Tensor swiglu_bwd(const at::Tensor& dy, const at::Tensor& gate_up) const override;
  at::Tensor grouped_gemm_fwd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) const override;
  GroupedGemmBwd grouped_gemm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                  const at::Tensor& counts, GemmGrads want) const override;

  // cuda_train_ops.cpp
  LinearCrossEntropyFwd linear_cross_entropy(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                                             const at::Tensor& weight, int64_t ignore_index, const VocabShard& shard,
                                             int64_t chunk_tokens, const GradInto& into = {}) const override;
  void adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq,
                  const AdamWHyper& hyper) const override;
  at::Tensor squared_norm(at::TensorList tensors) const override;
  at::Tensor moe_permute_bwd(const at::Tensor& dpermuted, const at::Tensor& source, int64_t num_tokens) const override;
  at::Tensor moe_unpermute_fwd(const at::Tensor& y, const at::Tensor& position, const at::Tensor& probs) const override;
  MoeUnpermuteBwd moe_unpermute_bwd(const at::Tensor& dout, const at::Tensor& y, const at::Tensor& position,
                                    const at::Tensor& probs) const override;
  at::Tensor dsa_indexer_topk(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w, double scale,
                              int64_t topk) const override;
  at::Tensor dsa_indexer_scores_fwd(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                                    const at::Tensor& indices, double scale) const override;
};

}  // namespace lf::backend::cuda

// The CUDA backend's op table: the reference math run by ATen on CUDA tensors, with the ops that
// have a hand-written kernel (kernels/) or a library kernel (the experts' grouped GEMM: torch's
// CUTLASS grouped GEMM) overridden. Private to the CUDA module. DSA's ops (dsa_*) have no CUDA
// kernel yet: they run the reference (dense [b, nq, sq, sk] under the selection mask) on the GPU.
#pragma once

#include "loongforge/backend/reference_ops.h"

namespace lf::backend::cuda {

class CudaOps final : public ReferenceOps {
 public:
  RmsNormFwd rms_norm_fwd(const at::Tensor& x, const at::Tensor& w, double eps) const override;
  at::Tensor swiglu_fwd(const at::Tensor& gate_up) const override;
  at::Tensor swiglu_bwd(const at::Tensor& dy, const at::Tensor& gate_up) const override;
  at::Tensor grouped_gemm_fwd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) const override;
  GroupedGemmBwd grouped_gemm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                  const at::Tensor& counts, GemmGrads want) const override;
};

}  // namespace lf::backend::cuda

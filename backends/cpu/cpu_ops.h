// The CPU backend's op table: the reference math (backend/reference_ops.h) with attention routed
// to ATen's fused CPU flash-attention kernels where they apply (no mask, or a causal mask over a
// square score matrix; fp32/bf16; equal q/v head sizes). Everything else, and every other case,
// is the reference. The op harness checks this table against ReferenceOps on every case.
#pragma once

#include "loongforge/backend/reference_ops.h"

namespace lf::backend {

class CpuOps final : public ReferenceOps {
 public:
  SdpaFwd sdpa_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const AttentionMask& mask, double scale) const override;
  SdpaBwd sdpa_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
                   const AttentionMask& mask, double scale) const override;
};

}  // namespace lf::backend

// The CPU backend's own fp32 attention kernel (cpu_attention.cpp): grouped-query attention
// without a mask, with a bottom-right causal mask or with an additive fp32 mask (broadcast to
// [b, hq, s, t]), K/V never copied per query head; q, dout and o are read through their strides
// (last dim unit-stride: pi05's queries are a transposed view of [b, s, hq, d]); o comes back
// sequence-major ([b, s, hq, dv] memory seen as [b, hq, s, dv]), dq head-major and contiguous.
#pragma once

#include <ATen/core/Tensor.h>

namespace lf::backend::cpu_attention {

struct Forward {
  at::Tensor o, lse;  // [b, hq, s, dv], [b, hq, s] (natural log-sum-exp of the scaled scores)
};
struct Backward {
  at::Tensor dq, dk, dv;
};

// Whether the kernel takes a call of this shape: on the CPU, a causal mask only with at least as
// many keys as queries, and at least one (batch, kv head) task per thread. The kernel itself reads
// fp32 q, k, v: a bf16 call is widened by the caller (cpu_ops.cpp).
bool shape_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal);

// `mask`: undefined, or an additive fp32 mask broadcastable to [b, hq, s, t], added to the scaled
// scores (a row whose keys are all -inf gets NaN, as the reference's softmax).
Forward forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, bool causal,
                double scale);
Backward backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& o, const at::Tensor& lse, const at::Tensor& mask, bool causal, double scale);

}  // namespace lf::backend::cpu_attention

// CpuOps: fused CPU attention (backends/cpu/cpu_ops.h).
#include "cpu_ops.h"

#include "cpu_attention.h"

#include <ATen/Functions.h>
#include <array>
#include <optional>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>

namespace lf::backend {
namespace {

// ATen's CPU flash kernel aligns a causal mask top-left; ours is bottom-right (KV cache). They
// agree when s == t. Bool masks (and additive ones in bf16) stay on the reference path.
bool flash_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionMask& mask) {
  const bool dtype_ok = (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16) &&
                        k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type();
  // An additive mask (pi05's prefix / suffix blocks) in fp32 goes to the kernel as attn_mask
  // (broadcast over batch and heads; the kernel reads its last dim with unit stride): the
  // [b, nq, s, t] scores and probabilities are never materialised and the masked scores (-2.38e38)
  // never reach ATen's slow exp path, over which the reference takes three exps.
  const bool additive_ok = mask.kind == MaskKind::explicit_additive && q.scalar_type() == at::kFloat &&
                           mask.mask.scalar_type() == at::kFloat && mask.mask.dim() == 4 &&
                           (mask.mask.stride(-1) == 1 || mask.mask.size(-1) == 1);
  const bool mask_ok = mask.kind == MaskKind::none || (mask.kind == MaskKind::causal && q.size(2) == k.size(2)) ||
                       additive_ok;
  return q.device().is_cpu() && dtype_ok && mask_ok && q.size(-1) == v.size(-1);
}

// The additive mask flash_applies passes to the kernel (none for the other kinds).
std::optional<at::Tensor> flash_mask(const AttentionMask& mask) {
  if (mask.kind == MaskKind::explicit_additive) return mask.mask;
  return std::nullopt;
}

// fp32 without a mask, with a causal one or with an additive fp32 one that broadcasts to the
// scores (pi05's block mask): our kernel (cpu_attention.h), when the call has a (batch, kv head)
// task for every thread (pi05's bench step: 87.4 against 89.6 ms with ATen's flash kernel,
// docs/backends.md). bf16 calls go to it too, widened to fp32 (`widens`): ATen's bf16 flash
// backward took 61 of a llama_10m bf16 step's 372 ms, our kernel 29 on the same shapes in fp32,
// and the copies in and out are [b, h, s, d]-sized, a few hundred microseconds a layer.
bool widens(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16;
}
bool own_kernel_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionMask& mask) {
  const bool fp32 = q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat;
  if (!fp32 && !widens(q, k, v)) return false;
  if (mask.kind == MaskKind::explicit_additive) {
    const auto& m = mask.mask;
    if (m.scalar_type() != at::kFloat || m.dim() != 4) return false;
    const std::array<int64_t, 4> full{q.size(0), q.size(1), q.size(2), k.size(2)};
    for (int i = 0; i < 4; ++i)
      if (m.size(i) != 1 && m.size(i) != full[static_cast<size_t>(i)]) return false;
    return cpu_attention::shape_applies(q, k, v, false);
  }
  return (mask.kind == MaskKind::none || mask.kind == MaskKind::causal) &&
         cpu_attention::shape_applies(q, k, v, mask.kind == MaskKind::causal);
}

// The additive mask our kernel adds (undefined for the other kinds).
at::Tensor own_kernel_mask(const AttentionMask& mask) {
  return mask.kind == MaskKind::explicit_additive ? mask.mask : at::Tensor();
}

// GQA: each kv head serves q.size(1) / k.size(1) query heads.
at::Tensor expand_heads(const at::Tensor& t, int64_t group) {
  return group == 1 ? t : t.repeat_interleave(group, 1);
}
at::Tensor sum_groups(const at::Tensor& g, int64_t group) {
  if (group == 1) return g;
  auto s = g.sizes().vec();  // [b, nkv * group, t, d]
  return g.view({s[0], s[1] / group, group, s[2], s[3]}).sum(2);
}

// GQA (without a mask or with one the heads share, `folds`): the queries that share a kv head are stacked along the sequence, so the
// flash kernel sees nkv heads of group * s queries and K/V are never copied per query head (a
// long key prefix would otherwise be repeated group times, forward and backward).
// [b, nkv * group, s, d] -> [b, nkv, group * s, d]
at::Tensor fold_queries(const at::Tensor& t, int64_t group) {
  const auto n = t.sizes();
  return t.contiguous().view({n[0], n[1] / group, group * n[2], n[3]});
}

// GQA folds the queries when the mask is the same for every head: none, or additive with one
// head ([b|1, 1, s, t]), repeated for the folded rows (row g s + i of a kv head is query head g's
// row i): a copy of group x the mask, smaller than K and V repeated per query head and their
// gradients summed back.
bool folds(int64_t group, const AttentionMask& mask) {
  return group > 1 && (mask.kind == MaskKind::none || (mask.kind == MaskKind::explicit_additive && mask.mask.size(1) == 1));
}
std::optional<at::Tensor> folded_mask(const AttentionMask& mask, int64_t group) {
  if (mask.kind != MaskKind::explicit_additive) return std::nullopt;
  const auto m = mask.mask;  // [b|1, 1, s, t]
  return m.expand({m.size(0), group, m.size(2), m.size(3)}).reshape({m.size(0), 1, group * m.size(2), m.size(3)});
}

// The fold in query-major order, for one key/value head: rows (query i, head h) at i nq + h. When
// the queries come as a transposed view of [b, s, nq, d] (attention over per-token projections
// passes them so) that order is their memory: no copy in, and the output and dq go back as the
// same kind of view ([b, nq, s, d] over [b, s, nq, d] memory), which the caller's transpose to
// [b, s, nq d] takes without a copy either.
bool folds_query_major(const at::Tensor& q, const at::Tensor& k, const AttentionMask& mask) {
  const int64_t group = q.size(1) / k.size(1);
  return k.size(1) == 1 && folds(group, mask) && q.transpose(1, 2).is_contiguous();
}
// [b, nq, s, d] -> [b, 1, s nq, d] (a view when t is query-major in memory)
at::Tensor fold_query_major(const at::Tensor& t) {
  const auto n = t.sizes();
  return t.transpose(1, 2).contiguous().view({n[0], 1, n[2] * n[1], n[3]});
}
// [b, 1, s nq, d] -> [b, nq, s, d], a view
at::Tensor unfold_query_major(const at::Tensor& t, int64_t nq) {
  return t.view({t.size(0), t.size(2) / nq, nq, t.size(3)}).transpose(1, 2);
}
// [b|1, 1, s, t] -> [b|1, 1, s group, t]: row i group + h is query i's
at::Tensor query_major_mask(const at::Tensor& m, int64_t group) {
  return m.unsqueeze(3).expand({m.size(0), 1, m.size(2), group, m.size(3)}).reshape({m.size(0), 1, m.size(2) * group, m.size(3)});
}

}  // namespace

SdpaFwd CpuOps::sdpa_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const AttentionMask& mask, double scale) const {
  check_sdpa_args(q, k, v, mask);
  if (own_kernel_applies(q, k, v, mask)) {
    // bf16 widened (Tensor::to is the tensor itself for fp32, and keeps a dense view's strides: a
    // query that is a transposed view of [b, s, hq, d] stays one, and so does the output).
    auto [o, lse] = cpu_attention::forward(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat),
                                           own_kernel_mask(mask), mask.kind == MaskKind::causal, scale);
    return {o.to(q.scalar_type()), lse};
  }
  if (!flash_applies(q, k, v, mask)) return ReferenceOps::sdpa_fwd(q, k, v, mask, scale);
  const int64_t group = q.size(1) / k.size(1);
  if (folds_query_major(q, k, mask)) {
    const int64_t nq = q.size(1);
    std::optional<at::Tensor> m;
    if (mask.kind == MaskKind::explicit_additive) m = query_major_mask(mask.mask, group);
    auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(fold_query_major(q), k, v, 0.0, false, m, scale);
    return {unfold_query_major(o, nq),
            lse.to(at::kFloat).view({q.size(0), q.size(2), nq}).transpose(1, 2).contiguous()};
  }
  if (folds(group, mask)) {
    auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(fold_queries(q, group), k, v, 0.0, false,
                                                                    folded_mask(mask, group), scale);
    return {o.reshape(q.sizes()).contiguous(), lse.to(at::kFloat).reshape({q.size(0), q.size(1), q.size(2)}).contiguous()};
  }
  auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
      q, expand_heads(k, group), expand_heads(v, group), 0.0, mask.kind == MaskKind::causal, flash_mask(mask), scale);
  return {o.contiguous(), lse.to(at::kFloat).contiguous()};
}

SdpaBwd CpuOps::sdpa_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
                         const AttentionMask& mask, double scale) const {
  check_sdpa_args(q, k, v, mask);
  if (own_kernel_applies(q, k, v, mask)) {
    auto [dq, dk, dv] = cpu_attention::backward(dout, q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), o, lse,
                                                own_kernel_mask(mask), mask.kind == MaskKind::causal, scale);
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
  }
  if (!flash_applies(q, k, v, mask)) return ReferenceOps::sdpa_bwd(dout, q, k, v, o, lse, mask, scale);
  const int64_t group = q.size(1) / k.size(1);
  if (folds_query_major(q, k, mask)) {
    const int64_t nq = q.size(1);
    std::optional<at::Tensor> m;
    if (mask.kind == MaskKind::explicit_additive) m = query_major_mask(mask.mask, group);
    const auto lse_folded = lse.transpose(1, 2).contiguous().view({q.size(0), 1, q.size(2) * nq});
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        fold_query_major(dout), fold_query_major(q), k, v, fold_query_major(o), lse_folded, 0.0, false, m, scale);
    return {unfold_query_major(dq, nq), dk.contiguous(), dv.contiguous()};
  }
  if (folds(group, mask)) {
    const auto lse_folded = lse.contiguous().view({q.size(0), k.size(1), group * q.size(2)});
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        fold_queries(dout, group), fold_queries(q, group), k, v, fold_queries(o, group), lse_folded, 0.0, false,
        folded_mask(mask, group), scale);
    return {dq.reshape(q.sizes()).contiguous(), dk.contiguous(), dv.contiguous()};
  }
  auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      dout.contiguous(), q, expand_heads(k, group), expand_heads(v, group), o, lse, 0.0,
      mask.kind == MaskKind::causal, flash_mask(mask), scale);
  return {dq.contiguous(), sum_groups(dk, group).contiguous(), sum_groups(dv, group).contiguous()};
}

}  // namespace lf::backend

// The reference DSA ops (backend/op_table.h, DeepSeek Sparse Attention): the lightning indexer's
// scores as one dense [b, sq, sk] tensor (and [b, sq, nh, sk] per head in the backward), the
// top-k by a stable descending sort, and the sparse attention as the sdpa reference under the
// boolean mask of the selected keys ([b, 1, sq, sk], scores [b, nq, sq, sk]). Quadratic memory
// on purpose: the plain statement of the math every fused path is checked against.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <limits>

#include "loongforge/backend/reference_ops.h"
#include "loongforge/core/error.h"

namespace lf::backend {
namespace {

at::ScalarType compute_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// [sq, sk] bool: key t visible from query s (bottom-right causal).
at::Tensor causal_visible(int64_t sq, int64_t sk, const at::TensorOptions& o) {
  auto s = at::arange(sq, o.dtype(at::kLong)).unsqueeze(1);
  auto t = at::arange(sk, o.dtype(at::kLong)).unsqueeze(0);
  return t.le(s + (sk - sq));
}

// Per head, before the weights: A[b, s, j, t] = scale <qi[b, s, j], ki[b, t]>.
at::Tensor head_scores(const at::Tensor& qi, const at::Tensor& ki, double scale, at::ScalarType ct) {
  return at::matmul(qi.to(ct), ki.to(ct).transpose(1, 2).unsqueeze(1)) * scale;  // [b, sq, nh, sk]
}

// The dense index scores I [b, sq, sk] (unmasked).
at::Tensor dense_index_scores(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w, double scale,
                              at::ScalarType ct) {
  auto a = at::relu(head_scores(qi, ki, scale, ct));
  return (a * w.to(ct).unsqueeze(-1)).sum(2);
}

// [b, 1, sq, sk] bool: the selected keys of each query.
at::Tensor selection_mask(const at::Tensor& indices, int64_t sk) {
  const int64_t b = indices.size(0), sq = indices.size(1);
  auto valid = indices.ge(0);
  auto m = at::zeros({b, sq, sk + 1}, indices.options().dtype(at::kBool));
  // -1 slots land in the extra column sk, dropped below.
  m.scatter_(2, at::where(valid, indices, at::full_like(indices, sk)), true);
  return m.narrow(2, 0, sk).unsqueeze(1);
}

}  // namespace

void check_dsa_indexer_args(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w) {
  LF_CHECK(qi.dim() == 4 && ki.dim() == 3 && w.dim() == 3,
           "dsa indexer: qi must be [b, sq, heads, d], ki [b, sk, d] and w [b, sq, heads]; got qi ", qi.sizes(),
           ", ki ", ki.sizes(), ", w ", w.sizes());
  LF_CHECK(ki.size(0) == qi.size(0) && ki.size(2) == qi.size(3) && w.size(0) == qi.size(0) &&
               w.size(1) == qi.size(1) && w.size(2) == qi.size(2),
           "dsa indexer: shapes disagree: qi ", qi.sizes(), ", ki ", ki.sizes(), ", w ", w.sizes());
  LF_CHECK(ki.size(1) >= qi.size(1), "dsa indexer: ", qi.size(1), " queries but only ", ki.size(1),
           " keys (the causal mask is bottom-right aligned: sk >= sq)");
}

void check_dsa_indices(const at::Tensor& indices, int64_t b, int64_t sq, int64_t sk) {
  LF_CHECK(indices.dim() == 3 && indices.size(0) == b && indices.size(1) == sq &&
               indices.scalar_type() == at::kLong,
           "dsa: indices must be int64 [", b, ", ", sq, ", topk], got ", indices.scalar_type(), " ",
           indices.sizes());
  if (indices.numel() > 0) {
    const int64_t lo = indices.min().item<int64_t>(), hi = indices.max().item<int64_t>();
    LF_CHECK(lo >= -1 && hi < sk, "dsa: selected key indices must lie in [0, ", sk, ") or be -1, got [", lo, ", ",
             hi, "]");
  }
}

void check_dsa_attention_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& indices) {
  check_sdpa_args(q, k, v, AttentionMask::none());
  check_dsa_indices(indices, q.size(0), q.size(2), k.size(2));
}

at::Tensor ReferenceOps::dsa_indexer_topk(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                                          double scale, int64_t topk) const {
  check_dsa_indexer_args(qi, ki, w);
  const int64_t sq = qi.size(1), sk = ki.size(1);
  LF_CHECK(topk >= 1 && topk <= sk, "dsa_indexer_topk: topk ", topk, " must lie in [1, ", sk, "] (the keys)");
  auto scores = dense_index_scores(qi, ki, w, scale, compute_type(qi));
  scores = scores.masked_fill(causal_visible(sq, sk, scores.options()).logical_not(),
                              -std::numeric_limits<double>::infinity());
  // Stable: equal scores keep the lower key index first.
  auto [sorted, order] = at::sort(scores, /*stable=*/true, /*dim=*/-1, /*descending=*/true);
  auto top = order.narrow(-1, 0, topk);
  return at::where(at::isinf(sorted.narrow(-1, 0, topk)), at::full_like(top, -1), top).contiguous();
}

at::Tensor ReferenceOps::dsa_indexer_scores_fwd(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                                                const at::Tensor& indices, double scale) const {
  check_dsa_indexer_args(qi, ki, w);
  check_dsa_indices(indices, qi.size(0), qi.size(1), ki.size(1));
  const auto ct = compute_type(qi);
  auto dense = dense_index_scores(qi, ki, w, scale, ct);  // [b, sq, sk]
  auto valid = indices.ge(0);
  auto picked = dense.gather(2, indices.clamp_min(0));
  return picked.masked_fill(valid.logical_not(), -std::numeric_limits<double>::infinity()).contiguous();
}

// I = sum_j w_j relu(A_j), A_j = scale <q_j, k>:  dw_j = sum_t dI_t relu(A_jt),
// dA_j = dI w_j [A_j > 0],  dq_j = scale sum_t dA_jt k_t,  dk_t = scale sum_{s, j} dA_sjt q_sj.
DsaIndexerBwd ReferenceOps::dsa_indexer_scores_bwd(const at::Tensor& dscores, const at::Tensor& qi,
                                                   const at::Tensor& ki, const at::Tensor& w,
                                                   const at::Tensor& indices, double scale) const {
  check_dsa_indexer_args(qi, ki, w);
  const int64_t b = qi.size(0), sq = qi.size(1), sk = ki.size(1);
  check_dsa_indices(indices, b, sq, sk);
  const auto ct = compute_type(qi);
  auto valid = indices.ge(0);
  // Scatter the selected slots' gradients into [b, sq, sk] (an extra column takes the -1 slots).
  auto dense = at::zeros({b, sq, sk + 1}, dscores.options().dtype(ct));
  dense.scatter_(2, at::where(valid, indices, at::full_like(indices, sk)),
                 at::where(valid, dscores.to(ct), at::zeros_like(dscores, dense.options())));
  auto di = dense.narrow(2, 0, sk).unsqueeze(2);  // [b, sq, 1, sk]
  auto a = head_scores(qi, ki, scale, ct);       // [b, sq, nh, sk]
  auto dw = (di * at::relu(a)).sum(-1);          // [b, sq, nh]
  auto da = di * w.to(ct).unsqueeze(-1) * a.gt(0).to(ct) * scale;
  auto dq = at::matmul(da, ki.to(ct).unsqueeze(1));                        // [b, sq, nh, di]
  // A key's gradient sums over every (query, head) that selected it (up to sq nh terms): fp64
  // accumulation (op_table.h), so that implementations summing in other orders agree.
  auto dk = at::matmul(da.permute({0, 3, 1, 2}).reshape({b, sk, -1}).to(at::kDouble),  // [b, sk, sq nh]
                       qi.to(at::kDouble).reshape({b, -1, qi.size(3)}));               // [b, sq nh, di]
  return {dq.to(qi.scalar_type()).contiguous(), dk.to(ki.scalar_type()).contiguous(),
          dw.to(w.scalar_type()).contiguous()};
}

DsaAttentionFwd ReferenceOps::dsa_sparse_attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& indices, double scale) const {
  check_dsa_attention_args(q, k, v, indices);
  const auto ct = compute_type(q);
  const int64_t group = q.size(1) / k.size(1);
  auto mask = AttentionMask::boolean(selection_mask(indices, k.size(2)));
  auto r = ReferenceOps::sdpa_fwd(q, k, v, mask, scale);
  // The probabilities again, densely: [b, nq, sq, sk] summed over heads, read at the selection.
  auto kf = k.to(ct).repeat_interleave(group, 1);
  auto s = (at::matmul(q.to(ct), kf.transpose(-2, -1)) * scale).masked_fill(mask.mask.logical_not(),
                                                                           -std::numeric_limits<double>::infinity());
  auto lse = r.lse.to(ct).unsqueeze(-1);
  auto p = at::where(at::isinf(lse), at::zeros_like(s), at::exp(s - lse)).sum(1);  // [b, sq, sk]
  auto valid = indices.ge(0);
  auto head_prob = p.gather(2, indices.clamp_min(0)).masked_fill(valid.logical_not(), 0.0);
  return {r.o, r.lse, head_prob.to(r.lse.scalar_type()).contiguous()};
}

DsaAttentionBwd ReferenceOps::dsa_sparse_attention_bwd(const at::Tensor& dout, const at::Tensor& q,
                                                       const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& indices, const at::Tensor& o,
                                                       const at::Tensor& lse, double scale) const {
  check_dsa_attention_args(q, k, v, indices);
  auto g = ReferenceOps::sdpa_bwd(dout, q, k, v, o, lse, AttentionMask::boolean(selection_mask(indices, k.size(2))),
                                  scale);
  return {g.dq, g.dk, g.dv};
}

}  // namespace lf::backend

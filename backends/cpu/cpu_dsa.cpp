// The CPU backend's fused DSA ops (backend/op_table.h, DeepSeek Sparse Attention): every op walks
// the sequence in blocks of queries sized so that a block's working set stays under a fixed
// number of elements, so nothing of size [b, nq, sq, sk] (nor [b, sq, sk]) ever exists:
// - the indexer's top-k scores one block against the keys it may see ([block, nh, t]) and selects
//   each row's best keys in place (nth_element on (score desc, key asc): the reference's stable
//   order, without sorting the whole row);
// - the indexer's scores and the sparse attention gather each block's selected keys ([nkv,
//   block, topk, d]), and their backward passes scatter-add the keys' gradients back (index_add).
// Peak memory is the inputs, the outputs and one block: linear in the sequence length
// (docs/performance.md, "DSA: fused sparse attention memory").
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu_ops.h"
#include "loongforge/core/error.h"

namespace lf::backend {
namespace {

// Elements one block may hold in its largest temporary (16 MiB of fp32).
constexpr int64_t kBlockElements = int64_t{1} << 22;

at::ScalarType compute_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

int64_t block_rows(int64_t per_row, int64_t rows) {
  return std::clamp<int64_t>(kBlockElements / std::max<int64_t>(per_row, 1), 1, std::max<int64_t>(rows, 1));
}

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Rows [0, rows) of scores (row r is query s0 + r, `width` keys) -> out [rows, topk]: the indices
// of each row's topk best visible keys (t <= s0 + r + off) by score descending, ties to the lower
// key; -1 past the visible keys.
template <typename T>
void select_top(const T* scores, int64_t rows, int64_t width, int64_t s0, int64_t off, int64_t topk, int64_t* out) {
  at::parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
    std::vector<int64_t> idx;
    for (int64_t r = lo; r < hi; ++r) {
      const T* row = scores + r * width;
      const int64_t n = std::clamp<int64_t>(s0 + r + off + 1, 0, width);
      idx.resize(static_cast<size_t>(n));
      std::iota(idx.begin(), idx.end(), int64_t{0});
      auto before = [row](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
      const int64_t m = std::min(n, topk);
      if (m < n) std::nth_element(idx.begin(), idx.begin() + m, idx.end(), before);
      std::sort(idx.begin(), idx.begin() + m, before);
      int64_t* o = out + r * topk;
      for (int64_t j = 0; j < topk; ++j) o[j] = j < m ? idx[static_cast<size_t>(j)] : -1;
    }
  });
}

// One block's gathered selection: the indices [c, K] of batch row bi, their validity, and the
// flattened safe indices (-1 -> 0; the invalid slots are masked or carry zero gradients).
struct Selection {
  at::Tensor valid;  // [c, K] bool
  at::Tensor flat;   // [c K] int64
};
Selection selection(const at::Tensor& indices, int64_t bi, int64_t s0, int64_t c) {
  auto idx = indices.select(0, bi).narrow(0, s0, c);
  return {idx.ge(0), idx.clamp_min(0).reshape({-1})};
}

}  // namespace

at::Tensor CpuOps::dsa_indexer_topk(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w, double scale,
                                    int64_t topk) const {
  check_dsa_indexer_args(qi, ki, w);
  const int64_t b = qi.size(0), sq = qi.size(1), nh = qi.size(2), sk = ki.size(1), off = sk - sq;
  LF_CHECK(topk >= 1 && topk <= sk, "dsa_indexer_topk: topk ", topk, " must lie in [1, ", sk, "] (the keys)");
  const auto ct = compute_type(qi);
  auto out = at::empty({b, sq, topk}, qi.options().dtype(at::kLong));
  const int64_t c = block_rows(nh * sk, sq);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t s0 = 0; s0 < sq; s0 += c) {
      const int64_t n = std::min(c, sq - s0), t = std::min(sk, s0 + n + off);  // keys the block may see
      auto q = qi.select(0, bi).narrow(0, s0, n).to(ct);                       // [n, nh, di]
      auto k = ki.select(0, bi).narrow(0, 0, t).to(ct);                        // [t, di]
      auto a = at::relu(at::matmul(q, k.t()) * scale);                         // [n, nh, t]
      auto scores = (a * w.select(0, bi).narrow(0, s0, n).to(ct).unsqueeze(-1)).sum(1).contiguous();  // [n, t]
      a.reset();
      int64_t* o = out.select(0, bi).narrow(0, s0, n).data_ptr<int64_t>();
      if (ct == at::kDouble)
        select_top(scores.data_ptr<double>(), n, t, s0, off, topk, o);
      else
        select_top(scores.data_ptr<float>(), n, t, s0, off, topk, o);
    }
  }
  return out;
}

at::Tensor CpuOps::dsa_indexer_scores_fwd(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                                          const at::Tensor& indices, double scale) const {
  check_dsa_indexer_args(qi, ki, w);
  const int64_t b = qi.size(0), sq = qi.size(1), nh = qi.size(2), di = qi.size(3);
  check_dsa_indices(indices, b, sq, ki.size(1));
  const int64_t kk = indices.size(2);
  const auto ct = compute_type(qi);
  auto out = at::empty({b, sq, kk}, qi.options().dtype(ct));
  const int64_t c = block_rows(kk * (di + nh), sq);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t s0 = 0; s0 < sq; s0 += c) {
      const int64_t n = std::min(c, sq - s0);
      auto sel = selection(indices, bi, s0, n);
      auto kg = ki.select(0, bi).index_select(0, sel.flat).to(ct).view({n, kk, di});
      auto q = qi.select(0, bi).narrow(0, s0, n).to(ct);                        // [n, nh, di]
      auto a = at::relu(at::matmul(q, kg.transpose(1, 2)) * scale);             // [n, nh, K]
      auto scores = (a * w.select(0, bi).narrow(0, s0, n).to(ct).unsqueeze(-1)).sum(1);
      out.select(0, bi).narrow(0, s0, n).copy_(scores.masked_fill(sel.valid.logical_not(), kNegInf));
    }
  }
  return out;
}

DsaIndexerBwd CpuOps::dsa_indexer_scores_bwd(const at::Tensor& dscores, const at::Tensor& qi, const at::Tensor& ki,
                                             const at::Tensor& w, const at::Tensor& indices, double scale) const {
  check_dsa_indexer_args(qi, ki, w);
  const int64_t b = qi.size(0), sq = qi.size(1), nh = qi.size(2), di = qi.size(3);
  check_dsa_indices(indices, b, sq, ki.size(1));
  const int64_t kk = indices.size(2);
  const auto ct = compute_type(qi);
  auto dq = at::empty(qi.sizes(), qi.options().dtype(ct));
  auto dk = at::zeros(ki.sizes(), ki.options().dtype(at::kDouble));  // fp64 accumulation (op_table.h)
  auto dw = at::empty(w.sizes(), w.options().dtype(ct));
  const int64_t c = block_rows(kk * (2 * di + 2 * nh), sq);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t s0 = 0; s0 < sq; s0 += c) {
      const int64_t n = std::min(c, sq - s0);
      auto sel = selection(indices, bi, s0, n);
      auto kg = ki.select(0, bi).index_select(0, sel.flat).to(ct).view({n, kk, di});
      auto q = qi.select(0, bi).narrow(0, s0, n).to(ct);                        // [n, nh, di]
      auto wb = w.select(0, bi).narrow(0, s0, n).to(ct);                        // [n, nh]
      auto a = at::matmul(q, kg.transpose(1, 2)) * scale;                       // [n, nh, K]
      auto d = at::where(sel.valid, dscores.select(0, bi).narrow(0, s0, n).to(ct), 0.0).unsqueeze(1);  // [n, 1, K]
      dw.select(0, bi).narrow(0, s0, n).copy_((d * at::relu(a)).sum(-1));
      auto da = d * wb.unsqueeze(-1) * a.gt(0).to(ct) * scale;                  // [n, nh, K]
      dq.select(0, bi).narrow(0, s0, n).copy_(at::matmul(da, kg));
      dk.select(0, bi).index_add_(0, sel.flat, at::matmul(da.transpose(1, 2), q).reshape({n * kk, di}).to(at::kDouble));
    }
  }
  return {dq.to(qi.scalar_type()), dk.to(ki.scalar_type()), dw.to(w.scalar_type())};
}

namespace {

// One block of the sparse attention: batch row bi, queries [s0, s0 + n), the selected keys and
// values gathered per kv head, and the probabilities recomputed from lse when it is given.
struct AttentionBlock {
  Selection sel;
  at::Tensor q;      // [nkv, n, g, d]
  at::Tensor kg;     // [nkv, n, K, d]
  at::Tensor vg;     // [nkv, n, K, dv]
  at::Tensor s;      // [nkv, n, g, K] scaled scores, -inf at -1 slots
};
AttentionBlock attention_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& indices, double scale, int64_t bi, int64_t s0, int64_t n,
                               at::ScalarType ct) {
  const int64_t nkv = k.size(1), g = q.size(1) / nkv, d = q.size(3), dv = v.size(3), kk = indices.size(2);
  AttentionBlock blk;
  blk.sel = selection(indices, bi, s0, n);
  blk.kg = k.select(0, bi).index_select(1, blk.sel.flat).to(ct).view({nkv, n, kk, d});
  blk.vg = v.select(0, bi).index_select(1, blk.sel.flat).to(ct).view({nkv, n, kk, dv});
  blk.q = q.select(0, bi).narrow(1, s0, n).to(ct).reshape({nkv, g, n, d}).permute({0, 2, 1, 3});
  blk.s = (at::matmul(blk.q, blk.kg.transpose(-2, -1)) * scale)
              .masked_fill(blk.sel.valid.logical_not().view({1, n, 1, kk}), kNegInf);
  return blk;
}

// p = exp(s - lse), 0 in rows without a selected key. lse: [nkv, n, g, 1].
at::Tensor probs(const at::Tensor& s, const at::Tensor& lse) {
  return at::where(at::isinf(lse), at::zeros_like(s), at::exp(s - lse));
}

}  // namespace

DsaAttentionFwd CpuOps::dsa_sparse_attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const at::Tensor& indices, double scale) const {
  check_dsa_attention_args(q, k, v, indices);
  const int64_t b = q.size(0), nq = q.size(1), sq = q.size(2), nkv = k.size(1), d = q.size(3), dv = v.size(3),
                kk = indices.size(2);
  const auto ct = compute_type(q);
  auto o = at::empty({b, nq, sq, dv}, q.options());
  auto lse = at::empty({b, nq, sq}, q.options().dtype(ct));
  auto head_prob = at::empty({b, sq, kk}, q.options().dtype(ct));
  const int64_t c = block_rows(nkv * kk * (d + dv) + nq * kk, sq);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t s0 = 0; s0 < sq; s0 += c) {
      const int64_t n = std::min(c, sq - s0);
      auto blk = attention_block(q, k, v, indices, scale, bi, s0, n, ct);
      auto l = at::logsumexp(blk.s, {-1}, true);                                // [nkv, n, g, 1]
      auto p = probs(blk.s, l);
      auto ob = at::matmul(p, blk.vg);                                          // [nkv, n, g, dv]
      o.select(0, bi).narrow(1, s0, n).copy_(ob.permute({0, 2, 1, 3}).reshape({nq, n, dv}));
      lse.select(0, bi).narrow(1, s0, n).copy_(l.squeeze(-1).permute({0, 2, 1}).reshape({nq, n}));
      head_prob.select(0, bi).narrow(0, s0, n).copy_(p.sum(at::IntArrayRef{0, 2}));
    }
  }
  return {o, lse, head_prob};
}

// As sdpa_bwd (reference_ops.cpp) on the gathered keys: dS = P * (dP - D), D = rowsum(do * o),
// dq = scale dS k, and dk, dv scattered back to the keys they were gathered from.
DsaAttentionBwd CpuOps::dsa_sparse_attention_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& indices, const at::Tensor& o,
                                                 const at::Tensor& lse, double scale) const {
  check_dsa_attention_args(q, k, v, indices);
  const int64_t b = q.size(0), nq = q.size(1), sq = q.size(2), nkv = k.size(1), g = nq / nkv, d = q.size(3),
                dv = v.size(3), kk = indices.size(2);
  const auto ct = compute_type(q);
  auto dq = at::empty(q.sizes(), q.options().dtype(ct));
  auto dk = at::zeros(k.sizes(), k.options().dtype(ct));
  auto dvv = at::zeros(v.sizes(), v.options().dtype(ct));
  const int64_t c = block_rows(2 * nkv * kk * (d + dv) + 3 * nq * kk, sq);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t s0 = 0; s0 < sq; s0 += c) {
      const int64_t n = std::min(c, sq - s0);
      auto blk = attention_block(q, k, v, indices, scale, bi, s0, n, ct);
      auto per_head = [&](const at::Tensor& x, int64_t last) {  // [nq, n, last] -> [nkv, n, g, last]
        return x.select(0, bi).narrow(1, s0, n).to(ct).reshape({nkv, g, n, last}).permute({0, 2, 1, 3});
      };
      auto l = lse.select(0, bi).narrow(1, s0, n).to(ct).reshape({nkv, g, n}).permute({0, 2, 1}).unsqueeze(-1);
      auto p = probs(blk.s, l);                                                 // [nkv, n, g, K]
      auto dob = per_head(dout, dv), ob = per_head(o, dv);
      auto ds = p * (at::matmul(dob, blk.vg.transpose(-2, -1)) - (dob * ob).sum(-1, true));
      dq.select(0, bi).narrow(1, s0, n).copy_((at::matmul(ds, blk.kg) * scale).permute({0, 2, 1, 3}).reshape({nq, n, d}));
      auto dkg = at::matmul(ds.transpose(-2, -1), blk.q) * scale;               // [nkv, n, K, d]
      auto dvg = at::matmul(p.transpose(-2, -1), dob);                          // [nkv, n, K, dv]
      dk.select(0, bi).index_add_(1, blk.sel.flat, dkg.reshape({nkv, n * kk, d}));
      dvv.select(0, bi).index_add_(1, blk.sel.flat, dvg.reshape({nkv, n * kk, dv}));
    }
  }
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dvv.to(v.scalar_type())};
}

}  // namespace lf::backend

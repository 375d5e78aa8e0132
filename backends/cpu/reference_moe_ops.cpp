// The reference MoE ops (backend/op_table.h): token permutation by a stable sort on the expert
// index, the probability-weighted return, and the grouped GEMM as one GEMM per group written
// straight into its rows of the output. Device-agnostic ATen (the CUDA and XPU backends run it
// on their tensors); deterministic on the CPU.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "loongforge/backend/reference_ops.h"
#include "loongforge/core/error.h"

namespace lf::backend {
namespace {

at::ScalarType compute_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::vector<int64_t> host_counts(const at::Tensor& counts) {
  auto c = counts.to(at::kCPU).to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace

void check_moe_permute_args(const at::Tensor& x, const at::Tensor& indices, int64_t num_experts) {
  LF_CHECK(x.dim() == 2, "moe_permute: x must be [tokens, hidden], got ", x.sizes());
  LF_CHECK(indices.dim() == 2 && indices.size(0) == x.size(0) && indices.scalar_type() == at::kLong,
           "moe_permute: indices must be int64 [", x.size(0), ", k], got ", indices.scalar_type(), " ",
           indices.sizes());
  LF_CHECK(num_experts > 0, "moe_permute: num_experts must be positive, got ", num_experts);
  if (indices.numel() > 0) {
    const int64_t lo = indices.min().item<int64_t>(), hi = indices.max().item<int64_t>();
    LF_CHECK(lo >= -1 && hi < num_experts, "moe_permute: expert indices must lie in [0, ", num_experts,
             ") or be -1 (dropped), got the range [", lo, ", ", hi, "]");
  }
}

void check_moe_unpermute_args(const at::Tensor& y, const at::Tensor& position, const at::Tensor& probs) {
  LF_CHECK(y.dim() == 2, "moe_unpermute: y must be [rows, hidden], got ", y.sizes());
  LF_CHECK(position.dim() == 2 && position.scalar_type() == at::kLong,
           "moe_unpermute: position must be int64 [tokens, k], got ", position.scalar_type(), " ",
           position.sizes());
  LF_CHECK(probs.sizes() == position.sizes(), "moe_unpermute: probs ", probs.sizes(), " must match position ",
           position.sizes());
}

void check_grouped_gemm_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) {
  LF_CHECK(x.dim() == 2 && w.dim() == 3 && x.size(1) == w.size(2),
           "grouped_gemm: x must be [m, k_in] and w [groups, n_out, k_in], got x ", x.sizes(), " and w ",
           w.sizes());
  LF_CHECK(x.scalar_type() == w.scalar_type(), "grouped_gemm: x (", x.scalar_type(), ") and w (",
           w.scalar_type(), ") must share a dtype");
  LF_CHECK(counts.dim() == 1 && counts.size(0) == w.size(0), "grouped_gemm: counts must be [", w.size(0),
           "] (one per group), got ", counts.sizes());
  int64_t total = 0;
  for (int64_t c : host_counts(counts)) {
    LF_CHECK(c >= 0, "grouped_gemm: a group count is negative (", c, ")");
    total += c;
  }
  LF_CHECK(total == x.size(0), "grouped_gemm: the group counts sum to ", total, " but x has ", x.size(0), " rows");
}

MoePermuteFwd ReferenceOps::moe_permute_fwd(const at::Tensor& x, const at::Tensor& indices,
                                            int64_t num_experts) const {
  check_moe_permute_args(x, indices, num_experts);
  const int64_t n = indices.size(0), k = indices.size(1);
  auto flat = indices.reshape({-1});
  // Dropped slots sort after every expert; the stable sort keeps (token, slot) order per expert.
  auto key = at::where(flat < 0, at::full_like(flat, num_experts), flat);
  auto order = at::argsort(key, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  auto tokens_per_expert = at::bincount(key, {}, num_experts + 1).narrow(0, 0, num_experts).to(at::kCPU);
  const int64_t m = tokens_per_expert.sum().item<int64_t>();
  order = order.narrow(0, 0, m);
  MoePermuteFwd r;
  r.source = at::floor_divide(order, k);
  r.permuted = x.index_select(0, r.source);
  auto position = at::full({n * k}, -1, indices.options());
  position.index_put_({order}, at::arange(m, indices.options()));
  r.position = position.view({n, k});
  r.tokens_per_expert = tokens_per_expert;
  return r;
}

at::Tensor ReferenceOps::moe_permute_bwd(const at::Tensor& dpermuted, const at::Tensor& source,
                                         int64_t num_tokens) const {
  LF_CHECK(dpermuted.dim() == 2 && source.dim() == 1 && source.size(0) == dpermuted.size(0),
           "moe_permute_bwd: dpermuted [m, h] and source [m] must agree, got ", dpermuted.sizes(), " and ",
           source.sizes());
  const auto ct = compute_type(dpermuted);
  auto dx = at::zeros({num_tokens, dpermuted.size(1)}, dpermuted.options().dtype(ct));
  dx.index_add_(0, source, dpermuted.to(ct));
  return dx.to(dpermuted.scalar_type());
}

at::Tensor ReferenceOps::moe_unpermute_fwd(const at::Tensor& y, const at::Tensor& position,
                                           const at::Tensor& probs) const {
  check_moe_unpermute_args(y, position, probs);
  const int64_t n = position.size(0), k = position.size(1), h = y.size(1);
  const auto ct = compute_type(y);
  auto valid = position >= 0;
  // Every slot dropped (an expert-parallel rank that no token reached): no row to gather.
  auto rows = y.size(0) == 0 ? at::zeros({n, k, h}, y.options().dtype(ct))
                             : y.index_select(0, position.clamp_min(0).reshape({-1})).view({n, k, h}).to(ct);
  auto w = at::where(valid, probs.to(ct), at::zeros({}, probs.options().dtype(ct)));
  return (rows * w.unsqueeze(-1)).sum(1).to(y.scalar_type());
}

MoeUnpermuteBwd ReferenceOps::moe_unpermute_bwd(const at::Tensor& dout, const at::Tensor& y,
                                                const at::Tensor& position, const at::Tensor& probs) const {
  check_moe_unpermute_args(y, position, probs);
  const int64_t n = position.size(0), k = position.size(1), h = y.size(1);
  LF_CHECK(dout.dim() == 2 && dout.size(0) == n && dout.size(1) == h, "moe_unpermute_bwd: dout must be [", n, ", ",
           h, "], got ", dout.sizes());
  const auto ct = compute_type(y);
  auto valid = position >= 0;
  auto flat_pos = position.clamp_min(0).reshape({-1});
  auto rows = y.size(0) == 0 ? at::zeros({n, k, h}, y.options().dtype(ct)) : y.index_select(0, flat_pos).view({n, k, h}).to(ct);
  auto g = dout.to(ct);
  auto zero = at::zeros({}, probs.options().dtype(ct));
  MoeUnpermuteBwd r;
  r.dprobs = at::where(valid, (rows * g.unsqueeze(1)).sum(-1), zero).to(probs.scalar_type());
  // Every valid slot owns exactly one row of y; dropped slots scatter nothing.
  auto contrib = (g.unsqueeze(1) * at::where(valid, probs.to(ct), zero).unsqueeze(-1)).reshape({n * k, h});
  auto keep = valid.reshape({-1}).nonzero().squeeze(1);
  auto dy = at::zeros({y.size(0), h}, y.options().dtype(ct));
  dy.index_copy_(0, flat_pos.index_select(0, keep), contrib.index_select(0, keep));
  r.dy = dy.to(y.scalar_type());
  return r;
}

at::Tensor ReferenceOps::grouped_gemm_fwd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) const {
  check_grouped_gemm_args(x, w, counts);
  auto y = at::empty({x.size(0), w.size(1)}, x.options());
  int64_t row = 0;
  const auto c = host_counts(counts);
  for (size_t g = 0; g < c.size(); ++g) {
    if (c[g] == 0) continue;
    auto out = y.narrow(0, row, c[g]);
    at::mm_out(out, x.narrow(0, row, c[g]), w[static_cast<int64_t>(g)].t());
    row += c[g];
  }
  return y;
}

GroupedGemmBwd ReferenceOps::grouped_gemm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                              const at::Tensor& counts, GemmGrads want) const {
  check_grouped_gemm_args(x, w, counts);
  LF_CHECK(dy.dim() == 2 && dy.size(0) == x.size(0) && dy.size(1) == w.size(1), "grouped_gemm_bwd: dy must be [",
           x.size(0), ", ", w.size(1), "], got ", dy.sizes());
  GroupedGemmBwd r;
  auto d = dy.to(x.scalar_type()).contiguous();
  if (want.dx) r.dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  if (want.dw) r.dw = at::zeros_like(w, at::MemoryFormat::Contiguous);
  int64_t row = 0;
  const auto c = host_counts(counts);
  for (size_t g = 0; g < c.size(); ++g) {
    if (c[g] == 0) continue;
    const auto gi = static_cast<int64_t>(g);
    auto dyg = d.narrow(0, row, c[g]);
    if (want.dx) {
      auto dx = r.dx.narrow(0, row, c[g]);
      at::mm_out(dx, dyg, w[gi]);
    }
    if (want.dw) {
      auto dw = r.dw[gi];
      at::mm_out(dw, dyg.t(), x.narrow(0, row, c[g]));
    }
    row += c[g];
  }
  return r;
}

}  // namespace lf::backend

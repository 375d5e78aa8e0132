// chunked_linear_cross_entropy (backend/chunked_cross_entropy.h). Per chunk of c tokens:
// z = x_c w^T (one GEMM into a reused [chunk, valid] buffer), the row max (all-reduced over the
// vocabulary shards), the target's shifted logit and the exp sums (all-reduced), the loss, dL/dz
// in place of z, then dx_c = dz w and dw += dz^T x_c. Three GEMMs as the reference, on c rows at a
// time.
#include "loongforge/backend/chunked_cross_entropy.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <limits>

#include "loongforge/backend/reference_ops.h"
#include "loongforge/core/error.h"

namespace lf::backend {

LinearCrossEntropyFwd chunked_linear_cross_entropy(const at::Tensor& x0, const at::Tensor& w, const at::Tensor& target,
                                                   const at::Tensor& weight, int64_t ignore_index,
                                                   const VocabShard& shard, int64_t chunk0, const GradInto& into,
                                                   const CrossEntropyRowOps& ops) {
  LF_CHECK(chunk0 >= 1, "chunked_linear_cross_entropy: chunk must be >= 1, got ", chunk0);
  const at::Tensor x = x0.contiguous();
  const int64_t n = x.size(0), h = x.size(1), v = w.size(0);
  const int64_t valid = shard.valid < 0 ? v : shard.valid;
  if (valid == 0) return empty_shard_linear_cross_entropy(x, w, target, weight, ignore_index, shard, chunk0, into);
  const at::Tensor wv = w.narrow(0, 0, valid);  // padding rows take no probability and get no gradient
  const int64_t chunk = std::min(chunk0, std::max<int64_t>(1, n));
  const auto f32 = x.options().dtype(at::kFloat);

  const auto targets = shard_targets(target, shard, valid, ignore_index);
  const at::Tensor safe = targets.safe.contiguous(), mine = targets.mine.contiguous();
  const at::Tensor wt = weight.to(at::kFloat).masked_fill(targets.ignored, 0.0).contiguous();

  LinearCrossEntropyFwd r;
  r.loss = at::empty({n}, f32);
  r.dx = at::empty({n, h}, x.options());
  WeightGradTarget dw(into, w, valid, n);

  at::Tensor buf = at::empty({chunk, valid}, x.options());
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t c = std::min(chunk, n - c0);
    const at::Tensor xc = x.narrow(0, c0, c);
    at::Tensor z = buf.narrow(0, 0, c);
    at::mm_out(z, xc, wv.t());
    const at::Tensor sc = safe.narrow(0, c0, c), mc = mine.narrow(0, c0, c);
    at::Tensor m = ops.row_max(z);
    if (shard.all_reduce) {
      at::Tensor m2 = m.view({1, c});
      shard.all_reduce(m2, true);
    }
    at::Tensor sums = ops.exp_sums(z, m, sc, mc);
    if (shard.all_reduce) shard.all_reduce(sums, false);
    r.loss.narrow(0, c0, c).copy_((sums[1].log() - sums[0]).masked_fill(targets.ignored.narrow(0, c0, c), 0.0));
    ops.grad_in_place(z, m, sums, sc, mc, wt.narrow(0, c0, c));
    at::Tensor dxc = r.dx.narrow(0, c0, c);
    at::mm_out(dxc, z, wv);
    if (!dw.skip) ops.add_weight_grad(dw.real, z, xc, /*write=*/c0 == 0 && dw.write_first(), dw.alpha);
  }
  r.dw = dw.result(w.scalar_type());
  return r;
}

LinearCrossEntropyFwd empty_shard_linear_cross_entropy(const at::Tensor& x, const at::Tensor& w,
                                                       const at::Tensor& target, const at::Tensor& weight,
                                                       int64_t ignore_index, const VocabShard& shard, int64_t chunk0,
                                                       const GradInto& into) {
  LF_CHECK(chunk0 >= 1, "empty_shard_linear_cross_entropy: chunk must be >= 1, got ", chunk0);
  const int64_t n = x.size(0), chunk = std::min(chunk0, std::max<int64_t>(1, n));
  const auto f32 = x.options().dtype(at::kFloat);
  const at::Tensor ignored = shard_targets(target, shard, 0, ignore_index).ignored;
  LinearCrossEntropyFwd r;
  r.loss = at::empty({n}, f32);
  r.dx = at::zeros({n, x.size(1)}, x.options());
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t c = std::min(chunk, n - c0);
    at::Tensor m = at::full({1, c}, -std::numeric_limits<float>::infinity(), f32);
    if (shard.all_reduce) shard.all_reduce(m, true);
    at::Tensor sums = at::zeros({2, c}, f32);
    if (shard.all_reduce) shard.all_reduce(sums, false);
    r.loss.narrow(0, c0, c).copy_((sums[1].log() - sums[0]).masked_fill(ignored.narrow(0, c0, c), 0.0));
  }
  // Every row is padding: the target's setup zeroes them all (unless added to).
  r.dw = WeightGradTarget(into, w, 0, n).result(w.scalar_type());
  return r;
}

WeightGradTarget::WeightGradTarget(const GradInto& into, const at::Tensor& w, int64_t valid, int64_t n)
    : skip(into.skip), direct(into.dw.defined()), add_first(into.dw.defined() && into.accumulate),
      alpha(into.dw.defined() ? into.scale : 1.0) {
  if (skip) return;
  const int64_t v = w.size(0);
  dw = direct ? into.dw : at::empty({v, w.size(1)}, w.options().dtype(at::kFloat));
  if (valid < v && !add_first) dw.narrow(0, valid, v - valid).zero_();
  real = dw.narrow(0, 0, valid);
  if (n == 0 && !add_first) real.zero_();
}

at::Tensor WeightGradTarget::result(at::ScalarType w_dtype) const {
  return direct || skip ? at::Tensor() : dw.to(w_dtype);
}

}  // namespace lf::backend

// The reference math of the output layer fused with the cross entropy, and of the squared
// gradient norm (backend/reference_ops.h): written out in full, unchunked, as the specification
// the chunked kernels of the CPU backend (cpu_train_ops.cpp) and any device backend are held to.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <limits>

#include "loongforge/backend/reference_ops.h"
#include "loongforge/core/error.h"

namespace lf::backend {

void check_linear_cross_entropy_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                                     const at::Tensor& weight, const VocabShard& shard) {
  LF_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
           "linear_cross_entropy: x must be [n, h] and w [v, h]; got x ", x.sizes(), ", w ", w.sizes(),
           lf::hint("flatten [s, b, h] hidden states to [s*b, h]"));
  LF_CHECK(target.dim() == 1 && target.size(0) == x.size(0) && target.scalar_type() == at::kLong,
           "linear_cross_entropy: target must be int64 [", x.size(0), "]; got ", target.scalar_type(), " ",
           target.sizes());
  LF_CHECK(weight.dim() == 1 && weight.size(0) == x.size(0) && weight.scalar_type() == at::kFloat,
           "linear_cross_entropy: weight must be fp32 [", x.size(0), "]; got ", weight.scalar_type(), " ",
           weight.sizes());
  LF_CHECK(x.scalar_type() == w.scalar_type(), "linear_cross_entropy: x is ", x.scalar_type(), " but w is ",
           w.scalar_type());
  LF_CHECK(shard.valid <= w.size(0) && shard.valid >= -1 && shard.start >= 0,
           "linear_cross_entropy: shard of ", shard.valid, " valid rows from ", shard.start, " for a w of ",
           w.size(0), " rows");
}

ShardTargets shard_targets(const at::Tensor& target, const VocabShard& shard, int64_t valid, int64_t ignore_index) {
  ShardTargets t;
  t.ignored = target.eq(ignore_index);
  at::Tensor local = target - shard.start;
  t.mine = local.ge(0).logical_and(local.lt(valid)).logical_and(t.ignored.logical_not());
  if (!shard.all_reduce && target.numel() > 0)
    LF_CHECK(t.mine.logical_or(t.ignored).all().item<bool>(), "linear_cross_entropy: a target is outside [0, ",
             valid, ") and is not ignore_index = ", ignore_index,
             lf::hint("check the tokenizer's vocabulary size against the model's"));
  t.safe = at::where(t.mine, local, at::zeros_like(local));
  return t;
}

void check_grad_into(const GradInto& into, const at::Tensor& w) {
  LF_CHECK(!into.skip || !into.dw.defined(), "linear_cross_entropy: a gradient destination for a weight whose "
           "gradient is skipped");
  if (!into.dw.defined()) return;
  LF_CHECK(into.dw.scalar_type() == at::kFloat && into.dw.sizes() == w.sizes() && into.dw.is_contiguous() &&
               into.dw.device() == w.device(),
           "linear_cross_entropy: the gradient destination must be a contiguous fp32 ", w.sizes(), " on ",
           w.device(), "; got ", into.dw.scalar_type(), " ", into.dw.sizes(), " on ", into.dw.device());
}

LinearCrossEntropyFwd ReferenceOps::linear_cross_entropy(const at::Tensor& x, const at::Tensor& w,
                                                         const at::Tensor& target, const at::Tensor& weight,
                                                         int64_t ignore_index, const VocabShard& shard,
                                                         int64_t /*chunk_tokens*/, const GradInto& into) const {
  check_linear_cross_entropy_args(x, w, target, weight, shard);
  check_grad_into(into, w);
  const int64_t v = w.size(0), valid = shard.valid < 0 ? v : shard.valid;
  const auto ct = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor z = at::matmul(x, w.t()).to(ct);  // [n, v]: the logits in x's dtype, then upcast
  if (valid < v) z.narrow(1, valid, v - valid).fill_(-std::numeric_limits<double>::infinity());
  auto reduce = [&](at::Tensor t, bool max) {
    if (!shard.all_reduce) return t;
    at::Tensor f = t.to(at::kFloat).contiguous();
    shard.all_reduce(f, max);
    return f.to(ct);
  };
  at::Tensor m = reduce(std::get<0>(z.max(1)).unsqueeze(0), true).squeeze(0);  // [n]
  const auto [ignored, mine, safe] = shard_targets(target, shard, valid, ignore_index);
  at::Tensor e = (z - m.unsqueeze(1)).exp();
  at::Tensor target_logit = (z.gather(1, safe.unsqueeze(1)).squeeze(1) - m).masked_fill(mine.logical_not(), 0.0);
  at::Tensor sums = reduce(at::stack({target_logit, e.sum(1)}), false);  // [2, n] over every rank
  LinearCrossEntropyFwd r;
  r.loss = (sums[1].log() - sums[0]).masked_fill(ignored, 0.0).to(at::kFloat);
  // dL/dz = weight (softmax - onehot(target)); ignored rows have no gradient.
  at::Tensor dz = e / sums[1].unsqueeze(1);
  dz = dz - at::zeros_like(dz).scatter_(1, safe.unsqueeze(1), mine.to(ct).unsqueeze(1));
  dz = dz * weight.to(ct).masked_fill(ignored, 0.0).unsqueeze(1);
  at::Tensor dzx = dz.to(x.scalar_type());
  r.dx = at::matmul(dzx, w).contiguous();
  if (into.skip) return r;
  r.dw = at::matmul(dzx.t(), x).to(w.scalar_type()).contiguous();
  if (into.dw.defined()) {  // the reference is about the math, not the memory: computed, then moved
    at::NoGradGuard no_grad;
    at::Tensor scaled = r.dw.to(at::kFloat) * into.scale;
    if (into.accumulate)
      into.dw.add_(scaled);
    else
      into.dw.copy_(scaled);
    r.dw = at::Tensor();
  }
  return r;
}

at::Tensor ReferenceOps::squared_norm(at::TensorList tensors) const {
  at::Tensor sq;
  for (const auto& t : tensors) {
    if (!sq.defined()) sq = at::zeros({1}, t.options().dtype(at::kDouble));
    sq += t.to(at::kDouble).pow(2).sum();
  }
  return sq.defined() ? sq : at::zeros({1}, at::TensorOptions().dtype(at::kDouble));
}

}  // namespace lf::backend

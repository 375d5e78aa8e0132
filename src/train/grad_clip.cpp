#include "loongforge/train/grad_clip.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace lf::train {

double global_grad_norm(const GradBuffer& grads, const GradNormGroups& groups) {
  const auto& params = grads.parameters();
  // One fp64 accumulator, pieces in a fixed order: the result does not depend on thread timing.
  // On the gradients' device: the collectives below may be NCCL, which takes device tensors only.
  at::Tensor sq = at::zeros({1}, grads.main_grad().options().dtype(at::kDouble));
  for (const auto& piece : grads.owned_pieces()) {
    const auto& p = params[static_cast<size_t>(piece.param)];
    if (p.partition_dim < 0 && groups.tp_rank != 0) continue;  // replicated: counted once
    if (p.tied_copy) continue;  // the first pipeline stage counts the tied embedding
    at::Tensor g = grads.reduced_grad(piece.bucket).narrow(0, piece.reduced_offset, piece.numel);
    sq += g.to(at::kDouble).pow(2).sum();
  }
  if (grads.options().distributed_optimizer && grads.dp_size() > 1)
    grads.dp()->all_reduce(sq, lf::backend::ReduceOp::sum);
  if (groups.model_parallel && groups.model_parallel->size() > 1)
    groups.model_parallel->all_reduce(sq, lf::backend::ReduceOp::sum);
  return std::sqrt(sq.item<double>());
}

double clip_grads(GradBuffer& grads, double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0;
  const double coeff = max_norm / (norm + 1e-6);
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < grads.buckets().size(); ++b) {
    at::Tensor g = grads.reduced_grad(static_cast<int>(b));
    g.mul_(coeff);
  }
  return coeff;
}

}  // namespace lf::train

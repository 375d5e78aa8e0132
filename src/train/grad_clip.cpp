#include "loongforge/train/grad_clip.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace lf::train {

double global_grad_norm(const std::vector<GradBuffer*>& grads, lf::backend::Communicator* world,
                        const lf::backend::OpTable* ops) {
  // fp64 accumulation, pieces in a fixed order: the result does not depend on thread timing.
  // On the gradients' device: the all-reduce may be NCCL, which takes device tensors only.
  std::vector<at::Tensor> pieces;
  at::TensorOptions options = at::TensorOptions().dtype(at::kDouble);
  for (const GradBuffer* g : grads) {
    options = g->main_grad().options().dtype(at::kDouble);
    const bool sharded = g->options().distributed_optimizer && g->dp_size() > 1;
    if (!sharded && g->dp_rank() != 0) continue;  // every DP rank holds the same reduced gradient
    const auto& params = g->parameters();
    for (const auto& piece : g->owned_pieces()) {
      const auto& p = params[static_cast<size_t>(piece.param)];
      if (!p.is_split() && p.tp_rank != 0) continue;  // replicated over TP: counted once
      if (p.tied_copy) continue;                      // the first pipeline stage counts the tied embedding
      pieces.push_back(g->reduced_grad(piece.bucket).narrow(0, piece.reduced_offset, piece.numel));
    }
  }
  at::Tensor sq;
  if (ops) {
    sq = ops->squared_norm(pieces).to(options.device());
  } else {
    sq = at::zeros({1}, options);
    for (const auto& r : pieces) sq += r.to(at::kDouble).pow(2).sum();
  }
  if (world && world->size() > 1) world->all_reduce(sq, lf::backend::ReduceOp::sum);
  return std::sqrt(sq.item<double>());
}

void scale_grads(const std::vector<GradBuffer*>& grads, double factor) {
  at::NoGradGuard no_grad;
  for (GradBuffer* g : grads)
    for (size_t b = 0; b < g->buckets().size(); ++b) {
      at::Tensor r = g->reduced_grad(static_cast<int>(b));
      r.mul_(factor);
    }
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

double clip_grads(const std::vector<GradBuffer*>& grads, double norm, double max_norm) {
  const double coeff = clip_coefficient(norm, max_norm);
  if (coeff != 1.0) scale_grads(grads, coeff);
  return coeff;
}

}  // namespace lf::train

#include "loongforge/train/optimizer.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "loongforge/core/error.h"

namespace lf::train {

AdamW::AdamW(GradBuffer& grads, const lf::config::OptimizerConfig& config,
             const lf::backend::DeviceBackend& backend, GradNormGroups norm_groups)
    : grads_(grads), config_(config), backend_(backend), norm_groups_(norm_groups),
      masters_(grads) {
  LF_CHECK(config.optimizer == "adam", "optimizer '", config.optimizer, "' is not implemented",
           lf::hint("use --optimizer adam (AdamW)"));
  for (const auto& m : masters_.shards()) {
    exp_avg_.push_back(at::zeros_like(m));
    exp_avg_sq_.push_back(at::zeros_like(m));
  }
  groups_[0].weight_decay = config.weight_decay;
  groups_[1].weight_decay = 0.0;
  const auto& params = grads.parameters();
  for (const auto& piece : grads.owned_pieces()) {
    Group& g = groups_[params[static_cast<size_t>(piece.param)].no_weight_decay ? 1 : 0];
    const auto b = static_cast<size_t>(piece.bucket);
    auto view = [&](const at::Tensor& t) { return t.narrow(0, piece.reduced_offset, piece.numel); };
    g.masters.push_back(view(masters_.shards()[b]));
    g.grads.push_back(view(grads.reduced_grad(piece.bucket)));
    g.exp_avg.push_back(view(exp_avg_[b]));
    g.exp_avg_sq.push_back(view(exp_avg_sq_[b]));
  }
}

StepResult AdamW::step(double lr, bool skip_nonfinite) {
  StepResult r;
  r.grad_norm = global_grad_norm(grads_, norm_groups_);
  if (!std::isfinite(r.grad_norm)) {
    LF_CHECK(skip_nonfinite, "gradient norm is ", r.grad_norm, " at optimizer step ", step_ + 1,
             lf::hint("lower --lr, enable --clip-grad, or check the data for corrupt tokens"));
    r.skipped = true;
    return r;
  }
  r.clip_coeff = clip_grads(grads_, r.grad_norm, config_.clip_grad);
  ++step_;
  at::NoGradGuard no_grad;
  for (auto& g : groups_) {
    if (g.masters.empty()) continue;
    lf::backend::AdamWHyper hyper;
    hyper.lr = lr;
    hyper.beta1 = config_.adam_beta1;
    hyper.beta2 = config_.adam_beta2;
    hyper.eps = config_.adam_eps;
    hyper.weight_decay = g.weight_decay;
    hyper.step = step_;
    backend_.ops().adamw_step(g.masters, g.grads, g.exp_avg, g.exp_avg_sq, hyper);
  }
  masters_.publish();
  return r;
}

int64_t AdamW::state_bytes() const {
  int64_t n = masters_.bytes();
  for (const auto& t : exp_avg_) n += t.numel() * static_cast<int64_t>(t.element_size());
  for (const auto& t : exp_avg_sq_) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

}  // namespace lf::train

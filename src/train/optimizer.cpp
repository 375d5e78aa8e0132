#include "loongforge/train/optimizer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "loongforge/core/error.h"

namespace lf::train {

Optimizer::Optimizer(std::vector<GradBuffer*> grads, const lf::config::OptimizerConfig& config,
                     const lf::backend::DeviceBackend& backend, lf::backend::Communicator* world)
    : config_(config), backend_(backend), world_(world) {
  LF_CHECK(config.optimizer == "adam" || config.optimizer == "sgd", "optimizer '", config.optimizer,
           "' is not implemented", lf::hint("use --optimizer adam (AdamW) or sgd"));
  groups_[0].weight_decay = config.weight_decay;
  groups_[1].weight_decay = 0.0;
  for (GradBuffer* g : grads) {
    BufferState st;
    st.grads = g;
    st.masters = std::make_unique<MasterParams>(*g);
    for (const auto& m : st.masters->shards()) {
      st.exp_avg.push_back(at::zeros_like(m));
      if (config.optimizer == "adam") st.exp_avg_sq.push_back(at::zeros_like(m));
    }
    states_.push_back(std::move(st));
  }
  for (auto& st : states_) {
    const auto& params = st.grads->parameters();
    for (const auto& piece : st.grads->owned_pieces()) {
      Group& g = groups_[params[static_cast<size_t>(piece.param)].no_weight_decay ? 1 : 0];
      const auto b = static_cast<size_t>(piece.bucket);
      auto view = [&](const at::Tensor& t) { return t.narrow(0, piece.reduced_offset, piece.numel); };
      g.masters.push_back(view(st.masters->shards()[b]));
      g.grads.push_back(view(st.grads->reduced_grad(piece.bucket)));
      g.exp_avg.push_back(view(st.exp_avg[b]));
      if (!st.exp_avg_sq.empty()) g.exp_avg_sq.push_back(view(st.exp_avg_sq[b]));
    }
  }
}

std::vector<GradBuffer*> Optimizer::grad_list() const {
  std::vector<GradBuffer*> out;
  for (const auto& st : states_) out.push_back(st.grads);
  return out;
}

std::vector<std::string> Optimizer::moment_kinds() const {
  if (config_.optimizer == "sgd") return {"momentum_buffer"};
  return {"exp_avg", "exp_avg_sq"};
}

std::vector<at::Tensor>& Optimizer::state(size_t buffer, const std::string& kind) {
  auto& st = states_.at(buffer);
  if (kind == "master") return st.masters->shards();
  if (kind == "exp_avg" || kind == "momentum_buffer") return st.exp_avg;
  if (kind == "exp_avg_sq") return st.exp_avg_sq;
  LF_FAIL("optimizer state '", kind, "' is not kept by ", config_.optimizer);
}

StepResult Optimizer::step(double lr, bool skip_nonfinite, double grad_scale) {
  StepResult r;
  const auto grads = grad_list();
  // AdamW applies the unscaling and the clipping inside its one pass over the gradients (the norm
  // of the scaled gradients is grad_scale times theirs: the scale is positive); SGD scales them.
  const bool folds = config_.optimizer == "adam";
  if (grad_scale != 1.0 && !folds) scale_grads(grads, grad_scale);
  r.grad_norm = global_grad_norm(grads, world_, &backend_.ops());
  if (folds) r.grad_norm *= grad_scale;
  if (!std::isfinite(r.grad_norm)) {
    LF_CHECK(skip_nonfinite, "gradient norm is ", r.grad_norm, " at optimizer step ", step_ + 1,
             lf::hint("lower --lr, enable --clip-grad, or check the data for corrupt tokens"));
    r.skipped = true;
    return r;
  }
  r.clip_coeff = folds ? clip_coefficient(r.grad_norm, config_.clip_grad)
                       : clip_grads(grads, r.grad_norm, config_.clip_grad);
  ++step_;
  at::NoGradGuard no_grad;
  for (auto& g : groups_) {
    if (g.masters.empty()) continue;
    if (config_.optimizer == "adam") {
      lf::backend::AdamWHyper hyper;
      hyper.lr = lr;
      hyper.beta1 = config_.adam_beta1;
      hyper.beta2 = config_.adam_beta2;
      hyper.eps = config_.adam_eps;
      hyper.weight_decay = g.weight_decay;
      hyper.step = step_;
      hyper.grad_scale = (folds ? grad_scale : 1.0) * r.clip_coeff;
      backend_.ops().adamw_step(g.masters, g.grads, g.exp_avg, g.exp_avg_sq, hyper);
      continue;
    }
    // SGD as torch.optim.SGD (dampening 0, no Nesterov): d = g + wd p; buf = d on the first step,
    // momentum * buf + d after; p -= lr * buf.
    for (size_t i = 0; i < g.masters.size(); ++i) {
      at::Tensor d = g.weight_decay != 0 ? g.grads[i] + g.weight_decay * g.masters[i] : g.grads[i];
      if (config_.sgd_momentum != 0) {
        if (step_ == 1)
          g.exp_avg[i].copy_(d);
        else
          g.exp_avg[i].mul_(config_.sgd_momentum).add_(d);
        g.masters[i].sub_(lr * g.exp_avg[i]);
      } else {
        g.masters[i].sub_(lr * d);
      }
    }
  }
  publish();
  return r;
}

void Optimizer::publish() {
  for (auto& st : states_) st.masters->publish();
}

void Optimizer::reset_masters_from_model() {
  for (auto& st : states_) st.masters->reset_from_model();
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const auto& st : states_) {
    n += st.masters->bytes();
    for (const auto& t : st.exp_avg) n += t.numel() * static_cast<int64_t>(t.element_size());
    for (const auto& t : st.exp_avg_sq) n += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return n;
}

}  // namespace lf::train

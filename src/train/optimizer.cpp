#include "loongforge/train/optimizer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "loongforge/core/error.h"

namespace lf::train {

AdamW::AdamW(const std::vector<lf::models::NamedParameter>& params,
             const lf::config::OptimizerConfig& config, const lf::backend::DeviceBackend& backend)
    : params_(params), config_(config), backend_(backend) {
  groups_.resize(2);
  groups_[0].weight_decay = config.weight_decay;
  groups_[1].weight_decay = 0.0;
  for (const auto& p : params_) {
    Group& g = groups_[p.no_weight_decay ? 1 : 0];
    at::Tensor master = p.tensor.scalar_type() == at::kFloat
                            ? p.tensor.detach()
                            : p.tensor.detach().to(at::kFloat).clone();
    g.params.push_back(p.tensor);
    g.masters.push_back(master);
    g.exp_avg.push_back(at::zeros_like(master));
    g.exp_avg_sq.push_back(at::zeros_like(master));
  }
}

void AdamW::reduce_gradients(lf::backend::Communicator* dp) {
  if (!dp || dp->size() == 1) return;
  std::vector<at::Tensor> grads;
  for (const auto& p : params_) {
    LF_CHECK(p.tensor.grad().defined(), "parameter ", p.name, " has no gradient after backward");
    grads.push_back(p.tensor.grad().reshape({-1}).to(at::kFloat));
  }
  auto flat = at::cat(grads);
  dp->all_reduce(flat, lf::backend::ReduceOp::avg);
  int64_t offset = 0;
  for (const auto& p : params_) {
    auto g = p.tensor.grad();
    g.copy_(flat.narrow(0, offset, g.numel()).view(g.sizes()));
    offset += g.numel();
  }
}

double AdamW::grad_norm() const {
  double sq = 0;
  for (const auto& p : params_)
    if (p.tensor.grad().defined())
      sq += p.tensor.grad().to(at::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sq);
}

double AdamW::step(double lr) {
  const double norm = grad_norm();
  LF_CHECK(std::isfinite(norm), "gradient norm is ", norm, " at optimizer step ", step_ + 1,
           lf::hint("lower --lr, enable --clip-grad, or check the data for corrupt tokens"));
  const double clip = config_.clip_grad > 0 && norm > config_.clip_grad
                          ? config_.clip_grad / (norm + 1e-6)
                          : 1.0;
  ++step_;
  for (auto& g : groups_) {
    if (g.params.empty()) continue;
    std::vector<at::Tensor> grads;
    for (auto& p : g.params) {
      auto grad = p.grad().to(at::kFloat);
      grads.push_back(clip != 1.0 ? grad * clip : grad);
    }
    lf::backend::AdamWHyper hyper;
    hyper.lr = lr;
    hyper.beta1 = config_.adam_beta1;
    hyper.beta2 = config_.adam_beta2;
    hyper.eps = config_.adam_eps;
    hyper.weight_decay = g.weight_decay;
    hyper.step = step_;
    backend_.ops().adamw_step(g.masters, grads, g.exp_avg, g.exp_avg_sq, hyper);
    for (size_t i = 0; i < g.params.size(); ++i)
      if (g.params[i].scalar_type() != at::kFloat) {  // fp32 params are their own masters
        at::NoGradGuard no_grad;
        g.params[i].detach().copy_(g.masters[i]);
      }
  }
  return norm;
}

void AdamW::zero_grad() {
  for (auto& p : params_)
    if (p.tensor.grad().defined()) p.tensor.mutable_grad() = at::Tensor();
}

}  // namespace lf::train

#include "loongforge/vla/groot_policy.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/models/composites/groot.h"
#include "loongforge/models/groot_lerobot.h"
#include "loongforge/train/checkpoint.h"

namespace lf::vla {

GrootReachPolicy::GrootReachPolicy(const std::string& checkpoint, const std::string& store, uint64_t seed)
    : meta_(read_reach_demo_meta(store)), seed_(seed) {
  auto full = lf::train::read_model_checkpoint(checkpoint);
  what_ = checkpoint + " (iteration " + std::to_string(full.iteration) + ")";
  const auto setup = lf::models::lerobot::groot_setup_from_model_section(full.config_yaml, what_ + " config.yaml");
  LF_CHECK(setup.has_value(), "--load ", checkpoint, " is not a groot checkpoint",
           lf::hint("train one with loongforge-train on a groot config (configs/examples/groot_tiny.yaml)"));
  const auto& c = setup->config;
  LF_CHECK(!meta_.prompt.located, "--data-path ", store, ": its prompts carry located answers, which only a pi05 "
           "policy decodes", lf::hint("give --data-path the store the groot checkpoint was trained on"));
  LF_CHECK(c.image_size == meta_.image_size && c.action_horizon == meta_.chunk && c.action_dim == meta_.action_dim,
           "--load ", checkpoint, " (images ", c.image_size, ", chunks of ", c.action_horizon, " x ", c.action_dim,
           ") was not trained on the store ", store, " (images ", meta_.image_size, ", chunks of ", meta_.chunk, " x ",
           meta_.action_dim, ")", lf::hint("give --data-path the store it was trained on"));
  model_ = std::make_unique<lf::models::Groot>(setup->backbone, setup->config, lf::backend::select_backend(), 0,
                                               at::kFloat, nullptr);
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, t] : full.tensors) tensors[name] = t.to(at::kFloat);
  model_->load_checkpoint_tensors(tensors, what_);
  model_->set_training(false);
}

GrootReachPolicy::~GrootReachPolicy() = default;

nlohmann::json GrootReachPolicy::metadata() const {
  return {{"policy", "groot"}, {"task", "reach"}, {"checkpoint", what_}, {"action_dim", meta_.action_dim},
          {"action_horizon", meta_.chunk}, {"max_speed", meta_.max_speed}};
}

at::Tensor GrootReachPolicy::infer(const Observation& obs) {
  at::Tensor image = obs.first_of({"observation/image", "image"});
  if (image.dim() == 3 && image.size(2) == 3) image = image.permute({2, 0, 1});
  LF_CHECK(image.dim() == 3 && image.size(0) == 3 && image.size(1) == meta_.image_size &&
               image.size(2) == meta_.image_size,
           "groot policy: the image must be [", meta_.image_size, ", ", meta_.image_size, ", 3] uint8, got ",
           image.sizes());
  const at::Tensor& state = obs.first_of({"observation/state", "state"});
  auto [tokens, mask] = meta_.prompt.encode(obs.prompt, state);
  // As the store source: the image in [-1, 1], the state the prompt's bins carry.
  auto images = (image.to(at::kFloat) / 127.5 - 1.0).view({1, 1, 3, meta_.image_size, meta_.image_size});
  auto in = model_->vla_inputs(images, tokens.unsqueeze(0), meta_.prompt.decode_state(tokens).view({1, 1, -1}));
  const auto& c = model_->config();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003ull + calls_++);
  auto noise = at::normal(0.0, 1.0, {1, c.action_horizon, c.max_action_dim}, gen, at::kFloat);
  at::NoGradGuard no_grad;
  auto actions = model_->sample_actions(in, noise);  // [1, horizon, max_action_dim]
  return unnormalize_reach_actions(actions[0].narrow(1, 0, meta_.action_dim), meta_.max_speed).contiguous();
}

}  // namespace lf::vla

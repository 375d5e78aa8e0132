#include "loongforge/vla/pi05_policy.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/models/composites/pi05.h"
#include "loongforge/models/pi05_lerobot.h"
#include "loongforge/train/checkpoint.h"

namespace lf::vla {

Pi05ReachPolicy::Pi05ReachPolicy(const std::string& checkpoint, const std::string& store, uint64_t seed)
    : meta_(read_reach_demo_meta(store)), seed_(seed) {
  auto full = lf::train::read_model_checkpoint(checkpoint);
  what_ = checkpoint + " (iteration " + std::to_string(full.iteration) + ")";
  const auto setup = lf::models::lerobot::pi05_setup_from_model_section(full.config_yaml, what_ + " config.yaml");
  LF_CHECK(setup.has_value(), "--load ", checkpoint, " is not a pi05 checkpoint",
           lf::hint("train one with loongforge-train on a pi05 config (configs/examples/pi05_reach.yaml)"));
  LF_CHECK(setup->vision.image_size == meta_.image_size && setup->policy.chunk_size == meta_.chunk &&
               setup->policy.action_dim == meta_.action_dim && setup->vlm.vocab_size >= meta_.prompt.vocab_size(),
           "--load ", checkpoint, " (images ", setup->vision.image_size, ", chunks of ", setup->policy.chunk_size,
           " x ", setup->policy.action_dim, ", vocabulary ", setup->vlm.vocab_size, ") was not trained on the store ",
           store, " (images ", meta_.image_size, ", chunks of ", meta_.chunk, " x ", meta_.action_dim,
           ", vocabulary ", meta_.prompt.vocab_size(), ")", lf::hint("give --data-path the store it was trained on"));
  model_ = std::make_unique<lf::models::Pi05>(setup->vision, setup->vlm, setup->expert, setup->policy,
                                              lf::backend::select_backend(), 0, at::kFloat, nullptr);
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, t] : full.tensors) tensors[name] = t.to(at::kFloat);
  model_->load_full(tensors, what_);
}

Pi05ReachPolicy::~Pi05ReachPolicy() = default;

nlohmann::json Pi05ReachPolicy::metadata() const {
  return {{"policy", "pi05"}, {"task", "reach"}, {"checkpoint", what_}, {"action_dim", meta_.action_dim},
          {"action_horizon", meta_.chunk}, {"max_speed", meta_.max_speed}};
}

at::Tensor Pi05ReachPolicy::infer(const Observation& obs) {
  at::Tensor image = obs.first_of({"observation/image", "image"});
  if (image.dim() == 3 && image.size(2) == 3) image = image.permute({2, 0, 1});
  LF_CHECK(image.dim() == 3 && image.size(0) == 3 && image.size(1) == meta_.image_size &&
               image.size(2) == meta_.image_size,
           "pi05 policy: the image must be [", meta_.image_size, ", ", meta_.image_size, ", 3] uint8, got ",
           image.sizes());
  const at::Tensor& state = obs.first_of({"observation/state", "state"});
  auto [tokens, mask] = meta_.prompt.encode(obs.prompt, state);
  const auto& c = model_->config();
  lf::models::Pi05Inputs in;
  in.images = (image.to(at::kFloat) / 127.5 - 1.0).view({1, 1, 3, meta_.image_size, meta_.image_size});
  in.img_masks = at::ones({1, 1}, at::kBool);
  in.tokens = tokens.unsqueeze(0);
  in.masks = mask.unsqueeze(0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003ull + calls_++);
  auto noise = at::normal(0.0, 1.0, {1, c.chunk_size, c.max_action_dim}, gen, at::kFloat);
  at::NoGradGuard no_grad;
  auto actions = model_->sample_actions(in, noise);  // [1, chunk, max_action_dim]
  return unnormalize_reach_actions(actions[0].narrow(1, 0, meta_.action_dim), meta_.max_speed).contiguous();
}

}  // namespace lf::vla

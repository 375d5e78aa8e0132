#include "loongforge/vla/pi05_policy.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>

#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/models/composites/pi05.h"
#include "loongforge/models/pi05_lerobot.h"
#include "loongforge/train/checkpoint.h"

namespace lf::vla {

namespace {

// A pi05 checkpoint's model (float32) and its checkpoint's config.yaml; `what` becomes "DIR (iteration N)".
std::unique_ptr<lf::models::Pi05> load_pi05(const std::string& checkpoint, std::string& what, std::string& config_yaml,
                                            lf::models::lerobot::Pi05Setup& setup) {
  auto full = lf::train::read_model_checkpoint(checkpoint);
  what = checkpoint + " (iteration " + std::to_string(full.iteration) + ")";
  const auto s = lf::models::lerobot::pi05_setup_from_model_section(full.config_yaml, what + " config.yaml");
  LF_CHECK(s.has_value(), "--load ", checkpoint, " is not a pi05 checkpoint",
           lf::hint("train one with loongforge-train on a pi05 config (configs/examples/pi05_reach.yaml)"));
  setup = *s;
  config_yaml = full.config_yaml;
  auto model = std::make_unique<lf::models::Pi05>(setup.vision, setup.vlm, setup.expert, setup.policy,
                                                  lf::backend::select_backend(), 0, at::kFloat, nullptr);
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, t] : full.tensors) tensors[name] = t.to(at::kFloat);
  model->load_full(tensors, what);
  return model;
}

// Gaussian noise [1, chunk, max_action_dim] of call `call` of a policy seeded `seed`.
at::Tensor policy_noise(const lf::models::Pi05Config& c, uint64_t seed, uint64_t call) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + call);
  return at::normal(0.0, 1.0, {1, c.chunk_size, c.max_action_dim}, gen, at::kFloat);
}

}  // namespace

Pi05ReachPolicy::Pi05ReachPolicy(const std::string& checkpoint, const std::string& store, uint64_t seed)
    : meta_(read_reach_demo_meta(store)), seed_(seed) {
  std::string config_yaml;
  lf::models::lerobot::Pi05Setup setup;
  model_ = load_pi05(checkpoint, what_, config_yaml, setup);
  LF_CHECK(setup.vision.image_size == meta_.image_size && setup.policy.chunk_size == meta_.chunk &&
               setup.policy.action_dim == meta_.action_dim && setup.vlm.vocab_size >= meta_.prompt.vocab_size(),
           "--load ", checkpoint, " (images ", setup.vision.image_size, ", chunks of ", setup.policy.chunk_size,
           " x ", setup.policy.action_dim, ", vocabulary ", setup.vlm.vocab_size, ") was not trained on the store ",
           store, " (images ", meta_.image_size, ", chunks of ", meta_.chunk, " x ", meta_.action_dim,
           ", vocabulary ", meta_.prompt.vocab_size(), ")", lf::hint("give --data-path the store it was trained on"));
  LF_CHECK(!meta_.prompt.located || setup.policy.prefix_lm_loss_weight > 0, "--load ", checkpoint,
           " has no prefix LM head (model.prefix_lm_loss_weight 0), and the prompts of the store ", store,
           " end with located answers the policy decodes with it",
           lf::hint("train with model.prefix_lm_loss_weight > 0 on that store"));
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
  at::NoGradGuard no_grad;
  if (meta_.prompt.located) {
    // pi0.5's hierarchical inference: the prefix LM answers the located queries first (the queries
    // do not see the answers' block, so the placeholders do not matter), each answer the likeliest
    // bin; the actions are then sampled after the answers.
    in.ar_mask = meta_.prompt.ar_mask(tokens).unsqueeze(0);
    const auto logits = model_->prompt_logits(in)[0];  // [L, vocab]
    const auto slots = meta_.prompt.located_slots(tokens);
    const auto words = meta_.prompt.vocab();
    const int64_t s0 = std::find(words.begin(), words.end(), meta_.prompt.bin_word(0.0)) - words.begin();
    std::array<double, 4> answers{};
    for (size_t i = 0; i < 4; ++i) {
      const int64_t bin = logits[slots[i]].narrow(0, s0, meta_.prompt.state_bins).argmax().item<int64_t>();
      answers[i] = (static_cast<double>(bin) + 0.5) / static_cast<double>(meta_.prompt.state_bins);
    }
    meta_.prompt.set_answers(tokens, answers);
    in.tokens = tokens.unsqueeze(0);
    last_answers_ = answers;
  }
  auto noise = policy_noise(c, seed_, calls_++);
  auto actions = model_->sample_actions(in, noise);  // [1, chunk, max_action_dim]
  return unnormalize_reach_actions(actions[0].narrow(1, 0, meta_.action_dim), meta_.max_speed).contiguous();
}

nlohmann::json Pi05ReachPolicy::last_details() const {
  if (!last_answers_) return nullptr;
  return {{"located", std::vector<double>(last_answers_->begin(), last_answers_->end())}};
}

namespace {

// The last component of a name split at '/' and '.'.
std::string last_component(const std::string& name) {
  const auto at = name.find_last_of("/.");
  return at == std::string::npos ? name : name.substr(at + 1);
}

std::string array_names(const Observation& obs) {
  std::string names;
  for (const auto& [n, t] : obs.arrays) names += (names.empty() ? "" : ", ") + n;
  return names.empty() ? "none" : names;
}

// The observation's image of dataset camera `key` (Pi05LeRobotPolicy's lookup order).
const at::Tensor& camera_array(const Observation& obs, const std::string& key) {
  if (obs.has(key)) return obs.arrays.at(key);
  std::string slashed = key;
  std::replace(slashed.begin(), slashed.end(), '.', '/');
  if (obs.has(slashed)) return obs.arrays.at(slashed);
  const std::string last = last_component(key);
  const at::Tensor* found = nullptr;
  std::string matches;
  for (const auto& [name, t] : obs.arrays) {
    if (name.rfind("env/", 0) == 0 || last_component(name) != last) continue;
    matches += (matches.empty() ? "" : ", ") + name;
    found = found ? nullptr : &t;
    if (!found) break;
  }
  LF_CHECK(found != nullptr || matches.empty(), "pi05 policy: the camera ", key, " of the dataset matches several arrays (",
           matches, ")", lf::hint("send it as " + key + " or " + slashed));
  LF_CHECK(found != nullptr, "pi05 policy: no image for the dataset's camera ", key, "; the observation has: ",
           array_names(obs), lf::hint("send it as " + key + ", " + slashed + " or a name ending in /" + last));
  return *found;
}

// An image array -> [3, H, W] (uint8 or float in [0, 1]).
at::Tensor camera_image(const at::Tensor& a, const std::string& key) {
  at::Tensor img = a;
  if (img.dim() == 3 && img.size(2) == 3) img = img.permute({2, 0, 1});
  LF_CHECK(img.dim() == 3 && img.size(0) == 3, "pi05 policy: the image of camera ", key,
           " must be [H, W, 3] or [3, H, W], got ", a.sizes());
  if (img.scalar_type() == at::kByte) return img;
  LF_CHECK(at::isFloatingType(img.scalar_type()), "pi05 policy: the image of camera ", key, " must be uint8 or float, got ",
           img.scalar_type());
  img = img.to(at::kFloat);
  const double lo = img.min().item<double>(), hi = img.max().item<double>();
  LF_CHECK(lo >= 0.0 && hi <= 1.0, "pi05 policy: the float image of camera ", key, " has values in [", lo, ", ", hi,
           "]; float images must be in [0, 1]", lf::hint("send uint8 pixels or divide by 255"));
  return img;
}

// data.tokenizer_model of a checkpoint's config.yaml ("" when absent).
std::string trained_tokenizer(const std::string& config_yaml) {
  try {
    const YAML::Node n = YAML::Load(config_yaml)["data"]["tokenizer_model"];
    return n && n.IsScalar() ? n.as<std::string>() : "";
  } catch (const YAML::Exception&) {
    return "";
  }
}

}  // namespace

Pi05LeRobotPolicy::Pi05LeRobotPolicy(const std::string& checkpoint, const std::string& dataset,
                                     const std::string& tokenizer, uint64_t seed)
    : dataset_(dataset), seed_(seed) {
  std::string config_yaml;
  lf::models::lerobot::Pi05Setup setup;
  model_ = load_pi05(checkpoint, what_, config_yaml, setup);
  Pi05LeRobotOptions o;
  o.tokenizer = tokenizer.empty() ? trained_tokenizer(config_yaml) : tokenizer;
  LF_CHECK(!o.tokenizer.empty(), "--load ", checkpoint, ": its config.yaml names no data.tokenizer_model, and the prompts of ",
           dataset, " are tokenised with the one it was trained with",
           lf::hint("pass --tokenizer-model DIR (the --tokenizer-model of its training)"));
  LF_CHECK(std::filesystem::exists(o.tokenizer), "--load ", checkpoint, ": the tokenizer ", o.tokenizer,
           " it was trained with is missing", lf::hint("pass --tokenizer-model DIR (a copy of it)"));
  o.image_size = setup.vision.image_size;
  o.chunk = setup.policy.chunk_size;
  o.action_dim = setup.policy.action_dim;
  o.max_action_dim = setup.policy.max_action_dim;
  o.prompt_length = setup.policy.tokenizer_max_length;
  o.vocab_size = setup.vlm.vocab_size;
  inputs_ = std::make_unique<Pi05LeRobotInputs>(dataset, o);
}

Pi05LeRobotPolicy::~Pi05LeRobotPolicy() = default;

nlohmann::json Pi05LeRobotPolicy::metadata() const {
  const auto& c = model_->config();
  return {{"policy", "pi05"}, {"dataset", dataset_}, {"checkpoint", what_}, {"action_dim", c.action_dim},
          {"action_horizon", c.chunk_size}, {"cameras", inputs_->cameras()}, {"state_dim", inputs_->state_dim()}};
}

at::Tensor Pi05LeRobotPolicy::actions(const Observation& obs, const at::Tensor& noise) const {
  std::vector<at::Tensor> cams;
  for (const auto& key : inputs_->cameras()) cams.push_back(camera_image(camera_array(obs, key), key));
  const at::Tensor& state = obs.first_of({"observation.state", "observation/state", "state"});
  LF_CHECK(at::isFloatingType(state.scalar_type()) && state.numel() == inputs_->state_dim(),
           "pi05 policy: the state must be ", inputs_->state_dim(), " floats (the dataset's observation.state), got ",
           state.scalar_type(), " ", state.sizes());
  LF_CHECK(!obs.prompt.empty(), "pi05 policy: the observation has no prompt; the policy was trained on the dataset's "
           "task texts", lf::hint("send the instruction as \"prompt\""));
  const auto batch = inputs_->observation_batch(cams, state, obs.prompt);
  at::NoGradGuard no_grad;
  auto a = model_->sample_actions(model_->inputs_of(batch), noise);  // [1, chunk, max_action_dim]
  return inputs_->unnormalize_actions(a[0].narrow(1, 0, model_->config().action_dim)).contiguous();
}

at::Tensor Pi05LeRobotPolicy::infer(const Observation& obs) {
  return actions(obs, policy_noise(model_->config(), seed_, calls_++));
}

}  // namespace lf::vla

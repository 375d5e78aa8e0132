// A pi05 policy's training inputs from a LeRobot dataset (lerobot_inputs.h).
#include "loongforge/vla/lerobot_inputs.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loongforge/core/error.h"

namespace lf::vla {
namespace {

constexpr const char* kState = "observation.state";
constexpr const char* kAction = "action";

// tokenizer_config.json's pad_token beside the tokenizer.json (a string or {"content": ...}).
std::string pad_token_of(const std::string& tokenizer) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::is_directory(tokenizer) ? fs::path(tokenizer) : fs::path(tokenizer).parent_path();
  const fs::path cfg = dir / "tokenizer_config.json";
  std::ifstream in(cfg);
  LF_CHECK(in.good(), cfg.string(), " is missing: the prompts are padded with its pad_token",
           lf::hint("pass the tokenizer's directory (PaliGemma's holds tokenizer.json and tokenizer_config.json)"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    LF_FAIL(cfg.string(), ": not valid JSON: ", e.what());
  }
  const auto& p = j.contains("pad_token") ? j["pad_token"] : nlohmann::json();
  const std::string pad = p.is_string() ? p.get<std::string>() : p.is_object() ? p.value("content", "") : "";
  LF_CHECK(!pad.empty(), cfg.string(), " has no pad_token; LeRobot pads the prompts with it",
           lf::hint("PaliGemma's tokenizer_config.json names \"<pad>\""));
  return pad;
}

// Python's str.strip() on ASCII whitespace.
std::string strip(const std::string& s) {
  const char* ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

at::Tensor resize_with_pad(const at::Tensor& images, int64_t height, int64_t width) {
  LF_CHECK(images.dim() >= 3, "resize_with_pad: images must be [..., C, H, W], got ", images.sizes());
  const int64_t h = images.size(-2), w = images.size(-1);
  const double ratio = std::max(static_cast<double>(w) / static_cast<double>(width),
                                static_cast<double>(h) / static_cast<double>(height));
  const auto rh = static_cast<int64_t>(static_cast<double>(h) / ratio),
             rw = static_cast<int64_t>(static_cast<double>(w) / ratio);
  auto flat = images.reshape({-1, images.size(-3), h, w});
  auto resized = at::upsample_bilinear2d(flat, {rh, rw}, false, std::nullopt, std::nullopt).clamp(0.0, 1.0);
  const int64_t ph0 = (height - rh) / 2, pw0 = (width - rw) / 2;
  auto padded = at::constant_pad_nd(resized, {pw0, width - rw - pw0, ph0, height - rh - ph0}, 0.0);
  auto sizes = images.sizes().vec();
  sizes[sizes.size() - 2] = height, sizes[sizes.size() - 1] = width;
  return padded.reshape(sizes);
}

Pi05LeRobotInputs::Pi05LeRobotInputs(const std::string& dataset, Pi05LeRobotOptions options)
    : options_(std::move(options)) {
  const int64_t fps = lf::data::LeRobotDataset(dataset).fps();
  lf::data::LeRobotOptions o;
  for (int64_t k = 0; k < options_.chunk; ++k)
    o.delta_timestamps[kAction].push_back(static_cast<double>(k) / static_cast<double>(fps));
  dataset_ = std::make_unique<lf::data::LeRobotDataset>(dataset, o);
  const auto& ds = *dataset_;
  // LeRobot's image_features: the camera features in info.json order (video and image mixed).
  for (const auto& f : ds.features())
    if (f.is_camera()) cameras_.push_back(f.key);
  LF_CHECK(!cameras_.empty(), dataset, " has no camera feature (dtype video or image); a pi05 policy needs one",
           lf::hint("record at least one camera"));
  const auto& state = ds.feature(kState);
  const auto& action = ds.feature(kAction);
  LF_CHECK(state.shape.size() == 1 && action.shape.size() == 1, dataset, ": observation.state ",
           c10::IntArrayRef(state.shape), " and action ", c10::IntArrayRef(action.shape), " must be vectors");
  LF_CHECK(action.shape[0] == options_.action_dim, dataset, ": its actions have ", action.shape[0],
           " dims; the model's action_dim is ", options_.action_dim,
           lf::hint("set model.action_dim " + std::to_string(action.shape[0])));
  LF_CHECK(options_.action_dim <= options_.max_action_dim, "model.action_dim ", options_.action_dim,
           " is above model.max_action_dim ", options_.max_action_dim);
  for (const char* key : {kState, kAction})
    for (const char* q : {"q01", "q99"})
      LF_CHECK(ds.stats(key).count(q), dataset, "/meta/stats.json has no ", q, " for ", key,
               ": pi05 normalises states and actions by QUANTILES (q01 / q99)",
               lf::hint("recompute the dataset's stats with lerobot 0.4 or later (they carry quantiles)"));
  tokenizer_ = std::make_unique<lf::data::HfBpeTokenizer>(options_.tokenizer);
  const std::string pad = pad_token_of(options_.tokenizer);
  const auto id = tokenizer_->token_to_id(pad);
  LF_CHECK(id.has_value(), options_.tokenizer, ": the pad_token '", pad, "' is not in the vocabulary");
  pad_id_ = *id;
  LF_CHECK(options_.vocab_size <= 0 || tokenizer_->vocab_size() <= options_.vocab_size, options_.tokenizer, " has ",
           tokenizer_->vocab_size(), " ids; the model's vocabulary has ", options_.vocab_size,
           lf::hint("set model.foundation.vocab_size >= " + std::to_string(tokenizer_->vocab_size())));
  const auto special = static_cast<int64_t>(tokenizer_->encode_with_special_tokens("").size());
  LF_CHECK(options_.prompt_length >= std::max<int64_t>(1, special), "the prompt length (model.tokenizer_max_length) ",
           options_.prompt_length, " must be at least 1 and hold the ", special, " special tokens ", options_.tokenizer,
           " adds", lf::hint("set model.tokenizer_max_length to the prompt's length in tokens (LeRobot's default 200)"));
}

std::string Pi05LeRobotInputs::prompt_text(const at::Tensor& state, const std::string& task_text) const {
  auto normalized = lf::data::normalize(state.to(at::kFloat), lf::data::LeRobotNormMode::kQuantiles, dataset_->stats(kState));
  std::string task = strip(task_text);
  std::replace(task.begin(), task.end(), '_', ' ');
  std::replace(task.begin(), task.end(), '\n', ' ');
  return "Task: " + task + ", State: " + state_bins(normalized) + ";\nAction: ";
}

std::string state_bins(const at::Tensor& normalized_state) {
  const at::Tensor state = normalized_state.to(at::kFloat).contiguous();
  // np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1: the bins are -1 + i / 128 exactly.
  std::string bins;
  const float* s = state.data_ptr<float>();
  for (int64_t i = 0; i < state.numel(); ++i) {
    const double x = s[i];
    if (std::isnan(x)) {  // np.digitize puts NaN past the last edge
      bins += (i ? " 255" : "255");
      continue;
    }
    // The last bin edge at or below x (-1: none), compared exactly (x + 1 may round for tiny x).
    int64_t k = -1;
    if (x >= 1.0) {
      k = 255;  // past the last edge (+inf too)
    } else if (x >= -1.0) {
      k = std::min<int64_t>(255, static_cast<int64_t>(std::floor((x + 1.0) * 128.0)));
      while (k >= 0 && -1.0 + static_cast<double>(k) / 128.0 > x) --k;
      while (k < 255 && -1.0 + static_cast<double>(k + 1) / 128.0 <= x) ++k;
    }
    bins += (i ? " " : "") + std::to_string(k);
  }
  return bins;
}

std::string Pi05LeRobotInputs::prompt(int64_t index) const {
  const auto item = dataset_->get(index);
  return prompt_text(item.tensors.at(kState), item.task);
}

Pi05LeRobotInputs::Sample Pi05LeRobotInputs::sample(const std::vector<at::Tensor>& cameras, const at::Tensor& state,
                                                    const std::string& task) const {
  const int64_t S = options_.image_size, L = options_.prompt_length;
  LF_CHECK(cameras.size() == cameras_.size(), "pi05 inputs: ", cameras.size(), " camera images for the ",
           cameras_.size(), " cameras of the dataset");
  std::vector<at::Tensor> cams;
  for (const auto& c : cameras) {
    auto img = c.scalar_type() == at::kByte ? c.to(at::kFloat) / 255.0 : c.to(at::kFloat);  // [C, H, W] in [0, 1]
    if (img.size(-2) != S || img.size(-1) != S) img = resize_with_pad(img, S, S);
    cams.push_back(img * 2.0 - 1.0);
  }
  std::vector<int32_t> ids;
  {
    std::lock_guard<std::mutex> lock(tokenizer_mutex_);
    // Truncated as HF: the template's suffix kept.
    ids = tokenizer_->encode_with_special_tokens(prompt_text(state, task), L);
  }
  Sample s;
  s.images = at::stack(cams);
  s.tokens = at::full({L}, pad_id_, at::kLong);
  s.mask = at::zeros({L}, at::kBool);
  const int64_t n = std::min<int64_t>(L, static_cast<int64_t>(ids.size()));
  for (int64_t i = 0; i < n; ++i) s.tokens[i] = static_cast<int64_t>(ids[static_cast<size_t>(i)]);
  s.mask.narrow(0, 0, n).fill_(true);
  return s;
}

lf::data::Batch Pi05LeRobotInputs::batch(const std::vector<int64_t>& indices) const {
  std::vector<at::Tensor> images, tokens, masks, actions;
  for (int64_t index : indices) {
    const auto item = dataset_->get(index);
    std::vector<at::Tensor> cams;
    for (const auto& key : cameras_) cams.push_back(item.tensors.at(key));  // uint8 [C, H, W]
    auto s = sample(cams, item.tensors.at(kState), item.task);
    images.push_back(s.images);
    tokens.push_back(s.tokens);
    masks.push_back(s.mask);
    auto a = lf::data::normalize(item.tensors.at(kAction).to(at::kFloat), lf::data::LeRobotNormMode::kQuantiles,
                                 dataset_->stats(kAction));  // [chunk, action_dim]
    auto padded = at::zeros({options_.chunk, options_.max_action_dim}, at::kFloat);
    padded.narrow(1, 0, a.size(1)).copy_(a);
    actions.push_back(padded);
  }
  lf::data::Batch batch;
  batch.set("images", at::stack(images));
  batch.set("image_masks", at::ones({static_cast<int64_t>(indices.size()), static_cast<int64_t>(cameras_.size())},
                                    at::kBool));
  batch.set("prompt_tokens", at::stack(tokens));
  batch.set("prompt_masks", at::stack(masks));
  batch.set("actions", at::stack(actions));
  return batch;
}

lf::data::Batch Pi05LeRobotInputs::observation_batch(const std::vector<at::Tensor>& cameras, const at::Tensor& state,
                                                     const std::string& task) const {
  const int64_t dim = dataset_->feature(kState).shape.at(0);
  LF_CHECK(state.numel() == dim, "pi05 inputs: the state has ", state.numel(), " values; the dataset's ", kState,
           " has ", dim);
  auto s = sample(cameras, state.reshape({dim}), task);
  lf::data::Batch batch;
  batch.set("images", s.images.unsqueeze(0));
  batch.set("image_masks", at::ones({1, static_cast<int64_t>(cameras_.size())}, at::kBool));
  batch.set("prompt_tokens", s.tokens.unsqueeze(0));
  batch.set("prompt_masks", s.mask.unsqueeze(0));
  return batch;
}

at::Tensor Pi05LeRobotInputs::unnormalize_actions(const at::Tensor& normalized) const {
  return lf::data::normalize(normalized.to(at::kFloat), lf::data::LeRobotNormMode::kQuantiles, dataset_->stats(kAction),
                             /*inverse=*/true);
}

int64_t Pi05LeRobotInputs::state_dim() const { return dataset_->feature(kState).shape.at(0); }

}  // namespace lf::vla

// A pi05 policy's training inputs from a LeRobot dataset, as LeRobot 0.6 makes them for
// PI05Policy.forward: its pi05 preprocessor (make_pi05_pre_post_processors with the dataset's
// stats) and the policy's own image and action preparation. Per frame:
//   - every camera of the dataset (info.json order) as float [0, 1], resized without distortion
//     to image_size x image_size (resize_with_pad: bilinear, centred zero padding), then to [-1, 1];
//   - observation.state normalised by QUANTILES (q01 / q99) and discretised into 256 bins over
//     [-1, 1], in the prompt "Task: <task>, State: <bins>;\nAction: " (task: stripped, "_" and "\n"
//     as spaces) tokenised with the PaliGemma-style tokenizer's special tokens (<bos>), truncated
//     and right-padded with its pad token to prompt_length (tokenizer_max_length);
//   - action over the delta window range(chunk) / fps (an episode's last action repeats past
//     its end, as LeRobotDataset pads), QUANTILES-normalised, zero-padded to max_action_dim.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loongforge/data/batch.h"
#include "loongforge/data/hf_bpe_tokenizer.h"
#include "loongforge/data/lerobot_dataset.h"

namespace lf::vla {

struct Pi05LeRobotOptions {
  std::string tokenizer;        // tokenizer.json or its directory (with tokenizer_config.json's pad_token)
  int64_t image_size = 224;     // the vision encoder's
  int64_t chunk = 50;           // chunk_size
  int64_t action_dim = 0;       // must be the dataset's action width
  int64_t max_action_dim = 32;
  int64_t prompt_length = 200;  // LeRobot's tokenizer_max_length
  int64_t vocab_size = 0;       // > 0: every token id must be below it
};

class Pi05LeRobotInputs {
 public:
  // Errors name the dataset or tokenizer file and what to do: no camera, no observation.state or
  // action, an action width other than action_dim, missing quantile stats, no pad token, a
  // tokenizer larger than vocab_size.
  Pi05LeRobotInputs(const std::string& dataset, Pi05LeRobotOptions options);

  int64_t size() const { return dataset_->num_frames(); }
  const lf::data::LeRobotDataset& dataset() const { return *dataset_; }
  const std::vector<std::string>& cameras() const { return cameras_; }

  // Frames `indices` as a pi05 batch: images [b, n_cam, 3, S, S] float32 in [-1, 1], image_masks
  // [b, n_cam] bool (all true), prompt_tokens [b, L] int64, prompt_masks [b, L] bool, actions
  // [b, chunk, max_action_dim] float32. Safe to call from several threads.
  lf::data::Batch batch(const std::vector<int64_t>& indices) const;
  // The prompt text of frame `index` (before tokenisation).
  std::string prompt(int64_t index) const;

  // One observation (a served policy's) processed as a frame is: `cameras` the images of cameras()
  // in order, each [C, H, W] uint8 (0..255) or float in [0, 1], of any size; `state` the raw
  // observation.state ([state_dim()] values); `task` the instruction. A batch of one without
  // actions. Errors name a camera count or state width the dataset does not have.
  lf::data::Batch observation_batch(const std::vector<at::Tensor>& cameras, const at::Tensor& state,
                                    const std::string& task) const;
  // Normalised actions [..., action_dim] back in the dataset's units (QUANTILES undone).
  at::Tensor unnormalize_actions(const at::Tensor& normalized) const;
  int64_t state_dim() const;

 private:
  struct Sample {
    at::Tensor images, tokens, mask;  // [n_cam, 3, S, S] in [-1, 1], [L] int64, [L] bool
  };
  Sample sample(const std::vector<at::Tensor>& cameras, const at::Tensor& state, const std::string& task) const;
  std::string prompt_text(const at::Tensor& state, const std::string& task) const;

  Pi05LeRobotOptions options_;
  std::unique_ptr<lf::data::LeRobotDataset> dataset_;
  std::vector<std::string> cameras_;
  mutable std::mutex tokenizer_mutex_;
  std::unique_ptr<lf::data::HfBpeTokenizer> tokenizer_;
  int32_t pad_id_ = 0;
};

// resize_with_pad_torch (openpi's, as LeRobot has it) on float images [..., C, H, W] in [0, 1]:
// bilinear (align_corners false) to fit height x width keeping the aspect ratio, clamped to [0, 1],
// centred zero padding.
at::Tensor resize_with_pad(const at::Tensor& images, int64_t height, int64_t width);

// The prompt's state: each value of a normalised state [n] as LeRobot's
// np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1, space-separated: -1 below -1, 255 at or
// past the last edge (+inf too) and for NaN.
std::string state_bins(const at::Tensor& normalized_state);

}  // namespace lf::vla

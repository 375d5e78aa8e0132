// A trained pi05 policy (models/composites/pi05.h) behind the Policy interface, for the reach task:
// the observation processed as the demo store it was trained on processes its samples
// (vla/reach_demo.h: the camera image as its one camera in [-1, 1], the prompt of instruction
// words and discretised state, actions scaled back from [-1, 1]), the action chunk Euler-sampled
// from Gaussian noise drawn from `seed` and a call counter (reproducible runs). Or, for a pi05
// trained on a LeRobot dataset (loongforge-train --data-path DATASET --tokenizer-model DIR), the
// observation processed as that dataset's frames are for training (vla/lerobot_inputs.h) and the
// actions returned in the dataset's units.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "loongforge/vla/lerobot_inputs.h"
#include "loongforge/vla/policy.h"
#include "loongforge/vla/reach_demo.h"

namespace lf::models {
class Pi05;
}

namespace lf::vla {

class Pi05ReachPolicy : public Policy {
 public:
  // checkpoint: a pi05 checkpoint (loongforge-train; its latest iteration); store: the reach demo
  // store it was trained on (meta.json). Errors name the directory and what disagrees.
  Pi05ReachPolicy(const std::string& checkpoint, const std::string& store, uint64_t seed);
  ~Pi05ReachPolicy() override;
  nlohmann::json metadata() const override;
  at::Tensor infer(const Observation& obs) override;
  nlohmann::json last_details() const override;

 private:
  ReachDemoMeta meta_;
  std::optional<std::array<double, 4>> last_answers_;
  std::unique_ptr<lf::models::Pi05> model_;
  uint64_t seed_;
  uint64_t calls_ = 0;
  std::string what_;
};

// A pi05 trained on a LeRobot dataset, served as OpenPI clients (LIBERO's and others) drive it.
// Each camera of the dataset (its info.json key, e.g. observation.images.wrist_image) is read from
// the observation's array of that name, or of that name with '/' for '.'
// (observation/images/wrist_image), or else the one array whose last name component is the key's
// (observation/wrist_image, wrist_image); `env/` arrays are never read. The state is
// observation.state, observation/state or state, the instruction the prompt. Images: uint8 [H, W, 3]
// or [3, H, W], or float in [0, 1], of any size (resized with padding as in training). The chunk
// [chunk_size, action_dim] is in the dataset's units (the quantile normalisation undone).
class Pi05LeRobotPolicy : public Policy {
 public:
  // checkpoint: a pi05 checkpoint trained on `dataset` (a LeRobot dataset directory, read for its
  // cameras and stats); tokenizer: the --tokenizer-model it was trained with ("": the one its
  // config.yaml names). Errors name the directory or key that disagrees and what to pass.
  Pi05LeRobotPolicy(const std::string& checkpoint, const std::string& dataset, const std::string& tokenizer,
                    uint64_t seed);
  ~Pi05LeRobotPolicy() override;
  nlohmann::json metadata() const override;
  // The chunk from noise drawn from the seed and a call counter.
  at::Tensor infer(const Observation& obs) override;
  // The chunk Euler-sampled from `noise` [1, chunk_size, max_action_dim].
  at::Tensor actions(const Observation& obs, const at::Tensor& noise) const;
  const Pi05LeRobotInputs& inputs() const { return *inputs_; }
  const lf::models::Pi05& model() const { return *model_; }

 private:
  std::unique_ptr<lf::models::Pi05> model_;
  std::unique_ptr<Pi05LeRobotInputs> inputs_;
  std::string dataset_;
  uint64_t seed_;
  uint64_t calls_ = 0;
  std::string what_;
};

}  // namespace lf::vla

// A trained groot policy (models/composites/groot.h) behind the Policy interface, for the reach
// task: the observation processed as the demo store it was trained on processes its samples
// (vla/reach_demo.h; Groot::vla_inputs: the camera image as Qwen3-VL patches, the prompt of
// instruction words and discretised state as the text, that state decoded from its bins as the
// state input, embodiment 0), the action chunk Euler-sampled from Gaussian noise drawn from `seed`
// and a call counter (reproducible runs), actions scaled back from [-1, 1].
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "loongforge/vla/policy.h"
#include "loongforge/vla/reach_demo.h"

namespace lf::models {
class Groot;
}

namespace lf::vla {

class GrootReachPolicy : public Policy {
 public:
  // checkpoint: a groot checkpoint (loongforge-train; its latest iteration); store: the reach demo
  // store it was trained on (meta.json). Errors name the directory and what disagrees.
  GrootReachPolicy(const std::string& checkpoint, const std::string& store, uint64_t seed);
  ~GrootReachPolicy() override;
  nlohmann::json metadata() const override;
  at::Tensor infer(const Observation& obs) override;

 private:
  ReachDemoMeta meta_;
  std::unique_ptr<lf::models::Groot> model_;
  uint64_t seed_;
  uint64_t calls_ = 0;
  std::string what_;
};

}  // namespace lf::vla

// A trained pi05 policy (models/composites/pi05.h) behind the Policy interface, for the reach task:
// the observation processed as the demo store it was trained on processes its samples
// (vla/reach_demo.h: the camera image as its one camera in [-1, 1], the prompt of instruction
// words and discretised state, actions scaled back from [-1, 1]), the action chunk Euler-sampled
// from Gaussian noise drawn from `seed` and a call counter (reproducible runs).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

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

 private:
  ReachDemoMeta meta_;
  std::unique_ptr<lf::models::Pi05> model_;
  uint64_t seed_;
  uint64_t calls_ = 0;
  std::string what_;
};

}  // namespace lf::vla

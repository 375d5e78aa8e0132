// The policy interface of vision-language-action models: what a closed-loop evaluation
// (loongforge-eval), a policy server (loongforge-serve-policy, OpenPI's websocket protocol) and a
// trained model all speak. A policy receives one Observation (the arrays a robot client sends, as
// OpenPI clients send them, plus the language instruction) and returns an action chunk: the next
// H actions, [H, action_dim] float32, of which the caller executes the first K before asking again.
// The scripted policies of the reach task (reach_env.h) implement it; make_policy builds one by
// name.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lf::vla {

// One observation, as a client sends it. `arrays`: flat names (nested dicts of a client are joined
// with '/', e.g. "images/cam_high") to CPU tensors of the dtype and shape sent: camera images uint8
// [H, W, 3] (or [3, H, W]), the proprioceptive state float32 under "observation/state" or "state".
// Names under "env/" are the simulator's ground truth (reach_env.h): only scripted policies may
// read them; a learned policy must not. `prompt`: the language instruction ("" when none).
struct Observation {
  std::map<std::string, at::Tensor> arrays;
  std::string prompt;

  // The array called `name`, or an lf::Error naming it and the arrays present.
  const at::Tensor& at(const std::string& name) const;
  // The first of `names` present, or an lf::Error naming them all.
  const at::Tensor& first_of(const std::vector<std::string>& names) const;
  bool has(const std::string& name) const { return arrays.count(name) > 0; }
};

class Policy {
 public:
  virtual ~Policy() = default;
  // What a server sends a client on connect (OpenPI: the first message), e.g. the action
  // dimension and chunk length. A JSON object.
  virtual nlohmann::json metadata() const { return nlohmann::json::object(); }
  // The action chunk for `obs`: [H, action_dim] float32 on the CPU, H >= 1. Errors (a missing
  // array, an instruction it cannot read) are lf::Errors naming what was wrong.
  virtual at::Tensor infer(const Observation& obs) = 0;
  // A new episode begins (clears any per-episode state).
  virtual void reset() {}
  // What the last infer decided on the way to its actions, for evaluation reports (null when
  // nothing): a pi05 with located answers gives {"located": [block x, block y, target x, target y]},
  // the positions it decoded (bin centres, table units).
  virtual nlohmann::json last_details() const { return nullptr; }
};

// What make_policy needs. `load`: a trained policy's checkpoint directory (for trained policies;
// the scripted ones take none).
struct PolicyOptions {
  uint64_t seed = 0;        // the random policy's draws
  int64_t chunk = 10;       // H, the actions per chunk of the scripted policies
  double max_speed = 0.05;  // the reach task's max speed per step (the random policy's range)
  std::string load;
  std::string data_path;  // pi05 / groot: the reach demo store the policy was trained on (its processing); pi05:
                          // or the LeRobot dataset (vla/pi05_policy.h, Pi05LeRobotPolicy)
  std::string tokenizer;  // pi05 on a LeRobot dataset: its --tokenizer-model ("": its config.yaml's)
};

// The policies make_policy knows, with one line each: {"expert", ...}, {"random", ...}.
const std::vector<std::pair<std::string, std::string>>& policy_names();
// "" when make_policy knows `name`, else the message of a program's usage error ("unknown policy
// 'x'; the choices are: expert, random, pi05").
std::string unknown_policy_message(const std::string& name);
// A policy by name; an lf::Error listing the choices for an unknown name. (A trained policy
// loaded from options.load is added here by its model.)
std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyOptions& options = {});

}  // namespace lf::vla

// Observation lookups, the reach task's scripted policies (expert, random) and make_policy.
#include <ATen/Functions.h>

#include <cmath>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/data/lerobot_dataset.h"
#include "loongforge/vla/groot_policy.h"
#include "loongforge/vla/pi05_policy.h"
#include "loongforge/vla/policy.h"
#include "loongforge/vla/reach_env.h"

namespace lf::vla {
namespace {

std::string names_of(const Observation& obs) {
  std::ostringstream os;
  bool first = true;
  for (const auto& [name, t] : obs.arrays) os << (first ? "" : ", ") << name, first = false;
  return first ? "none" : os.str();
}

// The values of a float array of `n` numbers (any shape), as doubles.
std::vector<double> values(const at::Tensor& t, const std::string& name, int64_t n) {
  LF_CHECK(t.numel() == n, "observation: '", name, "' has ", t.numel(), " values (shape ", t.sizes(), "), expected ", n);
  const at::Tensor d = t.to(at::kCPU, at::kDouble).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + n};
}

}  // namespace

const at::Tensor& Observation::at(const std::string& name) const {
  const auto it = arrays.find(name);
  LF_CHECK(it != arrays.end(), "observation: no array '", name, "' (it has: ", names_of(*this), ")");
  return it->second;
}

const at::Tensor& Observation::first_of(const std::vector<std::string>& names) const {
  for (const auto& n : names)
    if (auto it = arrays.find(n); it != arrays.end()) return it->second;
  std::ostringstream os;
  for (size_t i = 0; i < names.size(); ++i) os << (i ? " or '" : "'") << names[i] << "'";
  LF_FAIL("observation: no array ", os.str(), " (it has: ", names_of(*this), ")");
}

ReachExpertPolicy::ReachExpertPolicy(int64_t chunk, double max_speed) : chunk_(chunk), max_speed_(max_speed) {
  LF_CHECK(chunk >= 1, "expert policy: the chunk length must be positive, got ", chunk);
  LF_CHECK(max_speed > 0, "expert policy: max_speed must be positive, got ", max_speed);
}

nlohmann::json ReachExpertPolicy::metadata() const {
  return {{"policy", "expert"}, {"task", "reach"}, {"action_dim", 3}, {"action_horizon", chunk_},
          {"max_speed", max_speed_}};
}

at::Tensor ReachExpertPolicy::infer(const Observation& obs) {
  const auto [bc, tc] = parse_reach_instruction(obs.prompt);
  const auto state = values(obs.first_of({"observation/state", "state"}), "observation/state", 3);
  const at::Tensor& blocks = obs.at("env/blocks");
  const at::Tensor& targets = obs.at("env/targets");
  const at::Tensor block_colours = obs.at("env/block_colours").to(at::kLong).contiguous().view({-1});
  const at::Tensor target_colours = obs.at("env/target_colours").to(at::kLong).contiguous().view({-1});
  const int64_t held = obs.at("env/held").to(at::kLong).item<int64_t>();
  const auto bpos = values(blocks, "env/blocks", 2 * block_colours.numel());
  const auto tpos = values(targets, "env/targets", 2 * target_colours.numel());
  int64_t bi = -1, ti = -1;
  for (int64_t i = 0; i < block_colours.numel() && bi < 0; ++i)
    if (block_colours[i].item<int64_t>() == bc) bi = i;
  for (int64_t i = 0; i < target_colours.numel() && ti < 0; ++i)
    if (target_colours[i].item<int64_t>() == tc) ti = i;
  LF_CHECK(bi >= 0, "expert policy: the scene has no ", reach_colours()[static_cast<size_t>(bc)], " block (\"",
           obs.prompt, "\")");
  LF_CHECK(ti >= 0, "expert policy: the scene has no ", reach_colours()[static_cast<size_t>(tc)], " target (\"",
           obs.prompt, "\")");

  // Plan from the observation: the gripper and the block as the chunk moves them.
  double x = state[0], y = state[1];
  bool closed = state[2] > 0.5, holding = closed && held == bi;
  double bx = bpos[static_cast<size_t>(2 * bi)], by = bpos[static_cast<size_t>(2 * bi + 1)];
  const double tx = tpos[static_cast<size_t>(2 * ti)], ty = tpos[static_cast<size_t>(2 * ti + 1)];
  const double eps = 1e-4;
  at::Tensor chunk = at::zeros({chunk_, 3}, at::kFloat);
  float* a = chunk.data_ptr<float>();
  auto toward = [&](double gx, double gy, float grip, float* out) {
    const double dx = std::clamp(gx - x, -max_speed_, max_speed_), dy = std::clamp(gy - y, -max_speed_, max_speed_);
    x += dx, y += dy;
    out[0] = static_cast<float>(dx), out[1] = static_cast<float>(dy), out[2] = grip;
  };
  for (int64_t i = 0; i < chunk_; ++i) {
    float* out = a + 3 * i;
    const bool placed = !holding && std::abs(bx - tx) < eps * 100 && std::abs(by - ty) < eps * 100;
    if (placed || (closed && !holding)) {  // done (stay, open), or holding the wrong thing (let go)
      out[2] = -1;
      closed = false;
    } else if (!holding) {
      if (std::abs(x - bx) < eps && std::abs(y - by) < eps) {
        out[2] = 1;  // close on the block
        closed = holding = true;
      } else {
        toward(bx, by, -1, out);
      }
    } else if (std::abs(x - tx) < eps && std::abs(y - ty) < eps) {
      out[2] = -1;  // drop it on the target
      closed = holding = false;
    } else {
      toward(tx, ty, 1, out);
      bx = x, by = y;
    }
  }
  return chunk;
}

ReachRandomPolicy::ReachRandomPolicy(uint64_t seed, int64_t chunk, double max_speed)
    : state_(seed * 0x9E3779B97F4A7C15ull + 1), chunk_(chunk), max_speed_(max_speed) {
  LF_CHECK(chunk >= 1, "random policy: the chunk length must be positive, got ", chunk);
}

nlohmann::json ReachRandomPolicy::metadata() const {
  return {{"policy", "random"}, {"task", "reach"}, {"action_dim", 3}, {"action_horizon", chunk_},
          {"max_speed", max_speed_}};
}

at::Tensor ReachRandomPolicy::infer(const Observation&) {
  auto uniform = [&] {  // splitmix64, in [-1, 1)
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return 2.0 * static_cast<double>(z >> 11) * 0x1.0p-53 - 1.0;
  };
  at::Tensor chunk = at::empty({chunk_, 3}, at::kFloat);
  float* a = chunk.data_ptr<float>();
  for (int64_t i = 0; i < chunk_; ++i) {
    a[3 * i] = static_cast<float>(max_speed_ * uniform());
    a[3 * i + 1] = static_cast<float>(max_speed_ * uniform());
    a[3 * i + 2] = static_cast<float>(uniform());
  }
  return chunk;
}

const std::vector<std::pair<std::string, std::string>>& policy_names() {
  static const std::vector<std::pair<std::string, std::string>> n = {
      {"expert", "the reach task's scripted expert (reads the env/ ground truth)"},
      {"random", "uniform random actions"},
      {"pi05", "a trained pi05 policy: --load CHECKPOINT with --data-path STORE, the reach demo store or LeRobot "
               "dataset it was trained on"},
      {"groot", "a trained groot policy: --load CHECKPOINT with --data-path STORE, the reach demo store it was "
                "trained on"}};
  return n;
}

std::string unknown_policy_message(const std::string& name) {
  std::string choices;
  for (const auto& [n, what] : policy_names()) {
    if (n == name) return "";
    choices += (choices.empty() ? "" : ", ") + n;
  }
  return "unknown policy '" + name + "'; the choices are: " + choices;
}

std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyOptions& o) {
  if (name == "expert" || name == "random") {
    LF_CHECK(o.tokenizer.empty(), "the ", name, " policy is scripted and reads no tokenizer (", o.tokenizer, ")");
    LF_CHECK(o.load.empty() && o.data_path.empty(), "the ", name, " policy is scripted and loads no checkpoint (",
             o.load, ") or store (", o.data_path, ")");
    if (name == "expert") return std::make_unique<ReachExpertPolicy>(o.chunk, o.max_speed);
    return std::make_unique<ReachRandomPolicy>(o.seed, o.chunk, o.max_speed);
  }
  if (name == "pi05") {
    LF_CHECK(!o.load.empty() && !o.data_path.empty(),
             "the pi05 policy needs --load CHECKPOINT and --data-path STORE (the reach demo store or LeRobot dataset it was "
             "trained on)");
    if (lf::data::LeRobotDataset::is_dataset(o.data_path)) return std::make_unique<Pi05LeRobotPolicy>(o.load, o.data_path, o.tokenizer, o.seed);
    LF_CHECK(o.tokenizer.empty(), "--tokenizer-model is for a pi05 policy trained on a LeRobot dataset; ", o.data_path,
             " is a reach demo store (its prompts have their own vocabulary)", lf::hint("drop --tokenizer-model"));
    return std::make_unique<Pi05ReachPolicy>(o.load, o.data_path, o.seed);
  }
  if (name == "groot") {
    LF_CHECK(!o.load.empty() && !o.data_path.empty(),
             "the groot policy needs --load CHECKPOINT and --data-path STORE (the reach demo store it was trained on)");
    LF_CHECK(!lf::data::LeRobotDataset::is_dataset(o.data_path), o.data_path, " is a LeRobot dataset; groot policies train and run on reach "
             "demo stores (a LeRobot processor for groot is not built yet)", lf::hint("give the reach demo store it was trained on"));
    LF_CHECK(o.tokenizer.empty(), "--tokenizer-model is for a pi05 policy trained on a LeRobot dataset, not groot",
             lf::hint("drop --tokenizer-model"));
    return std::make_unique<GrootReachPolicy>(o.load, o.data_path, o.seed);
  }
  LF_FAIL(unknown_policy_message(name));
}

}  // namespace lf::vla

// The reach-and-place task: a small 2D simulator for closed-loop evaluation of VLA policies and
// for scripted demonstrations. A square table [0, 1] x [0, 1] (x to the right, y down: image row
// = y), a gripper point (x, y, open or closed), 2-4 coloured blocks and 2-3 coloured target zones
// at random non-overlapping positions (drawn from the reset seed, deterministic), and an
// instruction "put the <colour> block on the <colour> target". The scene always holds a block of
// the target's colour and a target of the block's colour, so the instruction with its two colours
// swapped names a feasible task too (loongforge-eval --instruction-swap).
//
// An action is (dx, dy, grip) float32: the motion, each component clipped to [-max_speed,
// max_speed], the gripper kept on the table; grip > 0 closes the gripper, grip <= 0 opens it.
// Closing grasps the nearest block whose centre lies within grasp_radius of the gripper (after the
// motion); a held block moves with the gripper; opening drops it where it is. A task is done when
// its block lies wholly inside its target zone and the gripper is open; an episode ends when the
// instruction's task is done or after max_steps steps.
//
// Observation (policy.h): "observation/image" uint8 [S, S, 3] (top-down camera: a dark table,
// targets as coloured outlines, blocks as filled squares, the gripper as a white cross when open
// and a white ring when closed), "observation/state" float32 [3] (gripper x, y, grip: 1 closed,
// 0 open), the prompt, and the ground truth for scripted policies under "env/": "env/blocks"
// float32 [N, 2] (centres), "env/block_colours" int64 [N], "env/targets" float32 [M, 2],
// "env/target_colours" int64 [M] (indices into reach_colours()), "env/held" int64 [] (the held
// block's index, -1 when none). A learned policy must not read "env/".
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/media/image.h"
#include "loongforge/vla/policy.h"

namespace lf::vla {

struct ReachOptions {
  int64_t image_size = 64;  // S, the camera image's side in pixels
  int64_t max_steps = 100;
  double max_speed = 0.05;     // per component and step
  double block_size = 0.08;    // side of a block
  double target_size = 0.2;    // side of a target zone
  double grasp_radius = 0.05;  // a block within this distance of the gripper is grasped
};

const std::vector<std::string>& reach_colours();  // red, green, blue, yellow
// The RGB a colour is drawn with.
std::array<uint8_t, 3> reach_colour_rgb(int64_t colour);
std::string reach_instruction(int64_t block_colour, int64_t target_colour);
// The block and target colours of an instruction (reach_instruction's form); an lf::Error naming
// the text otherwise.
std::pair<int64_t, int64_t> parse_reach_instruction(const std::string& text);

struct ReachBlock {
  double x = 0, y = 0;
  int64_t colour = 0;
};
struct ReachTarget {
  double x = 0, y = 0;  // the zone's centre
  int64_t colour = 0;
};

struct ReachStep {
  Observation observation;
  bool success = false;  // the instruction's task is done
  bool done = false;     // success or the step limit
};

class ReachEnv {
 public:
  explicit ReachEnv(ReachOptions options = {});

  // A new scene from `seed`; swap_instruction: the instruction names the task with its colours
  // swapped ("put the blue block on the red target" for red / blue), and that is the task the
  // episode is judged by (success(), done); the original task stays original_task().
  Observation reset(uint64_t seed, bool swap_instruction = false);
  // One step; action: [3] (or [1, 3]) float32-convertible.
  ReachStep step(const at::Tensor& action);
  ReachStep step(double dx, double dy, double grip);

  Observation observe() const;
  media::Image render() const;

  const ReachOptions& options() const { return options_; }
  const std::string& instruction() const { return instruction_; }
  // (block colour, target colour): the instructed task, and the scene's task before any swap.
  std::pair<int64_t, int64_t> task() const { return task_; }
  std::pair<int64_t, int64_t> original_task() const { return original_task_; }
  // Whether the block of block_colour lies wholly inside the target of target_colour with the
  // gripper open.
  bool task_done(int64_t block_colour, int64_t target_colour) const;
  bool success() const { return task_done(task_.first, task_.second); }
  int64_t steps() const { return steps_; }
  bool done() const { return success() || steps_ >= options_.max_steps; }

  // Ground truth (also in the observation under "env/").
  const std::vector<ReachBlock>& blocks() const { return blocks_; }
  const std::vector<ReachTarget>& targets() const { return targets_; }
  double gripper_x() const { return gx_; }
  double gripper_y() const { return gy_; }
  bool gripper_closed() const { return closed_; }
  int64_t held() const { return held_; }  // -1: none

  // Tests and tools: place things by hand (no checks beyond the table).
  void set_scene(std::vector<ReachBlock> blocks, std::vector<ReachTarget> targets, double gx, double gy,
                 std::pair<int64_t, int64_t> task);

 private:
  ReachOptions options_;
  std::vector<ReachBlock> blocks_;
  std::vector<ReachTarget> targets_;
  double gx_ = 0.5, gy_ = 0.5;
  bool closed_ = false;
  int64_t held_ = -1, steps_ = 0;
  std::pair<int64_t, int64_t> task_{0, 1}, original_task_{0, 1};
  std::string instruction_;
};

// The scripted expert: reads the instruction (prompt), the gripper state ("observation/state" or
// "state") and the ground truth under "env/", and plans `chunk` actions: move to the named block
// (max_speed per component), close, carry it to the named target's centre, open, then stay. It
// plans from the observation alone (no pointer to the simulator), so it also drives the task
// through a policy server when the client sends the env/ arrays.
class ReachExpertPolicy : public Policy {
 public:
  explicit ReachExpertPolicy(int64_t chunk = 10, double max_speed = 0.05);
  nlohmann::json metadata() const override;
  at::Tensor infer(const Observation& obs) override;

 private:
  int64_t chunk_;
  double max_speed_;
};

// Uniform random actions: dx, dy in [-max_speed, max_speed], grip in [-1, 1], one stream drawn
// from `seed` (episodes differ; a run is reproducible).
class ReachRandomPolicy : public Policy {
 public:
  explicit ReachRandomPolicy(uint64_t seed = 0, int64_t chunk = 10, double max_speed = 0.05);
  nlohmann::json metadata() const override;
  at::Tensor infer(const Observation& obs) override;

 private:
  uint64_t state_;
  int64_t chunk_;
  double max_speed_;
};

}  // namespace lf::vla

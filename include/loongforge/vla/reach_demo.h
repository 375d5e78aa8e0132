// Demonstrations of the reach task (reach_env.h) for training a policy, and the processor that
// turns an observation into a pi05 model's inputs:
//   - the prompt, pi0.5-style: the instruction's words then "state" and the gripper state
//     discretised into bins (one token per dimension), padded to a fixed length, from a fixed
//     word vocabulary (ReachPrompt);
//   - actions normalised to [-1, 1]: dx, dy divided by the task's max speed, grip -1 (open) / +1
//     (close);
//   - a sample store: the scripted expert's episodes, one sample per step (the camera image, the
//     prompt, and the expert's plan of the next `chunk` actions from that state as the label),
//     in safetensors shards with a meta.json (write_reach_demos, ReachDemoStore). Episodes from
//     seeds seed .. seed + episodes - 1; in every other episode the executed motions get Gaussian
//     noise (the labels stay the expert's plan), so the data shows how to recover from a drift.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include "loongforge/vla/reach_env.h"

namespace lf::vla {

struct ReachPrompt {
  int64_t state_bins = 32;  // each state dim in [0, 1] -> one of this many tokens
  int64_t length = 16;      // prompt tokens, padded
  // Four query words after the state ("block_x block_y target_x target_y"), whose co-training
  // labels (position_labels) are the named block's and target's centres in the state's bins: a
  // pi05 with model.prefix_lm_loss_weight > 0 learns to read them from the image.
  bool position_queries = false;
  // Sixteen query words after those, four per colour ("red_block_x red_block_y red_target_x
  // red_target_y green_block_x ..."), labelled with that colour's block and target centres (-100
  // where the scene has none): they ask for every object, not only the named ones, so that reading
  // positions from the image is learnt apart from binding the instruction's colours.
  bool scene_queries = false;
  // pi0.5's hierarchical inference on the reach task: the prompt ends with the named block's and
  // target's query words in their colours ("red_block_x red_block_y blue_target_x blue_target_y"
  // for "put the red block on the blue target", labelled with their positions) and then their four
  // answers (bin words) in an attention block of their own (ar_mask): the queries do not see the
  // answers, the action expert does. Training stores the true answers; a policy decodes them with
  // the prefix LM first (located_slots, set_answers), then samples its actions after them.
  bool located = false;

  // "<pad>", the instruction words, "state", then "s0" .. "s<bins - 1>" (and with position_queries
  // the four query words, with scene_queries the sixteen).
  std::vector<std::string> vocab() const;
  int64_t vocab_size() const { return static_cast<int64_t>(vocab().size()); }
  // ids [length] int64 and mask [length] bool of `instruction` and `state` [3]; an lf::Error for a
  // word outside the vocabulary or a prompt longer than `length`.
  std::pair<at::Tensor, at::Tensor> encode(const std::string& instruction, const at::Tensor& state) const;
  // The state an encoded prompt carries, each dim at its bin's centre ((bin + 0.5) / state_bins):
  // ids [length] -> float32 [dims]; an lf::Error when the prompt has no "state" word.
  at::Tensor decode_state(const at::Tensor& ids) const;
  // With position_queries: labels [length] int64 for an encoded prompt, -100 but at the four query
  // words, there the bin token of block x, block y, target x, target y (`positions`, each in [0, 1]).
  at::Tensor position_labels(const at::Tensor& ids, const std::array<double, 4>& positions) const;
  // Labels [length] int64 for an encoded prompt: at each query word named in `positions` (query
  // word -> value in [0, 1]) the bin token of its value, -100 elsewhere. An lf::Error for a name
  // that is not a query word of this prompt's vocabulary.
  at::Tensor query_labels(const at::Tensor& ids, const std::map<std::string, double>& positions) const;
  // The labels of an encoded prompt in `env`'s current scene: the named queries (position_queries)
  // and the scene queries (scene_queries); undefined when the prompt has neither.
  at::Tensor scene_labels(const at::Tensor& ids, const ReachEnv& env) const;
  bool has_queries() const { return position_queries || scene_queries || located; }
  // With located: the positions of the four located query words in an encoded prompt (their
  // answers follow at q[3] + 1 .. q[3] + 4); an lf::Error when the prompt lacks them.
  std::array<int64_t, 4> located_slots(const at::Tensor& ids) const;
  // With located: ar_mask [length] bool of an encoded prompt (true at the first answer: the
  // answers are a block of their own); undefined without located.
  at::Tensor ar_mask(const at::Tensor& ids) const;
  // With located: writes the bin words of `values` (block x, block y, target x, target y, each in
  // [0, 1]) into the answers of an encoded prompt `ids` [length] (in place).
  void set_answers(at::Tensor& ids, const std::array<double, 4>& values) const;
  // The instruction's block and target colours ("put the <colour> block on the <colour> target");
  // an lf::Error naming the instruction otherwise.
  std::pair<std::string, std::string> instruction_colours(const std::string& instruction) const;
  // The bin word ("s<k>") of a value in [0, 1] (clamped).
  std::string bin_word(double v) const;
};

struct ReachDemoMeta {
  int64_t image_size = 32;
  int64_t chunk = 10;
  int64_t action_dim = 3;
  double max_speed = 0.05;
  int64_t max_steps = 100;
  ReachPrompt prompt;
  uint64_t seed = 0;
  int64_t episodes = 0, samples = 0;
  double noise = 0.3;  // executed-motion noise in units of max_speed (every other episode)
  // Keep every k-th step of an episode (episode e keeps the steps t with (t + e) % k == 0): more
  // scenes for the same number of samples.
  int64_t sample_every = 1;
};

// Normalised actions [n, 3] <-> the task's actions (dx, dy in max_speed units; grip sign).
at::Tensor normalize_reach_actions(const at::Tensor& actions, double max_speed);
at::Tensor unnormalize_reach_actions(const at::Tensor& actions, double max_speed);

// Runs the expert for `meta.episodes` episodes and writes DIR/meta.json and DIR/samples-NNNNN.safetensors
// (images uint8 [n, 3, S, S], prompt_tokens int64 [n, L], prompt_masks uint8 [n, L], actions
// float32 [n, chunk, 3] normalised, episode int64 [n]; with position_queries prompt_labels int64
// [n, L]). Returns the meta written (samples counted).
ReachDemoMeta write_reach_demos(const std::string& dir, ReachDemoMeta meta);

struct ReachDemoSample {
  at::Tensor image;   // uint8 [3, S, S]
  at::Tensor tokens;  // int64 [L]
  at::Tensor mask;    // bool [L]
  at::Tensor actions; // float32 [chunk, 3], normalised
  at::Tensor labels;  // int64 [L]: the position queries' labels (undefined without position_queries)
  at::Tensor ar_mask; // bool [L]: the prompt's attention blocks (undefined without located)
};

// A store written by write_reach_demos, read whole into memory (the demo's 800 episodes of 64 x 64
// images: about 0.6 GB per process); errors name the file.
class ReachDemoStore {
 public:
  explicit ReachDemoStore(const std::string& dir);
  const ReachDemoMeta& meta() const { return meta_; }
  const std::string& dir() const { return dir_; }
  int64_t size() const { return images_.size(0); }
  ReachDemoSample get(int64_t i) const;

 private:
  std::string dir_;
  ReachDemoMeta meta_;
  at::Tensor images_, tokens_, masks_, actions_, labels_, ar_masks_;
};

// The meta.json of a store (what a policy trained on it needs to process observations).
ReachDemoMeta read_reach_demo_meta(const std::string& dir);

}  // namespace lf::vla

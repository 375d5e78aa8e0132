// loongforge-generate --policy-inputs: a pi05 policy (a LeRobot pi05 directory or a native pi05
// checkpoint) on one batch as LeRobot's PI05Pytorch takes it after its processor: the element-wise
// flow-matching loss of PI05Pytorch.forward (--dump-loss) and/or the actions sample_actions
// Euler-samples from the given noise (--dump-actions). A model-only entry for parity and debugging.
#pragma once

#include <cstdint>
#include <string>

namespace lf::tools::generate {

struct PolicyOptions {
  std::string load;         // LeRobot pi05 directory or checkpoint directory
  int64_t iteration = -1;   // of a checkpoint; -1: the latest
  std::string inputs;       // --policy-inputs
  std::string loss;         // --dump-loss
  std::string actions;      // --dump-actions
  int64_t steps = 0;        // --num-inference-steps (0: the policy's num_inference_steps)
};

inline constexpr const char* kPolicyHint =
    "a pi05 policy runs on one batch: --policy-inputs FILE.safetensors (images [n_cam, b, 3, H, W] in [-1, 1], "
    "img_masks [n_cam, b], tokens [b, L], masks [b, L], actions, noise [b, chunk, max_action_dim], time [b]) with "
    "--dump-loss OUT.safetensors and/or --dump-actions OUT.safetensors [--num-inference-steps N]";

// True when `dir` is a LeRobot pi05 directory or a checkpoint (its `iteration`) of a pi05 model.
bool is_policy_model(const std::string& dir, int64_t iteration);

int run_policy(const PolicyOptions& o);

}  // namespace lf::tools::generate

// AdamW (decoupled weight decay; none on norms and biases) over the ranges of a GradBuffer this
// rank owns: the whole model, or under ZeRO-1 (use_distributed_optimizer) its data-parallel shard,
// whose fp32 master weights and Adam moments are the only optimizer state it keeps. One step:
// global-norm clipping (train/grad_clip.h), the backend's adamw_step on fp32 masters with the fp32
// main gradients, then the masters go back into the model (copy, or all-gather under ZeRO-1).
// Not the gradient reduction (train/grad_buffer.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/train/grad_buffer.h"
#include "loongforge/train/grad_clip.h"
#include "loongforge/train/master_params.h"

namespace lf::train {

struct StepResult {
  double grad_norm = 0;      // before clipping
  double clip_coeff = 1;     // applied to the gradients (1: not clipped)
  bool skipped = false;      // the norm was not finite and skip_nonfinite was set
};

class AdamW {
 public:
  // grads must outlive the optimizer. Reads the current parameters as the fp32 masters.
  AdamW(GradBuffer& grads, const lf::config::OptimizerConfig& config,
        const lf::backend::DeviceBackend& backend, GradNormGroups norm_groups = {});

  // After grads.finish_grad_sync(): clips, updates the owned masters with learning rate `lr`,
  // publishes them into the model. A non-finite gradient norm throws naming the step, unless
  // skip_nonfinite: then nothing is updated and the result says skipped.
  StepResult step(double lr, bool skip_nonfinite = false);
  int64_t steps_taken() const { return step_; }
  const MasterParams& masters() const { return masters_; }
  // Checkpointing (train/checkpoint.h): the fp32 state per bucket, aligned with the master shards
  // (update in place: the step's views point into them), and the step count of bias correction.
  MasterParams& masters() { return masters_; }
  const std::vector<at::Tensor>& exp_avg() const { return exp_avg_; }
  const std::vector<at::Tensor>& exp_avg_sq() const { return exp_avg_sq_; }
  std::vector<at::Tensor>& exp_avg() { return exp_avg_; }
  std::vector<at::Tensor>& exp_avg_sq() { return exp_avg_sq_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }
  // Bytes of optimizer state on this rank (masters + both moments).
  int64_t state_bytes() const;

 private:
  struct Group {
    std::vector<at::Tensor> masters, grads, exp_avg, exp_avg_sq;  // views, one per owned piece
    double weight_decay = 0;
  };
  GradBuffer& grads_;
  lf::config::OptimizerConfig config_;
  const lf::backend::DeviceBackend& backend_;
  GradNormGroups norm_groups_;
  MasterParams masters_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;  // per bucket, shaped like the master shards
  Group groups_[2];  // [0]: with weight decay, [1]: without (norms, biases)
  int64_t step_ = 0;
};

}  // namespace lf::train

// The optimizer over every gradient buffer of a model (one per parameter group): AdamW
// (decoupled weight decay; none on norms and biases) or SGD with momentum (Megatron's --optimizer
// sgd: torch's SGD, L2 weight decay), on the ranges of each buffer this rank owns (the whole
// group, or under ZeRO-1 its data-parallel shard), whose fp32 master weights and moments are the
// only optimizer state it keeps. One step: unscaling (a loss-scaled backward), global-norm
// clipping over all buffers (train/grad_clip.h), the update on the fp32 masters, then the masters
// go back into the model (copy, or all-gather under ZeRO-1). Not the gradient reduction
// (parallel/data/grad_buffer.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/parallel/data/grad_buffer.h"
#include "loongforge/parallel/data/master_params.h"
#include "loongforge/train/grad_clip.h"

namespace lf::train {

using lf::parallel::MasterParams;

struct StepResult {
  double grad_norm = 0;   // after unscaling, before clipping
  double clip_coeff = 1;  // applied to the gradients (1: not clipped)
  bool skipped = false;   // the norm was not finite (and skipping was allowed): nothing updated
};

// The optimizer state of one gradient buffer: fp32 masters and the moments (Adam: exp_avg,
// exp_avg_sq; SGD: momentum_buffer in exp_avg), per bucket, aligned with the buffer's owned ranges.
struct BufferState {
  GradBuffer* grads = nullptr;
  std::unique_ptr<MasterParams> masters;
  std::vector<at::Tensor> exp_avg, exp_avg_sq;
};

class Optimizer {
 public:
  // Every buffer must outlive the optimizer. Reads the current parameters as the fp32 masters.
  // world: the job's world (the gradient norm's all-reduce); null: a single process.
  Optimizer(std::vector<GradBuffer*> grads, const lf::config::OptimizerConfig& config,
            const lf::backend::DeviceBackend& backend, lf::backend::Communicator* world = nullptr);

  // After every buffer's finish_grad_sync(): multiplies the gradients by grad_scale (1 / loss
  // scale), clips, updates the owned masters with learning rate `lr`, publishes them into the
  // model. A non-finite gradient norm throws naming the step, unless skip_nonfinite: then nothing
  // is updated and the result says skipped.
  StepResult step(double lr, bool skip_nonfinite = false, double grad_scale = 1.0);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }
  // The state kinds checkpoints store besides "master": {"exp_avg", "exp_avg_sq"} (adam) or
  // {"momentum_buffer"} (sgd).
  std::vector<std::string> moment_kinds() const;
  // The per-bucket tensors of `kind` ("master" or a moment kind) of buffer i.
  std::vector<at::Tensor>& state(size_t buffer, const std::string& kind);
  const std::vector<at::Tensor>& state(size_t buffer, const std::string& kind) const {
    return const_cast<Optimizer*>(this)->state(buffer, kind);
  }
  const std::vector<BufferState>& buffers() const { return states_; }
  std::vector<BufferState>& buffers() { return states_; }
  // Masters copied again from the model (after loading weights without optimizer state).
  void reset_masters_from_model();
  void publish();
  // Bytes of optimizer state on this rank (masters + moments).
  int64_t state_bytes() const;
  const std::string& name() const { return config_.optimizer; }

 private:
  struct Group {  // views, one per owned piece, by weight decay
    std::vector<at::Tensor> masters, grads, exp_avg, exp_avg_sq;
    double weight_decay = 0;
  };
  std::vector<GradBuffer*> grad_list() const;
  lf::config::OptimizerConfig config_;
  const lf::backend::DeviceBackend& backend_;
  lf::backend::Communicator* world_;
  std::vector<BufferState> states_;
  Group groups_[2];  // [0]: with weight decay, [1]: without (norms, biases)
  int64_t step_ = 0;
};

}  // namespace lf::train

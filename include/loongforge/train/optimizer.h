// AdamW over a model's parameters with fp32 master weights (bf16/fp16 parameters keep an fp32
// copy; fp32 parameters are updated in place), no weight decay on norms and biases, global-norm
// gradient clipping, and data-parallel gradient averaging. The update itself is the backend's
// adamw_step. Not ZeRO-1 yet (see train/ roadmap in docs/architecture.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "loongforge/backend/communicator.h"
#include "loongforge/backend/device_backend.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/models/decoder.h"

namespace lf::train {

class AdamW {
 public:
  AdamW(const std::vector<lf::models::NamedParameter>& params,
        const lf::config::OptimizerConfig& config, const lf::backend::DeviceBackend& backend);

  // Averages gradients over `dp` (null: no data parallelism) in one flat buffer.
  void reduce_gradients(lf::backend::Communicator* dp);
  // Global L2 norm of the gradients (call after reduce_gradients: every DP rank then agrees).
  double grad_norm() const;
  // Clips to clip_grad (if > 0) and applies one AdamW update with learning rate `lr`.
  // Returns the norm before clipping.
  double step(double lr);
  void zero_grad();
  int64_t steps_taken() const { return step_; }

 private:
  struct Group {
    std::vector<at::Tensor> params, masters, exp_avg, exp_avg_sq;
    double weight_decay;
  };
  std::vector<lf::models::NamedParameter> params_;
  lf::config::OptimizerConfig config_;
  const lf::backend::DeviceBackend& backend_;
  std::vector<Group> groups_;
  int64_t step_ = 0;
};

}  // namespace lf::train

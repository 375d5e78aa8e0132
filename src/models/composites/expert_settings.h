// The expert-parallel and MoE-overlap settings a composite without experts (flow_matching,
// feature_regression, pi05, groot) refuses: they would do nothing. Each is an error naming its key.
#pragma once

#include <functional>
#include <string>

#include "loongforge/core/config/job_config.h"
#include "loongforge/dist/parallel_layout.h"

namespace lf::models {

// `given(key)`: the job's value of key comes from a file, flag or override, not the default.
inline void refuse_expert_settings(const std::string& type, const lf::config::JobConfig& job,
                                   const lf::dist::ParallelLayout& layout,
                                   const std::function<bool(const std::string&)>& given,
                                   const std::function<void(const std::string&, const std::string&,
                                                            const std::string&)>& refuse) {
  const auto& p = job.parallel;
  if (layout.size(lf::dist::Axis::ep) > 1)
    refuse("parallel.expert_model_parallel_size", type + " has no MoE experts to spread",
           "set --expert-model-parallel-size 1");
  if (p.expert_tensor_parallel_size)
    refuse("parallel.expert_tensor_parallel_size", type + " has no MoE experts to split",
           "drop --expert-tensor-parallel-size");
  if (given("parallel.moe_token_dispatcher_type"))
    refuse("parallel.moe_token_dispatcher_type", type + " has no MoE experts: no tokens are dispatched",
           "drop --moe-token-dispatcher-type");
  if (p.overlap_moe_expert_parallel_comm)
    refuse("parallel.overlap_moe_expert_parallel_comm", type + " has no expert communication to overlap",
           "drop --overlap-moe-expert-parallel-comm");
  if (p.moe_overlap_num_chunks)
    refuse("parallel.moe_overlap_num_chunks", type + " has no expert communication to overlap",
           "drop --moe-overlap-num-chunks");
  if (p.delay_wgrad_compute)
    refuse("parallel.delay_wgrad_compute", type + " has no expert communication to overlap the weight gradients with",
           "drop --delay-wgrad-compute");
  if (!p.moe_overlap_micro_batches)
    refuse("parallel.moe_overlap_micro_batches", type + " has no expert communication to overlap",
           "drop --no-moe-overlap-micro-batches");
}

}  // namespace lf::models

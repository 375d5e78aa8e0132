// Settings that would do nothing in the single-stage composites without MoE experts
// (flow_matching, feature_regression, pi05, groot): the expert-parallel and MoE-overlap settings,
// and the pipeline's stage layout. Each is refused with an error naming its key.
#pragma once

#include <functional>
#include <string>

#include "loongforge/core/config/job_config.h"
#include "loongforge/core/config/node.h"
#include "loongforge/dist/parallel_layout.h"

namespace lf::models {

// The `given` of the helpers below from a plan's origin(key) lambda: set by a file, flag or override.
template <class OriginFn>
std::function<bool(const std::string&)> set_by_user(const OriginFn& origin) {
  return [&origin](const std::string& key) { return origin(key).kind != lf::config::Origin::Kind::default_; };
}

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
  // Given with another value than the default (a checkpoint's config.yaml writes the default out).
  if (given("parallel.moe_token_dispatcher_type") &&
      p.moe_token_dispatcher_type != lf::config::ParallelConfig{}.moe_token_dispatcher_type)
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

// A stage layout for a model that runs as one pipeline stage (pipeline sizes > 1 are refused
// apart, by the composite).
inline void refuse_pipeline_layout_settings(const std::string& type, const lf::config::JobConfig& job,
                                            const std::function<void(const std::string&, const std::string&,
                                                                     const std::string&)>& refuse) {
  const auto& p = job.parallel;
  const std::string what = type + " runs as one pipeline stage: there are no stages to lay out";
  if (p.decoder_first_pipeline_num_layers)
    refuse("parallel.decoder_first_pipeline_num_layers", what, "drop --decoder-first-pipeline-num-layers");
  if (p.decoder_last_pipeline_num_layers)
    refuse("parallel.decoder_last_pipeline_num_layers", what, "drop --decoder-last-pipeline-num-layers");
  if (p.pipeline_model_parallel_layout)
    refuse("parallel.pipeline_model_parallel_layout", what, "drop --pipeline-model-parallel-layout");
  if (p.num_layers_per_virtual_pipeline_stage)
    refuse("parallel.num_layers_per_virtual_pipeline_stage", what, "drop --num-layers-per-virtual-pipeline-stage");
}

}  // namespace lf::models

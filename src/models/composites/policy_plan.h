// The layouts and settings the VLA policy composites (pi05_plan.cpp, groot_plan.cpp) refuse alike:
// one pipeline stage and no stage layout, no context or expert parallelism (nor the other expert
// settings), no ChunkPipe, no LoRA, no SFT phase, no recomputation; each an error naming the key
// and what to do.
#pragma once

#include <functional>
#include <string>

#include "unused_settings.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/dist/parallel_layout.h"

namespace lf::models {

using RefuseFn = std::function<void(const std::string& key, const std::string& what, const std::string& hint)>;

inline void refuse_policy_layouts(const std::string& type, const lf::config::JobConfig& job,
                                  const lf::dist::ParallelLayout& layout,
                                  const std::function<bool(const std::string&)>& given, const RefuseFn& refuse) {
  if (layout.size(lf::dist::Axis::pp) > 1)
    refuse("parallel.pipeline_model_parallel_size", type + " runs as one pipeline stage",
           "set --pipeline-model-parallel-size 1");
  if (layout.size(lf::dist::Axis::cp) > 1)
    refuse("parallel.context_parallel_size", type + " has no context parallelism (its sequences are short)",
           "set --context-parallel-size 1");
  refuse_expert_settings(type, job, layout, given, refuse);
  refuse_pipeline_layout_settings(type, job, refuse);
  if (job.parallel.chunkpipe_chunk_size)
    refuse("parallel.chunkpipe_chunk_size", type + " does not run under ChunkPipe", "drop --chunkpipe-chunk-size");
  if (job.lora.rank > 0) refuse("lora.rank", "LoRA adapters are built for the causal_lm composite", "drop --lora-rank");
  if (job.training.training_phase == "sft")
    refuse("training.training_phase", type + " reads VLA batches, not conversations", "drop --training-phase sft");
  if (job.training.recompute_granularity)
    refuse("training.recompute_granularity", type + " does not recompute activations yet",
           "drop --recompute-granularity");
}

}  // namespace lf::models

// Train and validation micro-batch sources for loongforge-train from the data config
// (--data-path/--split or --mock-data): Megatron GPT sampling, a DP-sliced sampler and a
// background loader per split.
#pragma once

#include <memory>

#include "loongforge/core/config/job_config.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/decoder_config.h"
#include "loongforge/train/trainer.h"

namespace lf::tools {

struct DataSources {
  std::unique_ptr<lf::train::BatchSource> train, valid;  // valid may be null (no valid split)
};

DataSources make_data_sources(const lf::config::JobConfig& job,
                              const lf::models::DecoderConfig& model,
                              const lf::dist::ParallelContext& ctx);

}  // namespace lf::tools

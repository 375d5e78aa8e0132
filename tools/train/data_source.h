// Train and validation micro-batch sources for loongforge-train: token datasets (--data-path /
// --split, or the mock token dataset) turned into named batches (tokens, labels, loss_mask, and
// with --reset-position-ids / --reset-attention-mask the per-document position_ids and
// document_ids, Megatron's get_ltor_masks_and_position_ids), completed by the model's mock fields
// under --mock-data; or, for models that read no tokens, batches the model synthesises from
// sample indices (--mock-data only). A DP-sliced sampler and background workers per split.
#pragma once

#include <memory>
#include <optional>

#include "loongforge/core/config/job_config.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/registry.h"
#include "loongforge/train/trainer.h"

namespace lf::tools {

struct DataSources {
  std::unique_ptr<lf::train::BatchSource> train, valid;  // valid may be null (no valid split)
};

// `eod`: the end-of-document id (from the tokenizer, or the mock dataset's), needed by the
// reset/eod flags.
DataSources make_data_sources(const lf::config::JobConfig& job, const lf::models::ModelPlan& plan,
                              const lf::dist::ParallelContext& ctx, std::optional<int64_t> eod);

// Megatron's masks and positions of token rows: loss_mask 0 where the input token is eod
// (eod_mask_loss); position_ids restarting after each eod; document_ids counting the eods before
// each position. Fields are added to `batch` from its `tokens`.
void add_document_fields(lf::data::Batch& batch, int64_t eod, bool eod_mask_loss, bool reset_position_ids,
                         bool reset_attention_mask);

}  // namespace lf::tools

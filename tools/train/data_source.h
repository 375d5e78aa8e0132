// Train and validation micro-batch sources for loongforge-train: token datasets (--data-path /
// --split, or the mock token dataset) turned into named batches (tokens, labels, loss_mask, and
// with --reset-position-ids / --reset-attention-mask the per-document position_ids and
// document_ids, Megatron's get_ltor_masks_and_position_ids), completed by the model's mock fields
// under --mock-data; or, for models that read no tokens, batches the model synthesises from
// sample indices (--mock-data only). A DP-sliced sampler and background workers per split.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

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

// SFT (--training-phase sft): one conversation per sample from the store `prefix`
// (<prefix>_input_ids_document + <prefix>_assistant_masks_document, written by `loongforge-data
// preprocess --conversations`). The split proportions cut the conversations into contiguous
// train / valid ranges; the train samples visit the train range in a new seeded permutation per
// epoch. Row r of a micro-batch: tokens = conversation[0 .. n-2], labels = conversation[1 .. n-1],
// loss_mask = the answer mask of the labels (a token counts when it is an answer token), padded to
// seq_length with pad_id / label -100 / mask 0; n = min(length, seq_length + 1).
struct SftOptions {
  std::string prefix;
  std::vector<double> split{1};
  int64_t seq_length = 0, micro_batch = 1, train_samples = 0, valid_samples = 0;
  int64_t vocab_size = 0;  // > 0: every token id is checked below it
  int dp_rank = 0, dp_size = 1;
  uint64_t seed = 0;
  int64_t pad_id = 0;
  bool log = false;
  // --packing-sft-data: a sample is a row of whole conversations (each epoch's order cut greedily
  // at seq_length positions; a conversation of n tokens takes n - 1), with position_ids restarting
  // per conversation and document_ids keeping attention within each (the padding is a document
  // of its own).
  bool pack = false;
  // The model reads media: the store must be a `preprocess --multimodal` one (and a text store
  // must not be), its placeholder ids those given (-1: unchecked). Media batches carry
  // pixel_values / image_grid_thw and pixel_values_videos / video_grid_thw / second_per_grid_ts.
  bool media = false;
  int64_t image_token_id = -1, video_token_id = -1;
  int64_t patch_size = 0, temporal_patch_size = 0, merge_size = 0;  // the tower's (0: unchecked)
  std::string videos_why;  // non-empty: the store's videos are refused, for this reason
  // --use-vlm-dp-balance (the train split; multimodal stores, unpacked, dp_size > 1): each
  // iteration's global_batch samples (consumed .. consumed + global_batch, the ones Megatron's
  // sampler hands the DP ranks) are planned by lf::data::plan_balance on their token lengths, and
  // this rank reads its planned micro-batches itself (every rank maps the whole store, so no
  // samples move). The cost model is balance_cost (a, b, c), or fitted after balance_warmup_iters
  // iterations of Megatron's split from the times the trainer reports (all but the first): every
  // rank's (sum len^2, sum len, n, seconds) gathered over `group`, fitted on its rank 0 and
  // broadcast. The first balanced plan's checksum is compared over `group`.
  bool balance = false;
  std::vector<double> balance_cost;
  int64_t balance_warmup_iters = 5, global_batch = 0, log_interval = 1;
  lf::backend::Communicator* group = nullptr;  // every rank of the run (the fit, the plan check)
  c10::Device device = c10::kCPU;              // of the group's tensors
};
DataSources make_sft_sources(const SftOptions& options);

// Megatron's masks and positions of token rows: loss_mask 0 where the input token is eod
// (eod_mask_loss); position_ids restarting after each eod; document_ids counting the eods before
// each position. Fields are added to `batch` from its `tokens`.
void add_document_fields(lf::data::Batch& batch, int64_t eod, bool eod_mask_loss, bool reset_position_ids,
                         bool reset_attention_mask);

}  // namespace lf::tools

// The layer split of a pipeline: which contiguous range of decoder layers each stage holds,
// evenly or with Megatron's uneven first/last stage sizes. Pure arithmetic (no tensors, no
// groups); the decoder builds its stage from it and --dry-run prints it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lf::parallel::pipeline {

// Layers [begin, end) of the full model (global indices).
struct LayerRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// One range per stage, in stage order, covering [0, num_layers). Without first/last every stage
// holds num_layers / pp layers (an error naming both values when that does not divide). With
// Megatron's --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers the first
// and/or last stage hold the given counts and the remaining layers split evenly over the other
// stages (an error naming the values when they do not). Uneven counts need pp > 1.
std::vector<LayerRange> split_layers(int64_t num_layers, int pp, std::optional<int64_t> first = {},
                                     std::optional<int64_t> last = {});

// The interleaved schedule's split (Megatron's --num-layers-per-virtual-pipeline-stage L): the
// model is cut into num_layers / L virtual stages of L layers; virtual stage c * pp + r is rank
// r's model chunk c, so every rank holds v = num_layers / (pp * L) chunks. Result[r][c]: rank r's
// chunk c. Errors name the values when num_layers is not a multiple of pp * L.
std::vector<std::vector<LayerRange>> split_virtual_layers(int64_t num_layers, int pp,
                                                          int64_t layers_per_virtual_stage);

// Megatron's --pipeline-model-parallel-layout: stages separated by '|', listed in forward order
// (every rank's chunk 0, then every rank's chunk 1, ...), so the stage count is pp x v. 'E' is
// the embedding (first stage, first), 't' a decoder layer, 'L' the loss (last stage, last); 'x*N'
// repeats one symbol, '(...)*N' a group; ',' and spaces are ignored; empty stages are allowed.
// MTP ('m') is not supported. Result[r][c]: rank r's chunk c (layers in order). Errors name the
// layout and what is wrong (layer count, stage count, symbols).
std::vector<std::vector<LayerRange>> split_by_layout(const std::string& layout, int64_t num_layers, int pp);

// The part of a layered model one pipeline rank holds: one or more model chunks, each a contiguous
// range of layers (global indices); several under the interleaved schedule (virtual stages, in
// virtual-stage order). What comes before the layers (embeddings, encoders) lives on the first
// stage, what comes after (final norm, heads, losses) on the last.
struct PipelineStage {
  std::vector<LayerRange> chunks;  // empty: the whole model, one chunk
  bool first = true, last = true;
  int64_t num_chunks() const { return chunks.empty() ? 1 : static_cast<int64_t>(chunks.size()); }
  // "layers [a, b)" or "layers [a, b) + [c, d)" (virtual stages): for messages.
  std::string describe() const;
};

// How the layers are split: evenly, with uneven first/last stage sizes, into virtual stages
// (interleaved schedule) or by a layout string; at most one of the three ways.
struct StageSplit {
  std::optional<int64_t> first_stage_layers, last_stage_layers;  // --decoder-first/last-pipeline-num-layers
  std::optional<int64_t> layers_per_virtual_stage;               // --num-layers-per-virtual-pipeline-stage
  std::optional<std::string> layout;                             // --pipeline-model-parallel-layout
};

// Rank pp_rank of pp: its layers by split_layers, split_virtual_layers or split_by_layout. Errors
// name the values and the flags.
PipelineStage pipeline_stage(int64_t num_layers, int pp, int pp_rank, const StageSplit& split = {});

}  // namespace lf::parallel::pipeline

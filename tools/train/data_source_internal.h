// Pieces loongforge-train's data sources share (data_source.cpp, latent_source.cpp). Not an API.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data_source.h"
#include "loongforge/data/sampler.h"

namespace lf::tools {

// Megatron's sampler over `samples` indices, positioned after `consumed` (all DP ranks').
std::unique_ptr<lf::data::PretrainingSampler> sampler_at(int64_t samples, int64_t micro_batch, int dp_rank, int dp_size,
                                                         int64_t consumed);
// Items [begin, end) in epoch `epoch`'s order: a permutation seeded by (seed, epoch), or in order
// when not shuffled.
std::vector<int64_t> epoch_permutation(int64_t begin, int64_t end, bool shuffle, uint64_t seed, int64_t epoch);
// The batch of a store's items (the fields; the source sets the sample indices).
using AssembleRows = std::function<lf::data::Batch(const std::vector<int64_t>& items)>;
// A store's sources, one item per row: training over items [0, train_end) in epoch_permutation
// order (shuffled by training.seed), validation over [train_end, valid_end) in order (none when
// empty or valid_samples is 0); train_samples / valid_samples rows in all through Megatron's
// sampler (DP-sliced); each batch's sample indices are the global sample counters. `what` names
// the store in messages.
DataSources make_store_sources(const AssembleRows& assemble, int64_t train_end, int64_t valid_end,
                               int64_t train_samples, int64_t valid_samples, const lf::config::JobConfig& job,
                               const lf::dist::ParallelContext& ctx, const std::string& what);
// The ends of the train and valid parts of n samples cut by the split proportions (data.split).
std::pair<int64_t, int64_t> split_ends(const std::vector<double>& split, int64_t n, const std::string& store);
// Diffusion models (DataNeeds::latents) on a latent store, data.data_path (latent_source.cpp).
DataSources make_latent_sources(const lf::config::JobConfig& job, const lf::models::DataNeeds& needs,
                                const lf::dist::ParallelContext& ctx, int64_t train_samples, int64_t valid_samples);

// VLA policies (DataNeeds::vla) on a reach demo store, data.data_path (vla_source.cpp).
DataSources make_vla_sources(const lf::config::JobConfig& job, const lf::models::DataNeeds& needs,
                             const lf::dist::ParallelContext& ctx, int64_t train_samples, int64_t valid_samples);

}  // namespace lf::tools

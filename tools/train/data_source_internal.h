// Pieces loongforge-train's data sources share (data_source.cpp, latent_source.cpp). Not an API.
#pragma once

#include <cstdint>
#include <memory>
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
// Diffusion models (DataNeeds::latents) on a latent store, data.data_path (latent_source.cpp).
DataSources make_latent_sources(const lf::config::JobConfig& job, const lf::models::DataNeeds& needs,
                                const lf::dist::ParallelContext& ctx, int64_t train_samples, int64_t valid_samples);

}  // namespace lf::tools

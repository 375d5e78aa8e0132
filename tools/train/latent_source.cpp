// loongforge-train's sources over sample stores: the generic store source (a seeded permutation
// per epoch), the split, and the diffusion models' latent store (data/latent_store.h).
#include <ATen/Functions.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "data_source_internal.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/data/latent_store.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/registry.h"

namespace lf::tools {

std::unique_ptr<lf::data::PretrainingSampler> sampler_at(int64_t samples, int64_t micro_batch, int dp_rank, int dp_size,
                                                         int64_t consumed) {
  lf::data::PretrainingSampler::State state;
  state.consumed_samples = consumed;
  return std::make_unique<lf::data::PretrainingSampler>(samples, micro_batch, dp_rank, dp_size, state);
}

// Fisher-Yates by hand (std::shuffle's order is not specified).
std::vector<int64_t> epoch_permutation(int64_t begin, int64_t end, bool shuffle, uint64_t seed, int64_t epoch) {
  const int64_t n = end - begin;
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = begin + i;
  if (!shuffle) return perm;
  std::mt19937_64 rng(seed * 1000003ull + static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

namespace {

// One sample of a store per row: the samples [begin, end) of the split, in a new seeded
// permutation every epoch (in order for validation); the global sample counter k (Megatron's
// sampler, DP-sliced) reads epoch k / n, position k % n, and is the batch's sample index (models
// key their noise on it). `assemble` makes the batch of the store items.
class StoreSource final : public lf::train::BatchSource {
 public:
  StoreSource(AssembleRows assemble, int64_t begin, int64_t end, int64_t samples, int64_t micro_batch, int dp_rank,
              int dp_size, uint64_t seed, bool shuffle, std::string what)
      : assemble_(std::move(assemble)), begin_(begin), end_(end), samples_(samples), micro_batch_(micro_batch),
        dp_rank_(dp_rank), dp_size_(dp_size), seed_(seed), shuffle_(shuffle), what_(std::move(what)) {
    rewind();
  }
  lf::data::Batch next() override {
    auto indices = sampler_->next_micro_batch();
    LF_CHECK(indices.has_value(), what_, "'s split ran out of samples (", samples_, ")");
    std::vector<int64_t> items;
    for (int64_t k : *indices) {
      const int64_t n = end_ - begin_;
      if (k / n != order_epoch_) order_ = epoch_permutation(begin_, end_, shuffle_, seed_, k / n), order_epoch_ = k / n;
      items.push_back(order_[static_cast<size_t>(k % n)]);
    }
    lf::data::Batch batch = assemble_(items);
    batch.sample_indices = *indices;
    return batch;
  }
  void rewind() override { seek(0); }
  bool seek(int64_t consumed) override {
    sampler_ = sampler_at(samples_, micro_batch_, dp_rank_, dp_size_, consumed);
    return true;
  }

 private:
  AssembleRows assemble_;
  int64_t begin_, end_, samples_, micro_batch_;
  int dp_rank_, dp_size_;
  uint64_t seed_;
  bool shuffle_;
  std::string what_;
  std::unique_ptr<lf::data::PretrainingSampler> sampler_;
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
};

// Diffusion: a latent store's samples (`loongforge-data diffusion`). A micro-batch's latents must
// share their shape; text (and image) embeddings are padded with zero rows to the longest (as Wan
// pads its text embeddings).
lf::data::Batch latent_rows(const lf::data::LatentStore& store, const std::vector<int64_t>& items) {
  auto pad = [](std::vector<at::Tensor> xs) {
    int64_t longest = 0;
    for (const auto& x : xs) longest = std::max(longest, x.size(0));
    for (auto& x : xs)
      if (x.size(0) < longest) x = at::cat({x, at::zeros({longest - x.size(0), x.size(1)}, x.options())});
    return at::stack(xs);
  };
  std::vector<at::Tensor> lat, text, image;
  for (int64_t item : items) {
    const auto row = store.get(item);
    LF_CHECK(lat.empty() || row.latents.sizes() == lat[0].sizes(), "latent store ", store.dir(), ": samples ",
             items[0], " and ", item, " of one micro-batch have latents of shapes ", lat.empty() ? row.latents.sizes() : lat[0].sizes(),
             " and ", row.latents.sizes(),
             lf::hint("a micro-batch stacks its latents: use --micro-batch-size 1, or one resolution and length "
                      "per store"));
    lat.push_back(row.latents);
    text.push_back(row.text);
    if (row.image.defined()) image.push_back(row.image);
  }
  lf::data::Batch batch;
  batch.set("latents", at::stack(lat));
  batch.set("text_embeddings", pad(text));
  if (!image.empty()) batch.set("image_embeddings", pad(image));
  return batch;
}

}  // namespace

DataSources make_store_sources(const AssembleRows& assemble, int64_t train_end, int64_t valid_end,
                               int64_t train_samples, int64_t valid_samples, const lf::config::JobConfig& job,
                               const lf::dist::ParallelContext& ctx, const std::string& what) {
  const auto& t = job.training;
  const uint64_t seed = static_cast<uint64_t>(t.seed);
  DataSources out;
  out.train = std::make_unique<StoreSource>(assemble, 0, train_end, train_samples, t.micro_batch_size, ctx.dp_rank(),
                                            ctx.dp_size(), seed, true, what);
  if (valid_samples > 0 && valid_end > train_end)
    out.valid = std::make_unique<StoreSource>(assemble, train_end, valid_end, valid_samples, t.micro_batch_size,
                                              ctx.dp_rank(), ctx.dp_size(), seed, false, what);
  return out;
}

std::pair<int64_t, int64_t> split_ends(const std::vector<double>& split, int64_t n, const std::string& store) {
  double total = 0;
  for (double w : split) total += w;
  LF_CHECK(total > 0, "the split proportions sum to ", total);
  const int64_t train_end = std::min<int64_t>(
      n, static_cast<int64_t>(std::llround((split.empty() ? 1.0 : split[0]) / total * static_cast<double>(n))));
  const int64_t valid_end = std::min<int64_t>(
      n, train_end + static_cast<int64_t>(std::llround((split.size() > 1 ? split[1] : 0.0) / total *
                                                       static_cast<double>(n))));
  LF_CHECK(train_end > 0, "the train part of the split holds no sample of the ", n, " in ", store);
  return {train_end, valid_end};
}

DataSources make_latent_sources(const lf::config::JobConfig& job, const lf::models::DataNeeds& needs,
                                const lf::dist::ParallelContext& ctx, int64_t train_samples, int64_t valid_samples) {
  const auto& d = job.data;
  LF_CHECK(d.data_path.size() == 1, "a diffusion model reads one latent store, data.data_path has ", d.data_path.size(),
           " entries", lf::hint("pass --data-path DIR (made by loongforge-data diffusion)"));
  auto store = std::make_shared<const lf::data::LatentStore>(d.data_path[0]);
  const auto& info = store->info();
  LF_CHECK(info.latent_channels == needs.latent_channels && info.text_dim == needs.text_dim &&
               info.image_dim == needs.image_dim,
           "latent store ", d.data_path[0], " holds ", info.latent_channels, " latent channels, text width ",
           info.text_dim, ", image width ", info.image_dim, " (vae: ", info.vae, ", text encoder: ", info.text_encoder,
           "); the model takes ", needs.latent_channels, ", ", needs.text_dim, ", ", needs.image_dim,
           lf::hint("make the store with the model's VAE and text encoder, or set model.foundation.in_channels / "
                    "text_dim / image_dim to the store's"));
  const auto [train_end, valid_end] = split_ends(d.split, store->size(), d.data_path[0]);
  const int64_t n = store->size();
  if (ctx.global_rank() == 0)
    LF_INFO("latent store ", d.data_path[0], ": ", n, " samples (train ", train_end, ", valid ", valid_end - train_end,
            "), ", info.latent_channels, " latent channels, text width ", info.text_dim, " | vae: ", info.vae,
            " | text encoder: ", info.text_encoder);
  auto rows = [store](const std::vector<int64_t>& items) { return latent_rows(*store, items); };
  return make_store_sources(rows, train_end, valid_end, train_samples, valid_samples, job, ctx,
                            "the latent store " + d.data_path[0]);
}

}  // namespace lf::tools

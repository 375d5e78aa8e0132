#include "data_source.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/data/blended_dataset.h"
#include "loongforge/data/loader.h"
#include "loongforge/data/sampler.h"

namespace lf::tools {

void add_document_fields(lf::data::Batch& batch, int64_t eod, bool eod_mask_loss, bool reset_position_ids,
                         bool reset_attention_mask) {
  const at::Tensor& tokens = batch.at("tokens");  // [b, s]
  const at::Tensor is_eod = tokens.eq(eod);
  if (eod_mask_loss) {
    at::Tensor mask = batch.find("loss_mask") ? batch.at("loss_mask").clone() : at::ones(tokens.sizes(), at::kFloat);
    mask.masked_fill_(is_eod, 0.0);
    batch.set("loss_mask", mask, 1);
  }
  if (!reset_position_ids && !reset_attention_mask) return;
  // The document of position k: the eods strictly before it (an eod closes its own document).
  const at::Tensor doc = (is_eod.to(at::kLong).cumsum(1) - is_eod.to(at::kLong)).contiguous();
  if (reset_attention_mask) batch.set("document_ids", doc, 1);
  if (reset_position_ids) {
    const int64_t b = tokens.size(0), s = tokens.size(1);
    at::Tensor pos = at::empty({b, s}, at::kLong);
    const int64_t* d = doc.data_ptr<int64_t>();
    int64_t* p = pos.data_ptr<int64_t>();
    for (int64_t i = 0; i < b; ++i) {
      int64_t start = 0;
      for (int64_t k = 0; k < s; ++k) {
        if (k > 0 && d[i * s + k] != d[i * s + k - 1]) start = k;
        p[i * s + k] = k - start;
      }
    }
    batch.set("position_ids", pos, 1);
  }
}

namespace {

struct BatchOptions {
  std::optional<int64_t> eod;
  bool eod_mask_loss = false, reset_position_ids = false, reset_attention_mask = false, mock = false;
  uint64_t seed = 0;
  const lf::models::ModelPlan* plan = nullptr;
};

// One split's micro-batches for this DP rank from a token dataset. rewind() starts over from the
// first sample, so every evaluation sees the same held-out batches.
class LoaderSource final : public lf::train::BatchSource {
 public:
  LoaderSource(std::shared_ptr<const lf::data::SampleDataset> dataset, int64_t micro_batch, int dp_rank, int dp_size,
               int workers, std::string split, BatchOptions options)
      : dataset_(std::move(dataset)), micro_batch_(micro_batch), dp_rank_(dp_rank), dp_size_(dp_size),
        workers_(workers), split_(std::move(split)), options_(options) {
    rewind();
  }
  lf::data::Batch next() override {
    auto rows = loader_->next();
    LF_CHECK(rows.has_value(), "the ", split_, " split ran out of samples (", dataset_->size(), " built)",
             lf::hint("this is a bug in the sample count; please report it"));
    const int64_t b = rows->micro_batch_size, s = rows->sample_length - 1;
    auto t = at::from_blob(rows->tokens.data(), {b, rows->sample_length}, at::TensorOptions().dtype(at::kLong)).clone();
    lf::data::Batch batch;
    batch.set("tokens", t.narrow(1, 0, s).contiguous(), 1);
    batch.set("labels", t.narrow(1, 1, s).contiguous(), 1);
    batch.set("loss_mask", at::ones({b, s}, at::kFloat), 1);
    batch.sample_indices = rows->sample_indices;
    if (options_.eod)
      add_document_fields(batch, *options_.eod, options_.eod_mask_loss, options_.reset_position_ids,
                          options_.reset_attention_mask);
    if (options_.mock) options_.plan->add_mock_fields(batch, options_.seed);
    return batch;
  }
  void rewind() override { seek(0); }
  // Megatron's sampler state: the global consumed-sample count (any DP size continues it).
  bool seek(int64_t consumed_samples) override {
    loader_.reset();
    lf::data::PretrainingSampler::State state;
    state.consumed_samples = consumed_samples;
    lf::data::LoaderOptions lo;
    lo.workers = workers_;
    loader_ = std::make_unique<lf::data::BackgroundLoader>(
        dataset_, lf::data::PretrainingSampler(dataset_->size(), micro_batch_, dp_rank_, dp_size_, state), lo);
    return true;
  }

 private:
  std::shared_ptr<const lf::data::SampleDataset> dataset_;
  int64_t micro_batch_;
  int dp_rank_, dp_size_, workers_;
  std::string split_;
  BatchOptions options_;
  std::unique_ptr<lf::data::BackgroundLoader> loader_;
};

// Models that read no tokens (--mock-data): batches synthesised by the model's plan from the
// global sample indices this DP rank's sampler hands out.
class SyntheticSource final : public lf::train::BatchSource {
 public:
  SyntheticSource(const lf::models::ModelPlan& plan, int64_t samples, int64_t micro_batch, int dp_rank, int dp_size,
                  uint64_t seed)
      : plan_(plan), samples_(samples), micro_batch_(micro_batch), dp_rank_(dp_rank), dp_size_(dp_size), seed_(seed) {
    rewind();
  }
  lf::data::Batch next() override {
    auto indices = sampler_->next_micro_batch();
    LF_CHECK(indices.has_value(), "synthetic data ran out of samples (", samples_, ")");
    lf::data::Batch batch;
    batch.sample_indices = *indices;
    plan_.add_mock_fields(batch, seed_);
    return batch;
  }
  void rewind() override { seek(0); }
  bool seek(int64_t consumed) override {
    lf::data::PretrainingSampler::State state;
    state.consumed_samples = consumed;
    sampler_ = std::make_unique<lf::data::PretrainingSampler>(samples_, micro_batch_, dp_rank_, dp_size_, state);
    return true;
  }

 private:
  const lf::models::ModelPlan& plan_;
  int64_t samples_, micro_batch_;
  int dp_rank_, dp_size_;
  uint64_t seed_;
  std::unique_ptr<lf::data::PretrainingSampler> sampler_;
};

std::string split_string(const std::vector<double>& split) {
  std::ostringstream os;
  for (size_t i = 0; i < split.size(); ++i) os << (i ? "," : "") << split[i];
  return os.str();
}

}  // namespace

DataSources make_data_sources(const lf::config::JobConfig& job, const lf::models::ModelPlan& plan,
                              const lf::dist::ParallelContext& ctx, std::optional<int64_t> eod) {
  const auto& t = job.training;
  const int dp = ctx.dp_size();
  const int64_t global_batch = t.global_batch_size.value_or(t.micro_batch_size * dp);
  const auto needs = plan.data_needs();
  const int64_t train_samples = t.train_iters * global_batch;
  const int64_t valid_samples = t.eval_iters > 0 ? t.eval_iters * t.micro_batch_size * dp : 0;
  const uint64_t seed = static_cast<uint64_t>(t.seed);
  DataSources out;
  if (!needs.token_data) {
    out.train = std::make_unique<SyntheticSource>(plan, train_samples, t.micro_batch_size, ctx.dp_rank(), dp, seed);
    // Held-out samples: drawn from another seed.
    if (valid_samples > 0)
      out.valid = std::make_unique<SyntheticSource>(plan, valid_samples, t.micro_batch_size, ctx.dp_rank(), dp,
                                                    seed + 7919);
    return out;
  }
  lf::data::GptDataOptions o;
  o.data_path = job.data.data_path;
  o.split = split_string(job.data.split);
  o.seq_length = t.seq_length;
  o.seed = seed;
  o.num_samples = {train_samples, valid_samples, 0};
  o.mock = job.data.mock_data;
  o.mock_vocab_size = needs.vocab_size;
  o.vocab_size = needs.vocab_size;
  if (job.data.data_cache_path) o.cache_dir = *job.data.data_cache_path;
  LF_CHECK(o.mock || !o.data_path.empty(), "no training data: data.data_path is empty",
           lf::hint("pass --data-path PREFIX (a Megatron .bin/.idx pair) or --mock-data"));
  auto splits = lf::data::build_gpt_datasets(o);
  LF_CHECK(splits.datasets[0] != nullptr, "the train split of ", o.split, " has no documents",
           lf::hint("give the train part of --split a positive weight"));
  if (!job.data.valid_data_path.empty() && o.num_samples[1] > 0) {
    // Megatron's --valid-data-path: the whole of these datasets is the validation split.
    lf::data::GptDataOptions v = o;
    v.data_path = job.data.valid_data_path;
    v.split = "0,1,0";
    v.num_samples = {0, o.num_samples[1], 0};
    v.mock = false;
    splits.datasets[1] = lf::data::build_gpt_datasets(v).datasets[1];
  }
  BatchOptions bo;
  bo.eod = eod;
  bo.eod_mask_loss = job.data.eod_mask_loss;
  bo.reset_position_ids = job.data.reset_position_ids;
  bo.reset_attention_mask = job.data.reset_attention_mask;
  bo.mock = job.data.mock_data;
  bo.seed = seed;
  bo.plan = &plan;
  const int workers = static_cast<int>(job.data.num_workers);
  out.train = std::make_unique<LoaderSource>(splits.datasets[0], t.micro_batch_size, ctx.dp_rank(), dp, workers, "train", bo);
  if (splits.datasets[1]) {
    BatchOptions vo = bo;
    vo.seed = seed + 7919;  // the held-out split's mock fields differ from the training split's
    out.valid = std::make_unique<LoaderSource>(splits.datasets[1], t.micro_batch_size, ctx.dp_rank(), dp, workers,
                                               "valid", vo);
  }
  return out;
}

}  // namespace lf::tools

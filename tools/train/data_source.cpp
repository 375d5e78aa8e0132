#include "data_source.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/data/blended_dataset.h"
#include "loongforge/data/loader.h"

namespace lf::tools {
namespace {

// Feeds one split's micro-batches for this DP rank. rewind() starts over from the first sample,
// so every evaluation sees the same held-out batches.
class LoaderSource final : public lf::train::BatchSource {
 public:
  LoaderSource(std::shared_ptr<const lf::data::SampleDataset> dataset, int64_t micro_batch,
               int dp_rank, int dp_size, std::string split)
      : dataset_(std::move(dataset)), micro_batch_(micro_batch), dp_rank_(dp_rank),
        dp_size_(dp_size), split_(std::move(split)) {
    rewind();
  }
  at::Tensor next() override {
    auto batch = loader_->next();
    LF_CHECK(batch.has_value(), "the ", split_, " split ran out of samples (", dataset_->size(),
             " built)", lf::hint("this is a bug in the sample count; please report it"));
    auto t = at::from_blob(batch->tokens.data(), {batch->micro_batch_size, batch->sample_length},
                           at::TensorOptions().dtype(at::kLong));
    return t.clone();
  }
  void rewind() override { seek(0); }
  // Megatron's sampler state: the global consumed-sample count (any DP size continues it).
  bool seek(int64_t consumed_samples) override {
    loader_.reset();
    lf::data::PretrainingSampler::State state;
    state.consumed_samples = consumed_samples;
    loader_ = std::make_unique<lf::data::BackgroundLoader>(
        dataset_, lf::data::PretrainingSampler(dataset_->size(), micro_batch_, dp_rank_, dp_size_, state));
    return true;
  }

 private:
  std::shared_ptr<const lf::data::SampleDataset> dataset_;
  int64_t micro_batch_;
  int dp_rank_, dp_size_;
  std::string split_;
  std::unique_ptr<lf::data::BackgroundLoader> loader_;
};

std::string split_string(const std::vector<double>& split) {
  std::ostringstream os;
  for (size_t i = 0; i < split.size(); ++i) os << (i ? "," : "") << split[i];
  return os.str();
}

}  // namespace

DataSources make_data_sources(const lf::config::JobConfig& job,
                              const lf::models::DecoderConfig& model,
                              const lf::dist::ParallelContext& ctx) {
  const auto& t = job.training;
  const int dp = ctx.dp_size();
  const int64_t global_batch = t.global_batch_size.value_or(t.micro_batch_size * dp);
  lf::data::GptDataOptions o;
  o.data_path = job.data.data_path;
  o.split = split_string(job.data.split);
  o.seq_length = t.seq_length;
  o.seed = static_cast<uint64_t>(t.seed);
  o.num_samples = {t.train_iters * global_batch,
                   t.eval_iters > 0 ? t.eval_iters * t.micro_batch_size * dp : 0, 0};
  o.mock = job.data.mock_data;
  o.mock_vocab_size = model.vocab_size;
  o.vocab_size = model.vocab_size;
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
  DataSources out;
  out.train = std::make_unique<LoaderSource>(splits.datasets[0], t.micro_batch_size, ctx.dp_rank(),
                                             dp, "train");
  if (splits.datasets[1])
    out.valid = std::make_unique<LoaderSource>(splits.datasets[1], t.micro_batch_size,
                                               ctx.dp_rank(), dp, "valid");
  return out;
}

}  // namespace lf::tools

// Blends of sample datasets by weight (Megatron's BlendedDataset) and the builder that turns
// --data-path / --split / --mock-data into train, valid and test datasets. Not the per-dataset
// sampling itself (gpt_dataset.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/data/gpt_dataset.h"

namespace lf::data {

// Megatron's greedy blending: sample i comes from the dataset furthest behind its weight,
// argmax_d (w_d * (i+1) - count_d), the lowest index on ties. Weights are normalised here.
// dataset_index[i] picks the dataset; dataset_sample_index[i] is that dataset's count before i.
void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int32_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index);

class BlendedDataset final : public SampleDataset {
 public:
  // Every dataset must have the same sample_length and at least as many samples as the blend
  // draws from it (checked here, naming the dataset).
  BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets,
                 std::vector<double> weights, int64_t size);

  int64_t size() const override { return static_cast<int64_t>(dataset_index_.size()); }
  int64_t sample_length() const override { return datasets_.front()->sample_length(); }
  void get(int64_t i, int64_t* out) const override;
  using SampleDataset::get;

  const std::vector<int32_t>& dataset_index() const { return dataset_index_; }
  const std::vector<int64_t>& dataset_sample_index() const { return dataset_sample_index_; }

 private:
  std::vector<std::shared_ptr<const SampleDataset>> datasets_;
  std::vector<double> weights_;
  std::vector<int32_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

// --data-path as Megatron reads it: "A" | "A B C" (weights = sizes, i.e. concatenation
// proportions) | "0.3 A 0.7 B" (weight, prefix pairs). Throws on a mix or an odd count.
struct WeightedPrefix {
  double weight = 1.0;  // < 0: unweighted (to be set from sizes)
  std::string prefix;
};
std::vector<WeightedPrefix> parse_data_path(const std::vector<std::string>& words);

struct GptDataOptions {
  std::vector<std::string> data_path;  // as given on the command line (see parse_data_path)
  std::string split = "969,30,1";
  int64_t seq_length = 0;
  uint64_t seed = 1234;
  // Samples wanted for train, valid, test (Megatron: train_iters*gbs, evals*eval_iters*gbs, ...).
  std::array<int64_t, 3> num_samples{0, 0, 0};
  bool mock = false;        // synthetic data instead of data_path
  int64_t mock_vocab_size = 32000;
  int64_t mock_eod = 0;
  int64_t mock_sequences = 100000;  // Megatron's mock: 100k documents of up to 4096 tokens
  int64_t mock_max_length = 4096;
  std::string cache_dir;    // "" = beside the data
  int64_t vocab_size = -1;  // when >= 0 every dataset's tokens are checked against it once
};

// One dataset per split (null where the split has no documents or no samples were asked for):
// a single prefix gives a GptDataset, several a BlendedDataset of exactly num_samples[s] samples
// drawing ceil(1.005 * w * num_samples[s]) from each (Megatron's margin).
struct GptSplits {
  std::array<std::shared_ptr<const SampleDataset>, 3> datasets;  // train, valid, test
};
GptSplits build_gpt_datasets(const GptDataOptions& options);

}  // namespace lf::data

// GPT sampling as Megatron's GPTDataset does it: a document index (the split's documents,
// repeated per epoch and shuffled), a sample index (where each sample of seq_length+1 tokens
// starts) and a shuffle index, built once and cached next to the data. Not a sampler across
// ranks (sampler.h) and not a blend of datasets (blended_dataset.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loongforge/data/sequence_source.h"

namespace lf::data {

// Anything that yields fixed-length token samples by index. get() is thread-safe.
class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t sample_length() const = 0;  // seq_length + 1
  virtual void get(int64_t i, int64_t* out) const = 0;  // writes sample_length() tokens
  std::vector<int64_t> get(int64_t i) const;
};

// A half-open range [begin, end) of documents.
using DocRange = std::pair<int64_t, int64_t>;

// Megatron's --split: "969,30,1" (or "0.9,0.1"; missing parts are 0) normalised to weights over
// num_documents documents; entry s is nullopt when split s gets no documents. Rounding follows
// Megatron: each bound is the previous plus round(w * n) (half to even), then every bound after
// 0 is shifted by the rounding error so the last one is n.
std::array<std::optional<DocRange>, 3> split_ranges(const std::string& split, int64_t num_documents);

struct GptDatasetConfig {
  int64_t seq_length = 0;    // tokens a sample predicts; a sample holds seq_length + 1
  int64_t num_samples = 0;   // at least this many samples (whole epochs are built)
  uint64_t seed = 1234;
  std::string split_name = "train";  // for messages and cache descriptions only
  // Where the index cache goes: "" means beside the data (<prefix>.<hash>.*). Mock data and
  // use_cache=false build in memory.
  std::string cache_dir;
  bool use_cache = true;
};

// An index array held in 32 bits when every value fits, else in 64 (Megatron keeps its sample
// and shuffle indices in 32 bits for the same reason: an epoch of 6M short samples is 150 MB of
// int64 in every rank's memory, 75 MB in int32). Values are read as int64.
class IndexArray {
 public:
  IndexArray() = default;
  explicit IndexArray(const std::vector<int64_t>& values);
  int64_t operator[](size_t i) const { return wide_ ? w64_[i] : static_cast<int64_t>(w32_[i]); }
  size_t size() const { return wide_ ? w64_.size() : w32_.size(); }
  bool wide() const { return wide_; }  // int64 storage
  size_t bytes() const { return wide_ ? 8 * w64_.size() : 4 * w32_.size(); }
  std::vector<int64_t> to_vector() const;
  bool operator==(const IndexArray&) const = default;

 private:
  bool wide_ = false;
  std::vector<int32_t> w32_;
  std::vector<int64_t> w64_;
};

// Samples over the documents [range.first, range.second) of a source. In GPT sampling a
// "document" is one sequence of the indexed dataset (as in Megatron; preprocessing writes one
// sequence per document).
//
// Indices (int64 values, held as IndexArray: in 32 bits when they fit):
//   document_index [E*N]       document ids, epoch after epoch, shuffled (the last epoch apart
//                              when it is used for less than 80% of its samples)
//   sample_index   [S+1, 2]    (position in document_index, token offset) where sample s starts;
//                              sample s ends one token past where s+1 starts (the extra label)
//   shuffle_index  [S]         permutation of samples (same two-part rule as document_index)
// Randomness: std::mt19937_64(seed), Fisher-Yates with Lemire's unbiased bounded draw (docs/data.md).
class GptDataset final : public SampleDataset {
 public:
  GptDataset(std::shared_ptr<const SequenceSource> source, DocRange range, GptDatasetConfig config);

  int64_t size() const override { return static_cast<int64_t>(shuffle_index_.size()); }
  int64_t sample_length() const override { return config_.seq_length + 1; }
  void get(int64_t i, int64_t* out) const override;
  using SampleDataset::get;

  int64_t num_epochs() const { return num_epochs_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  const IndexArray& document_index() const { return document_index_; }
  const IndexArray& sample_index() const { return sample_index_; }  // flat [S+1, 2]
  const IndexArray& shuffle_index() const { return shuffle_index_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }
  // The cache files' common path stem (<dir>/<name>.<hash>), "" when not cached.
  const std::string& cache_stem() const { return cache_stem_; }
  const std::string& description() const { return description_; }

 private:
  // The three indices in int64, built from the source (the cache stores them so).
  void build(std::vector<int64_t>& document_index, std::vector<int64_t>& sample_index,
             std::vector<int64_t>& shuffle_index) const;

  std::shared_ptr<const SequenceSource> source_;
  DocRange range_;
  GptDatasetConfig config_;
  int64_t num_epochs_ = 0, tokens_per_epoch_ = 0;
  bool separate_final_epoch_ = false, loaded_from_cache_ = false;
  std::string description_, cache_stem_;
  IndexArray document_index_, sample_index_, shuffle_index_;
};

}  // namespace lf::data

// GPTDataset's three indices, their cache, and sample assembly.
#include "loongforge/data/gpt_dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "index_cache.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "random.h"

namespace lf::data {

std::vector<int64_t> SampleDataset::get(int64_t i) const {
  std::vector<int64_t> out(static_cast<size_t>(sample_length()));
  get(i, out.data());
  return out;
}

std::array<std::optional<DocRange>, 3> split_ranges(const std::string& split,
                                                    int64_t num_documents) {
  std::vector<double> w;
  std::stringstream ss(split);
  for (std::string part; std::getline(ss, part, split.find(',') != std::string::npos ? ',' : '/');) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(part, &used);
    } catch (const std::exception&) {
    }
    LF_CHECK(used == part.size() && v >= 0 && std::isfinite(v), "--split \"", split,
             "\": part \"", part, "\" is not a non-negative number",
             lf::hint("write train,valid,test weights, e.g. 969,30,1"));
    w.push_back(v);
  }
  LF_CHECK(!w.empty() && w.size() <= 3, "--split \"", split, "\" has ", w.size(),
           " parts; expected 1 to 3");
  w.resize(3, 0.0);
  double total = w[0] + w[1] + w[2];
  LF_CHECK(total > 0, "--split \"", split, "\" gives every split weight 0");
  std::array<int64_t, 4> bound{0, 0, 0, 0};
  for (int s = 0; s < 3; ++s)
    bound[s + 1] = bound[s] + static_cast<int64_t>(std::nearbyint(w[s] / total * num_documents));
  int64_t diff = bound[3] - num_documents;
  for (int s = 1; s < 4; ++s) bound[s] -= diff;
  std::array<std::optional<DocRange>, 3> out;
  for (int s = 0; s < 3; ++s)
    if (bound[s + 1] > bound[s]) out[s] = DocRange{bound[s], bound[s + 1]};
  return out;
}

GptDataset::GptDataset(std::shared_ptr<const SequenceSource> source, DocRange range,
                       GptDatasetConfig config)
    : source_(std::move(source)), range_(range), config_(std::move(config)) {
  LF_CHECK(source_ != nullptr, "GptDataset needs a source");
  LF_CHECK(config_.seq_length > 0, "seq_length must be positive, got ", config_.seq_length);
  LF_CHECK(config_.num_samples >= 0, "num_samples must be >= 0, got ", config_.num_samples);
  LF_CHECK(range_.first >= 0 && range_.first < range_.second &&
               range_.second <= source_->num_sequences(),
           source_->id(), ": document range [", range_.first, ", ", range_.second,
           ") is empty or outside [0, ", source_->num_sequences(), ")");
  for (int64_t d = range_.first; d < range_.second; ++d)
    tokens_per_epoch_ += source_->sequence_length(d);
  LF_CHECK(tokens_per_epoch_ > 1, source_->id(), ": the ", config_.split_name, " split [",
           range_.first, ", ", range_.second, ") holds ", tokens_per_epoch_,
           " tokens; a sample needs at least 2", lf::hint("use more data or change --split"));

  // Epochs: the fewest whose tokens give num_samples samples of seq_length (+1 shared label).
  const int64_t L = config_.seq_length, target = std::max<int64_t>(config_.num_samples, 1);
  num_epochs_ = 1;
  while ((num_epochs_ * tokens_per_epoch_ - 1) / L < target) ++num_epochs_;
  if (num_epochs_ > 1) {
    // Megatron: shuffle the last epoch on its own when less than 80% of it is used, so the
    // samples drawn from it are not biased towards the documents the shuffle put first.
    int64_t before_last = ((num_epochs_ - 1) * tokens_per_epoch_ - 1) / L;
    int64_t from_last = target - before_last;
    int64_t per_epoch = (tokens_per_epoch_ - 1) / L;
    LF_CHECK(from_last >= 0 && from_last <= per_epoch, "internal: epoch arithmetic");
    separate_final_epoch_ = from_last < static_cast<int64_t>(0.8 * static_cast<double>(per_epoch));
  }

  nlohmann::ordered_json d;
  d["class"] = "GptDataset";
  d["format"] = 1;
  d["source"] = source_->id();
  d["source_sequences"] = source_->num_sequences();
  d["split"] = config_.split_name;
  d["range"] = {range_.first, range_.second};
  d["tokens_per_epoch"] = tokens_per_epoch_;
  d["num_samples"] = config_.num_samples;
  d["seq_length"] = config_.seq_length;
  d["seed"] = config_.seed;
  d["add_extra_token"] = 1;
  d["rng"] = "mt19937_64+fisher_yates+lemire";
  description_ = d.dump(2) + "\n";

  bool mock = dynamic_cast<const MockSequences*>(source_.get()) != nullptr;
  if (config_.use_cache && (!mock || !config_.cache_dir.empty())) {
    std::filesystem::path id(source_->id());
    std::filesystem::path dir = config_.cache_dir.empty() ? id.parent_path()
                                                          : std::filesystem::path(config_.cache_dir);
    std::string name = mock ? std::string("mock") : id.filename().string();
    cache_stem_ = (dir / (name + "." + description_hash(description_))).string();
    CachedIndices c;
    const int64_t samples = (num_epochs_ * tokens_per_epoch_ - 1) / config_.seq_length;
    if (load_cached_indices(cache_stem_, description_, c) &&
        static_cast<int64_t>(c.doc.size()) == num_epochs_ * (range_.second - range_.first) &&
        static_cast<int64_t>(c.sample.size()) == 2 * (samples + 1) &&
        static_cast<int64_t>(c.shuffle.size()) == samples) {
      document_index_ = IndexArray(c.doc);
      sample_index_ = IndexArray(c.sample);
      shuffle_index_ = IndexArray(c.shuffle);
      loaded_from_cache_ = true;
      LF_DEBUG("loaded ", config_.split_name, " indices from ", cache_stem_, ".*");
      return;
    }
    if (!dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
    }
  }
  CachedIndices built;
  build(built.doc, built.sample, built.shuffle);
  if (!cache_stem_.empty() && !save_cached_indices(cache_stem_, description_, built)) cache_stem_.clear();
  document_index_ = IndexArray(built.doc);
  sample_index_ = IndexArray(built.sample);
  shuffle_index_ = IndexArray(built.shuffle);
}

void GptDataset::build(std::vector<int64_t>& document_index, std::vector<int64_t>& sample_index,
                       std::vector<int64_t>& shuffle_index) const {
  const int64_t n = range_.second - range_.first, L = config_.seq_length;
  std::mt19937_64 rng(config_.seed);

  // Document index: the split's documents once per epoch; shuffled as one block, or as
  // (all but the last epoch) then (the last epoch).
  document_index.resize(static_cast<size_t>(num_epochs_ * n));
  for (int64_t e = 0; e < num_epochs_; ++e)
    std::iota(document_index.begin() + e * n, document_index.begin() + (e + 1) * n, range_.first);
  size_t split_at = separate_final_epoch_ ? static_cast<size_t>((num_epochs_ - 1) * n)
                                          : document_index.size();
  fisher_yates(document_index, 0, split_at, rng);
  fisher_yates(document_index, split_at, document_index.size(), rng);

  // Sample index: walk the document index taking seq_length+1 tokens per sample; consecutive
  // samples share one token (the last label of s is the first input of s+1).
  const int64_t num_samples = (num_epochs_ * tokens_per_epoch_ - 1) / L;
  sample_index.assign(static_cast<size_t>(2 * (num_samples + 1)), 0);
  const int64_t last = static_cast<int64_t>(document_index.size()) - 1;
  int64_t doc_pos = 0, doc_offset = 0;
  for (int64_t s = 1; s <= num_samples; ++s) {
    int64_t remaining = L + 1;
    while (remaining != 0) {
      int64_t doc_len = source_->sequence_length(document_index[doc_pos]) - doc_offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        doc_offset += remaining + doc_len - 1;  // back up one: the extra token is shared
        remaining = 0;
      } else {
        LF_CHECK(doc_pos < last, "internal: sample index ran past the document index at sample ",
                 s, " of ", num_samples);
        ++doc_pos;
        doc_offset = 0;
      }
    }
    sample_index[2 * s] = doc_pos;
    sample_index[2 * s + 1] = doc_offset;
  }

  // Shuffle index, with the same two-block rule as the document index.
  shuffle_index.resize(static_cast<size_t>(num_samples));
  std::iota(shuffle_index.begin(), shuffle_index.end(), int64_t{0});
  size_t first_block = shuffle_index.size();
  if (separate_final_epoch_)
    first_block = static_cast<size_t>(((num_epochs_ - 1) * tokens_per_epoch_ - 1) / L);
  fisher_yates(shuffle_index, 0, first_block, rng);
  fisher_yates(shuffle_index, first_block, shuffle_index.size(), rng);
}

IndexArray::IndexArray(const std::vector<int64_t>& values) {
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  wide_ = !values.empty() && (*lo < std::numeric_limits<int32_t>::min() || *hi > std::numeric_limits<int32_t>::max());
  if (wide_)
    w64_ = values;
  else
    w32_.assign(values.begin(), values.end());
}

std::vector<int64_t> IndexArray::to_vector() const {
  return wide_ ? w64_ : std::vector<int64_t>(w32_.begin(), w32_.end());
}

void GptDataset::get(int64_t i, int64_t* out) const {
  LF_CHECK(i >= 0 && i < size(), source_->id(), " (", config_.split_name, "): sample ", i,
           " out of range [0, ", size(), ")");
  int64_t s = shuffle_index_[static_cast<size_t>(i)];
  int64_t d0 = sample_index_[2 * s], o0 = sample_index_[2 * s + 1];
  int64_t d1 = sample_index_[2 * s + 2], o1 = sample_index_[2 * s + 3];
  int64_t written = 0;
  if (d0 == d1) {
    source_->read(document_index_[d0], o0, o1 - o0 + 1, out);
    written = o1 - o0 + 1;
  } else {
    int64_t first = source_->sequence_length(document_index_[d0]) - o0;
    source_->read(document_index_[d0], o0, first, out);
    written = first;
    for (int64_t d = d0 + 1; d < d1; ++d) {
      int64_t len = source_->sequence_length(document_index_[d]);
      source_->read(document_index_[d], 0, len, out + written);
      written += len;
    }
    source_->read(document_index_[d1], 0, o1 + 1, out + written);
    written += o1 + 1;
  }
  LF_CHECK(written == config_.seq_length + 1, "internal: sample ", i, " assembled ", written,
           " tokens, expected ", config_.seq_length + 1);
}

}  // namespace lf::data

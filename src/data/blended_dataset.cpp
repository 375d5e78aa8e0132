// Weighted blending of sample datasets and the --data-path/--split/--mock-data builder.
#include "loongforge/data/blended_dataset.h"

#include <cmath>
#include <numeric>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/data/indexed_dataset.h"

namespace lf::data {

void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int32_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index) {
  LF_CHECK(!weights.empty(), "a blend needs at least one dataset");
  double total = 0;
  for (double w : weights) {
    LF_CHECK(w >= 0 && std::isfinite(w), "blend weight ", w, " is not a non-negative number");
    total += w;
  }
  LF_CHECK(total > 0, "blend weights are all zero");
  std::vector<double> w(weights.size());
  for (size_t d = 0; d < w.size(); ++d) w[d] = weights[d] / total;
  std::vector<int64_t> count(w.size(), 0);
  dataset_index.resize(static_cast<size_t>(size));
  dataset_sample_index.resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    size_t best = 0;
    double best_err = -INFINITY;
    for (size_t d = 0; d < w.size(); ++d) {
      double err = w[d] * static_cast<double>(i + 1) - static_cast<double>(count[d]);
      if (err > best_err) best_err = err, best = d;
    }
    dataset_index[static_cast<size_t>(i)] = static_cast<int32_t>(best);
    dataset_sample_index[static_cast<size_t>(i)] = count[best]++;
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleDataset>> datasets,
                               std::vector<double> weights, int64_t size)
    : datasets_(std::move(datasets)), weights_(std::move(weights)) {
  LF_CHECK(!datasets_.empty() && datasets_.size() == weights_.size(), "a blend of ",
           datasets_.size(), " datasets got ", weights_.size(), " weights");
  for (size_t d = 0; d < datasets_.size(); ++d)
    LF_CHECK(datasets_[d] && datasets_[d]->sample_length() == datasets_[0]->sample_length(),
             "blend: dataset ", d, " has samples of ",
             datasets_[d] ? datasets_[d]->sample_length() : -1, " tokens, dataset 0 of ",
             datasets_[0]->sample_length());
  build_blending_indices(weights_, size, dataset_index_, dataset_sample_index_);
  std::vector<int64_t> used(datasets_.size(), 0);
  for (size_t i = 0; i < dataset_index_.size(); ++i) ++used[dataset_index_[i]];
  for (size_t d = 0; d < datasets_.size(); ++d)
    LF_CHECK(used[d] <= datasets_[d]->size(), "blend: dataset ", d, " has ", datasets_[d]->size(),
             " samples but the blend of ", size, " draws ", used[d], " from it",
             lf::hint("build each dataset with at least ceil(1.005 * weight * size) samples"));
}

void BlendedDataset::get(int64_t i, int64_t* out) const {
  LF_CHECK(i >= 0 && i < size(), "blend: sample ", i, " out of range [0, ", size(), ")");
  datasets_[dataset_index_[i]]->get(dataset_sample_index_[i], out);
}

std::vector<WeightedPrefix> parse_data_path(const std::vector<std::string>& words) {
  LF_CHECK(!words.empty(), "--data-path is empty", lf::hint("give a prefix or weight/prefix pairs"));
  auto number = [](const std::string& s, double& v) {
    try {
      size_t used = 0;
      v = std::stod(s, &used);
      return used == s.size();
    } catch (const std::exception&) {
      return false;
    }
  };
  double v = 0;
  if (!number(words[0], v)) {
    std::vector<WeightedPrefix> out;
    for (const auto& w : words) {
      LF_CHECK(!number(w, v), "--data-path mixes prefixes and weights at \"", w, "\"",
               lf::hint("either list prefixes only, or weight prefix pairs: 0.3 A 0.7 B"));
      out.push_back({-1.0, w});
    }
    return out;
  }
  LF_CHECK(words.size() % 2 == 0, "--data-path has ", words.size(),
           " words; weighted form needs pairs", lf::hint("0.3 A 0.7 B"));
  std::vector<WeightedPrefix> out;
  for (size_t i = 0; i < words.size(); i += 2) {
    LF_CHECK(number(words[i], v) && v >= 0, "--data-path: \"", words[i],
             "\" should be a non-negative weight (pair ", i / 2, ")");
    LF_CHECK(!number(words[i + 1], v), "--data-path: \"", words[i + 1],
             "\" should be a prefix after weight ", words[i]);
    out.push_back({std::stod(words[i]), words[i + 1]});
  }
  return out;
}

GptSplits build_gpt_datasets(const GptDataOptions& o) {
  static const char* kNames[3] = {"train", "valid", "test"};
  std::vector<WeightedPrefix> paths;
  std::vector<std::shared_ptr<const SequenceSource>> sources;
  if (o.mock) {
    sources.push_back(std::make_shared<MockSequences>(o.mock_sequences, o.mock_max_length,
                                                      o.mock_vocab_size, o.mock_eod, o.seed));
    paths.push_back({1.0, "mock"});
  } else {
    paths = parse_data_path(o.data_path);
    for (const auto& p : paths) {
      auto ds = std::make_shared<IndexedDataset>(p.prefix);
      if (o.vocab_size >= 0) ds->validate_tokens(o.vocab_size);
      sources.push_back(std::move(ds));
    }
  }
  GptSplits out;
  for (int s = 0; s < 3; ++s) {
    if (o.num_samples[s] <= 0) continue;
    std::vector<size_t> members;
    std::vector<DocRange> ranges;
    std::vector<double> weights;
    for (size_t d = 0; d < sources.size(); ++d) {
      auto range = split_ranges(o.split, sources[d]->num_sequences())[s];
      if (!range) continue;
      double w = paths[d].weight;
      if (w < 0) {  // unweighted list: proportional to the split's tokens
        w = 0;
        for (int64_t k = range->first; k < range->second; ++k) w += sources[d]->sequence_length(k);
      }
      if (w <= 0) continue;
      members.push_back(d);
      ranges.push_back(*range);
      weights.push_back(w);
    }
    if (members.empty()) continue;
    double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    std::vector<std::shared_ptr<const SampleDataset>> parts;
    for (size_t m = 0; m < members.size(); ++m) {
      GptDatasetConfig c;
      c.seq_length = o.seq_length;
      c.seed = o.seed;
      c.split_name = kNames[s];
      c.cache_dir = o.cache_dir;
      c.num_samples = members.size() == 1
                          ? o.num_samples[s]
                          : static_cast<int64_t>(std::ceil(1.005 * weights[m] / total *
                                                           static_cast<double>(o.num_samples[s])));
      parts.push_back(std::make_shared<GptDataset>(sources[members[m]], ranges[m], c));
    }
    if (parts.size() == 1)
      out.datasets[s] = parts[0];
    else
      out.datasets[s] = std::make_shared<BlendedDataset>(parts, weights, o.num_samples[s]);
    LF_INFO(kNames[s], " data: ", out.datasets[s]->size(), " samples of ",
            out.datasets[s]->sample_length(), " tokens from ", parts.size(), " dataset(s)");
  }
  return out;
}

}  // namespace lf::data

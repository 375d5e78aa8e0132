// loongforge-data inspect: a readable summary of an indexed dataset (LeRobot datasets: lerobot.cpp).
#include <algorithm>
#include <cstdio>
#include <vector>

#include "commands.h"
#include "loongforge/core/error.h"
#include "loongforge/data/indexed_dataset.h"
#include "loongforge/data/lerobot_dataset.h"
#include "loongforge/data/tokenizer.h"

namespace lf::data::tools {

int run_inspect(const InspectOptions& o) {
  if (lf::data::LeRobotDataset::is_dataset(o.prefix)) {
    LF_CHECK(o.tokenizer_type.empty() && o.tokenizer_model.empty() && o.vocab_size < 0 && o.sample == 0 &&
                 o.max_tokens == 64,
             o.prefix, " is a LeRobot dataset: --tokenizer-type, --tokenizer-model, --vocab-size, --sample and "
             "--max-tokens apply to indexed token datasets", lf::hint("drop them (--dump-episode N OUT writes an episode)"));
    return run_inspect_lerobot(o);
  }
  LF_CHECK(o.dump_episode.empty(), "--dump-episode applies to LeRobot datasets; ", o.prefix,
           " has no meta/info.json", lf::hint("give the LeRobot dataset's root directory"));
  IndexedDataset ds(o.prefix);
  std::unique_ptr<Tokenizer> tok;
  if (!o.tokenizer_type.empty()) tok = make_tokenizer(o.tokenizer_type, o.tokenizer_model);
  int64_t vocab = o.vocab_size >= 0 ? o.vocab_size : tok ? tok->vocab_size() : -1;

  std::printf("dataset: %s.{idx,bin}\n", o.prefix.c_str());
  std::printf("dtype: %s (code %d)\n", std::string(dtype_name(ds.dtype())).c_str(),
              static_cast<int>(ds.dtype()));
  std::printf("sequences: %lld\ndocuments: %lld\ntokens: %lld\n",
              static_cast<long long>(ds.num_sequences()), static_cast<long long>(ds.num_documents()),
              static_cast<long long>(ds.total_tokens()));
  if (ds.num_sequences() == 0) return 0;

  // Histogram over power-of-two length buckets [2^k, 2^(k+1)); bucket 0 also holds length 0.
  std::vector<int64_t> buckets(40, 0);
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t i = 0; i < ds.num_sequences(); ++i) {
    int64_t l = ds.sequence_length(i);
    lo = std::min(lo, l), hi = std::max(hi, l);
    int b = 0;
    while ((int64_t{2} << b) <= l) ++b;
    ++buckets[static_cast<size_t>(b)];
  }
  std::printf("sequence length: min %lld, mean %.1f, max %lld\n", static_cast<long long>(lo),
              static_cast<double>(ds.total_tokens()) / static_cast<double>(ds.num_sequences()),
              static_cast<long long>(hi));
  int64_t peak = *std::max_element(buckets.begin(), buckets.end());
  std::printf("length histogram:\n");
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (!buckets[b]) continue;
    int bar = static_cast<int>(40 * buckets[b] / peak);
    std::printf("  [%7lld, %7lld) %10lld %s\n", b == 0 ? 0LL : (1LL << b), 2LL << b,
                static_cast<long long>(buckets[b]), std::string(static_cast<size_t>(std::max(bar, 1)), '#').c_str());
  }
  if (vocab >= 0) {
    ds.validate_tokens(vocab);
    std::printf("token ids: all below %lld\n", static_cast<long long>(vocab));
  }
  LF_CHECK(o.sample >= 0 && o.sample < ds.num_sequences(), "--sample ", o.sample,
           " is outside [0, ", ds.num_sequences(), ")");
  int64_t n = std::min(ds.sequence_length(o.sample), o.max_tokens);
  auto ids = ds.get(o.sample, 0, n);
  std::printf("sequence %lld (first %lld of %lld tokens):", static_cast<long long>(o.sample),
              static_cast<long long>(n), static_cast<long long>(ds.sequence_length(o.sample)));
  for (int64_t id : ids) std::printf(" %lld", static_cast<long long>(id));
  std::printf("\n");
  if (tok) {
    std::vector<int32_t> ids32(ids.begin(), ids.end());
    std::printf("decoded: %s\n", tok->decode(ids32).c_str());
  }
  return 0;
}

}  // namespace lf::data::tools

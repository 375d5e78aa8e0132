// GPT sampling tests: split arithmetic, determinism per seed, the documented RNG, each token of
// an epoch used exactly once, samples equal to the shuffled token stream, multi-epoch rules and
// the on-disk index cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <numeric>
#include <random>

#include "loongforge/core/error.h"
#include "loongforge/data/gpt_dataset.h"
#include "loongforge/data/indexed_dataset.h"
#include "multiprocess.h"

namespace {

using lf::data::GptDataset;
using lf::data::GptDatasetConfig;

// Sequence i of length lengths[i] holds unique tokens: base_i + j, base_i = 1000 * i.
class UniqueTokens final : public lf::data::SequenceSource {
 public:
  explicit UniqueTokens(std::vector<int64_t> lengths) : lengths_(std::move(lengths)) {}
  int64_t num_sequences() const override { return static_cast<int64_t>(lengths_.size()); }
  int64_t sequence_length(int64_t i) const override { return lengths_[static_cast<size_t>(i)]; }
  void read(int64_t i, int64_t offset, int64_t count, int64_t* out) const override {
    ASSERT_LE(offset + count, lengths_[static_cast<size_t>(i)]);
    for (int64_t j = 0; j < count; ++j) out[j] = 1000 * i + offset + j;
  }
  std::string id() const override { return "unique"; }

 private:
  std::vector<int64_t> lengths_;
};

std::vector<int64_t> lengths_for(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> l(static_cast<size_t>(n));
  for (auto& x : l) x = 1 + static_cast<int64_t>(rng() % 40);
  return l;
}

GptDatasetConfig config(int64_t seq, int64_t samples, uint64_t seed) {
  GptDatasetConfig c;
  c.seq_length = seq;
  c.num_samples = samples;
  c.seed = seed;
  c.use_cache = false;
  return c;
}

TEST(GptSplit, FollowsMegatronRounding) {
  auto r = lf::data::split_ranges("969,30,1", 1000);
  ASSERT_TRUE(r[0] && r[1] && r[2]);
  EXPECT_EQ(*r[0], (lf::data::DocRange{0, 969}));
  EXPECT_EQ(*r[1], (lf::data::DocRange{969, 999}));
  EXPECT_EQ(*r[2], (lf::data::DocRange{999, 1000}));
  auto q = lf::data::split_ranges("98,2", 10);  // 9.8 -> 10, 0.2 -> 0: valid empty
  EXPECT_EQ(*q[0], (lf::data::DocRange{0, 10}));
  EXPECT_FALSE(q[1]);
  EXPECT_FALSE(q[2]);
  // 3.33 -> 3 each, bounds 0,3,6,9; the shortfall of 1 shifts every bound after 0.
  auto t = lf::data::split_ranges("1,1,1", 10);
  EXPECT_EQ(*t[0], (lf::data::DocRange{0, 4}));
  EXPECT_EQ(*t[1], (lf::data::DocRange{4, 7}));
  EXPECT_EQ(*t[2], (lf::data::DocRange{7, 10}));
  EXPECT_THROW(lf::data::split_ranges("9a,1", 10), lf::Error);
  EXPECT_THROW(lf::data::split_ranges("0,0,0", 10), lf::Error);
}

// Reimplements the documented algorithm: mt19937_64(seed), Fisher-Yates from the end, Lemire's
// bounded draw with rejection.
std::vector<int64_t> reference_shuffle(std::vector<int64_t> v, std::mt19937_64& rng) {
  for (size_t n = v.size(); n > 1; --n) {
    uint64_t x = rng();
    unsigned __int128 m = static_cast<unsigned __int128>(x) * n;
    uint64_t lo = static_cast<uint64_t>(m);
    if (lo < n) {
      uint64_t t = (0 - static_cast<uint64_t>(n)) % n;
      while (lo < t) m = static_cast<unsigned __int128>(rng()) * n, lo = static_cast<uint64_t>(m);
    }
    std::swap(v[n - 1], v[static_cast<size_t>(m >> 64)]);
  }
  return v;
}

TEST(GptDataset, IndicesAreDeterministicAndUseTheDocumentedRng) {
  auto src = std::make_shared<UniqueTokens>(lengths_for(50, 1));
  GptDataset a(src, {10, 50}, config(16, 20, 77)), b(src, {10, 50}, config(16, 20, 77)),
      c(src, {10, 50}, config(16, 20, 78));
  EXPECT_EQ(a.document_index(), b.document_index());
  EXPECT_EQ(a.sample_index(), b.sample_index());
  EXPECT_EQ(a.shuffle_index(), b.shuffle_index());
  EXPECT_NE(a.document_index(), c.document_index());
  EXPECT_NE(a.shuffle_index(), c.shuffle_index());
  ASSERT_EQ(a.num_epochs(), 1);
  std::mt19937_64 rng(77);
  std::vector<int64_t> docs(40);
  std::iota(docs.begin(), docs.end(), 10);
  EXPECT_EQ(a.document_index().to_vector(), reference_shuffle(docs, rng));
  std::vector<int64_t> samples(static_cast<size_t>(a.size()));
  std::iota(samples.begin(), samples.end(), 0);
  EXPECT_EQ(a.shuffle_index().to_vector(), reference_shuffle(samples, rng)) << "shuffle continues the stream";
}

TEST(GptDataset, EveryTokenOfAnEpochIsUsedOnceAndSamplesFollowTheStream) {
  auto lengths = lengths_for(200, 2);
  auto src = std::make_shared<UniqueTokens>(lengths);
  const int64_t L = 32;
  int64_t tokens = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  GptDataset ds(src, {0, 200}, config(L, 1, 5));
  ASSERT_EQ(ds.num_epochs(), 1);
  ASSERT_EQ(ds.size(), (tokens - 1) / L);
  // The token stream of the epoch in document-index order.
  std::vector<int64_t> stream;
  for (int64_t d : ds.document_index().to_vector())
    for (int64_t j = 0; j < lengths[static_cast<size_t>(d)]; ++j) stream.push_back(1000 * d + j);
  ASSERT_EQ(static_cast<int64_t>(stream.size()), tokens);
  std::map<int64_t, int> uses;
  for (int64_t i = 0; i < ds.size(); ++i) {
    auto s = ds.get(i);
    ASSERT_EQ(static_cast<int64_t>(s.size()), L + 1);
    int64_t k = ds.shuffle_index()[static_cast<size_t>(i)];
    std::vector<int64_t> want(stream.begin() + k * L, stream.begin() + k * L + L + 1);
    ASSERT_EQ(s, want) << "sample " << i << " (unshuffled " << k << ")";
    for (int64_t j = 0; j < L; ++j) ++uses[s[static_cast<size_t>(j)]];  // inputs only
  }
  EXPECT_EQ(static_cast<int64_t>(uses.size()), ds.size() * L);
  for (const auto& [tok, n] : uses) ASSERT_EQ(n, 1) << "token " << tok;
  // What is left unused is the tail of the stream, shorter than one sample.
  EXPECT_LT(tokens - ds.size() * L, L + 1);
}

TEST(GptDataset, MultipleEpochsRepeatEveryDocumentAndSeparateASmallLastEpoch) {
  auto lengths = lengths_for(30, 3);
  auto src = std::make_shared<UniqueTokens>(lengths);
  int64_t tokens = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  const int64_t L = 10, per_epoch = (tokens - 1) / L;
  // 2 full epochs plus 10% of a third: 3 epochs, the last shuffled on its own.
  GptDataset ds(src, {0, 30}, config(L, 2 * per_epoch + per_epoch / 10, 9));
  ASSERT_EQ(ds.num_epochs(), 3);
  const auto di = ds.document_index().to_vector();
  ASSERT_EQ(di.size(), 90u);
  std::vector<int> count(30, 0);
  for (int64_t d : di) ++count[static_cast<size_t>(d)];
  for (int c : count) EXPECT_EQ(c, 3);
  // Separate final epoch: the last 30 entries are a permutation of the documents.
  std::vector<int64_t> last(di.end() - 30, di.end());
  std::sort(last.begin(), last.end());
  for (int64_t d = 0; d < 30; ++d) EXPECT_EQ(last[static_cast<size_t>(d)], d);
  // ... and the shuffle index keeps the samples of the first two epochs in front.
  int64_t before_last = (2 * tokens - 1) / L;
  for (int64_t i = 0; i < before_last; ++i) ASSERT_LT(ds.shuffle_index()[static_cast<size_t>(i)], before_last);
  EXPECT_EQ(ds.size(), (3 * tokens - 1) / L);
}

TEST(GptDataset, IndicesAreCachedBesideTheDataAndReloaded) {
  std::string dir = lf::testing::make_temp_dir("gpt_cache");
  {
    lf::data::IndexedDatasetBuilder b(dir + "/corpus", lf::data::TokenDType::u16, 1000);
    for (int d = 0; d < 50; ++d) {
      std::vector<int32_t> t(static_cast<size_t>(5 + d % 7), d);
      b.add_sequence(t);
      b.end_document();
    }
    b.finalize();
  }
  auto src = std::make_shared<lf::data::IndexedDataset>(dir + "/corpus");
  GptDatasetConfig c = config(8, 30, 3);
  c.use_cache = true;
  GptDataset first(src, {0, 45}, c);
  EXPECT_FALSE(first.loaded_from_cache());
  ASSERT_FALSE(first.cache_stem().empty());
  EXPECT_EQ(std::filesystem::path(first.cache_stem()).parent_path(), std::filesystem::path(dir));
  for (const char* ext : {".doc_index.bin", ".sample_index.bin", ".shuffle_index.bin", ".description.json"})
    EXPECT_TRUE(std::filesystem::exists(first.cache_stem() + ext)) << ext;
  GptDataset second(src, {0, 45}, c);
  EXPECT_TRUE(second.loaded_from_cache());
  EXPECT_EQ(second.document_index(), first.document_index());
  EXPECT_EQ(second.sample_index(), first.sample_index());
  EXPECT_EQ(second.shuffle_index(), first.shuffle_index());
  EXPECT_EQ(second.get(7), first.get(7));
  c.seed = 4;  // another parameter: another cache entry
  GptDataset other(src, {0, 45}, c);
  EXPECT_FALSE(other.loaded_from_cache());
  EXPECT_NE(other.cache_stem(), first.cache_stem());
  // A damaged cache file is rebuilt, not trusted.
  std::filesystem::resize_file(first.cache_stem() + ".shuffle_index.bin", 20);
  c.seed = 3;
  GptDataset again(src, {0, 45}, c);
  EXPECT_FALSE(again.loaded_from_cache());
  EXPECT_EQ(again.shuffle_index(), first.shuffle_index());
}

TEST(GptDataset, MockDataIsDeterministicAndInVocabulary) {
  auto src = std::make_shared<lf::data::MockSequences>(1000, 64, 50, 0, 11);
  GptDataset a(src, {0, 1000}, config(16, 100, 1)), b(src, {0, 1000}, config(16, 100, 1));
  for (int64_t i : {0, 5, 99}) {
    auto s = a.get(i);
    EXPECT_EQ(s, b.get(i));
    for (int64_t t : s) EXPECT_TRUE(t >= 0 && t < 50) << t;
  }
  EXPECT_EQ(src->get(3).back(), 0) << "each mock sequence ends with eod";
}

TEST(GptDataset, EmptyOrTinySplitsAreErrors) {
  auto src = std::make_shared<UniqueTokens>(std::vector<int64_t>{1, 1, 1});
  EXPECT_THROW(GptDataset(src, {0, 1}, config(4, 1, 1)), lf::Error);  // one token
  EXPECT_THROW(GptDataset(src, {2, 2}, config(4, 1, 1)), lf::Error);  // empty range
  EXPECT_THROW(GptDataset(src, {0, 4}, config(4, 1, 1)), lf::Error);  // past the end
}

}  // namespace

// Index arrays are held in 32 bits when every value fits (half the memory of int64, as Megatron
// does), in 64 bits otherwise; either way they read back the same values.
TEST(GptDataset, IndexArraysAreInt32WhenTheValuesFit) {
  const std::vector<int64_t> small{0, 5, -3, 2147483647, -2147483648LL};
  lf::data::IndexArray a(small);
  EXPECT_FALSE(a.wide());
  EXPECT_EQ(a.bytes(), 4 * small.size());
  EXPECT_EQ(a.to_vector(), small);
  const std::vector<int64_t> big{0, 2147483648LL, 7};
  lf::data::IndexArray b(big);
  EXPECT_TRUE(b.wide());
  EXPECT_EQ(b.bytes(), 8 * big.size());
  for (size_t i = 0; i < big.size(); ++i) EXPECT_EQ(b[i], big[i]);
  EXPECT_TRUE(lf::data::IndexArray(std::vector<int64_t>{-2147483649LL}).wide());
  // A dataset's indices: all in 32 bits here.
  auto lengths = lengths_for(50, 4);
  GptDataset ds(std::make_shared<UniqueTokens>(lengths), {0, 50}, config(8, 1, 3));
  EXPECT_FALSE(ds.sample_index().wide());
  EXPECT_FALSE(ds.shuffle_index().wide());
  EXPECT_EQ(ds.shuffle_index().bytes(), 4 * static_cast<size_t>(ds.size()));
}

// Blending, the --data-path builder, the pretraining sampler and the background loader.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "loongforge/core/error.h"
#include "loongforge/data/blended_dataset.h"
#include "loongforge/data/indexed_dataset.h"
#include "loongforge/data/loader.h"
#include "loongforge/data/sampler.h"
#include "multiprocess.h"

namespace {

using lf::data::PretrainingSampler;

// Every token of dataset k is k*10000 + its position, so a sample tells where it came from.
void make_dataset(const std::string& prefix, int k, int docs) {
  lf::data::IndexedDatasetBuilder b(prefix, lf::data::TokenDType::i32);
  int32_t next = k * 10000;
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> t(static_cast<size_t>(3 + d % 11));
    for (auto& x : t) x = next++;
    b.add_sequence(t);
    b.end_document();
  }
  b.finalize();
}

TEST(Blend, GreedyIndicesFollowWeightsWithinOnePercent) {
  std::vector<int32_t> di;
  std::vector<int64_t> dsi;
  lf::data::build_blending_indices({0.3, 0.7}, 10000, di, dsi);
  int64_t c0 = 0, c1 = 0;
  for (size_t i = 0; i < di.size(); ++i) {
    (di[i] == 0 ? c0 : c1)++;
    // Furthest-behind rule: every prefix is within one sample of its target.
    ASSERT_LE(std::abs(static_cast<double>(di[i] == 0 ? c0 : c1) -
                       (di[i] == 0 ? 0.3 : 0.7) * static_cast<double>(i + 1)), 1.0) << i;
    ASSERT_EQ(dsi[i], (di[i] == 0 ? c0 : c1) - 1);
  }
  EXPECT_EQ(c0, 3000);
  EXPECT_EQ(c1, 7000);
  EXPECT_EQ(di[0], 1) << "the largest weight goes first";
  // By hand: errors (0.3(i+1) - c0, 0.7(i+1) - c1); i=4 ties at 0.5 and takes dataset 0.
  EXPECT_EQ((std::vector<int32_t>(di.begin(), di.begin() + 10)),
            (std::vector<int32_t>{1, 0, 1, 1, 0, 1, 1, 1, 0, 1}));
  lf::data::build_blending_indices({1, 2, 7}, 10000, di, dsi);  // unnormalised weights
  std::vector<int64_t> c(3, 0);
  for (int32_t d : di) ++c[static_cast<size_t>(d)];
  EXPECT_EQ(c, (std::vector<int64_t>{1000, 2000, 7000}));
}

TEST(Blend, DataPathFormsAndErrors) {
  auto p = lf::data::parse_data_path({"0.3", "A", "0.7", "B"});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].prefix, "B");
  EXPECT_DOUBLE_EQ(p[0].weight, 0.3);
  auto q = lf::data::parse_data_path({"A", "B"});
  EXPECT_LT(q[0].weight, 0);
  EXPECT_THROW(lf::data::parse_data_path({"0.3", "A", "0.7"}), lf::Error);
  EXPECT_THROW(lf::data::parse_data_path({"A", "0.5"}), lf::Error);
  EXPECT_THROW(lf::data::parse_data_path({}), lf::Error);
}

TEST(Blend, BuilderBlendsSplitsAndSamplesComeFromTheirDataset) {
  std::string dir = lf::testing::make_temp_dir("blend");
  make_dataset(dir + "/a", 1, 400);
  make_dataset(dir + "/b", 2, 300);
  lf::data::GptDataOptions o;
  o.data_path = {"0.3", dir + "/a", "0.7", dir + "/b"};
  o.split = "90,10,0";
  o.seq_length = 16;
  o.seed = 7;
  o.num_samples = {10000, 200, 50};
  o.vocab_size = 40000;
  auto splits = lf::data::build_gpt_datasets(o);
  ASSERT_TRUE(splits.datasets[0] && splits.datasets[1]);
  EXPECT_FALSE(splits.datasets[2]) << "test split has no documents";
  const auto& train = *splits.datasets[0];
  EXPECT_EQ(train.size(), 10000);
  EXPECT_EQ(train.sample_length(), 17);
  int64_t from_a = 0;
  for (int64_t i = 0; i < train.size(); ++i) {
    auto s = train.get(i);
    int64_t k = s[0] / 10000;
    for (int64_t t : s) ASSERT_EQ(t / 10000, k) << "a sample mixes datasets";
    if (k == 1) ++from_a;
  }
  EXPECT_NEAR(static_cast<double>(from_a) / 10000.0, 0.3, 0.01);
  EXPECT_EQ(from_a, 3000);
  // Validation samples come only from each dataset's last 10% of documents (a: docs 360..399).
  auto v = splits.datasets[1]->get(0);
  int64_t k = v[0] / 10000;
  int64_t first_valid_token = k == 1 ? 10000 + 0 : 20000;
  for (int d = 0; d < (k == 1 ? 360 : 270); ++d) first_valid_token += 3 + d % 11;
  EXPECT_GE(v[0], first_valid_token);
  // A vocabulary too small for the data is an error naming the file.
  o.vocab_size = 15000;
  try {
    lf::data::build_gpt_datasets(o);
    FAIL();
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/b.bin: token id"), std::string::npos) << e.what();
  }
}

TEST(Blend, MockDataNeedsNoFiles) {
  lf::data::GptDataOptions o;
  o.mock = true;
  o.seq_length = 32;
  o.num_samples = {64, 8, 8};
  o.mock_vocab_size = 1000;
  o.mock_sequences = 2000;
  auto s = lf::data::build_gpt_datasets(o);
  ASSERT_TRUE(s.datasets[0] && s.datasets[1] && s.datasets[2]);
  EXPECT_GE(s.datasets[0]->size(), 64);
  auto again = lf::data::build_gpt_datasets(o);
  EXPECT_EQ(s.datasets[0]->get(5), again.datasets[0]->get(5));
}

TEST(PretrainingSampler, RanksGetTheirSliceOfEachMicroBatchStep) {
  // mbs 2, dp 3: each step takes 6 consecutive samples; rank r gets [2r, 2r+2).
  std::vector<PretrainingSampler> ranks;
  for (int r = 0; r < 3; ++r) ranks.emplace_back(40, 2, r, 3);
  EXPECT_EQ(*ranks[0].next_micro_batch(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(*ranks[1].next_micro_batch(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*ranks[2].next_micro_batch(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(*ranks[2].next_micro_batch(), (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(ranks[2].state().consumed_samples, 12);
  // A global batch of 12 = 2 micro-batches per rank; all ranks together cover it once.
  std::set<int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    PretrainingSampler s(40, 2, r, 3, {12});
    auto gb = s.next_global_batch(12);
    ASSERT_EQ(gb.size(), 2u);
    for (auto& mb : gb)
      for (int64_t i : mb) EXPECT_TRUE(seen.insert(i).second) << i;
    EXPECT_EQ(s.state().consumed_samples, 24);
    EXPECT_TRUE(s.next_global_batch(12).size() == 12 / 6) << "24..35 fits";
    EXPECT_TRUE(s.next_global_batch(12).empty()) << "36..47 does not fit in 40";
  }
  EXPECT_EQ(*seen.begin(), 12);
  EXPECT_EQ(*seen.rbegin(), 23);
  EXPECT_EQ(seen.size(), 12u);
  PretrainingSampler s(40, 2, 0, 3);
  EXPECT_THROW(s.next_global_batch(10), lf::Error);
  EXPECT_THROW(PretrainingSampler(40, 2, 3, 3), lf::Error);
  EXPECT_THROW(s.restore({41}), lf::Error);
}

TEST(PretrainingSampler, DropLastAndPartialFinalStep) {
  PretrainingSampler keep(10, 2, 1, 2, {}, /*drop_last=*/false), drop(10, 2, 1, 2);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(keep.next_micro_batch()->size(), 2u);
    EXPECT_EQ(drop.next_micro_batch()->size(), 2u);
  }
  EXPECT_FALSE(drop.next_micro_batch());
  EXPECT_EQ(*keep.next_micro_batch(), (std::vector<int64_t>{})) << "samples 8, 9 go to rank 0";
  EXPECT_FALSE(keep.next_micro_batch());
}

TEST(BackgroundLoader, DeliversSamplerOrderAndResumesExactly) {
  std::string dir = lf::testing::make_temp_dir("loader");
  make_dataset(dir + "/a", 1, 300);
  lf::data::GptDatasetConfig c;
  c.seq_length = 8;
  c.num_samples = 200;
  c.use_cache = false;
  auto ds = std::make_shared<lf::data::GptDataset>(std::make_shared<lf::data::IndexedDataset>(dir + "/a"),
                                                   lf::data::DocRange{0, 300}, c);
  const int64_t total = 200;
  // Uninterrupted run on rank 1 of 2, micro-batch 3.
  std::vector<lf::data::TokenBatch> all;
  {
    lf::data::BackgroundLoader loader(ds, PretrainingSampler(total, 3, 1, 2), {2});
    while (auto b = loader.next()) all.push_back(std::move(*b));
    EXPECT_EQ(loader.state().consumed_samples, 198);
  }
  ASSERT_EQ(all.size(), 33u);
  EXPECT_EQ(all[0].sample_indices, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(all[0].micro_batch_size, 3);
  EXPECT_EQ(all[0].sample_length, 9);
  for (int64_t r = 0; r < 3; ++r) {
    auto s = ds->get(all[5].sample_indices[static_cast<size_t>(r)]);
    EXPECT_TRUE(std::equal(s.begin(), s.end(), all[5].tokens.begin() + r * 9));
  }
  // Interrupted after 10 batches (the loader has prefetched more), saved and resumed.
  lf::data::SamplerState saved;
  {
    lf::data::BackgroundLoader loader(ds, PretrainingSampler(total, 3, 1, 2), {4});
    for (int k = 0; k < 10; ++k) loader.next();
    saved = loader.state();
  }
  EXPECT_EQ(saved.consumed_samples, 60);
  lf::data::BackgroundLoader resumed(ds, PretrainingSampler(total, 3, 1, 2, saved), {4});
  for (size_t k = 10; k < all.size(); ++k) {
    auto b = resumed.next();
    ASSERT_TRUE(b);
    ASSERT_EQ(b->sample_indices, all[k].sample_indices) << k;
    ASSERT_EQ(b->tokens, all[k].tokens) << k;
  }
  EXPECT_FALSE(resumed.next());
}

// A dataset whose get() fails: the loader must rethrow in next(), not crash or hang.
class FailingDataset final : public lf::data::SampleDataset {
 public:
  int64_t size() const override { return 100; }
  int64_t sample_length() const override { return 4; }
  void get(int64_t i, int64_t* out) const override {
    LF_CHECK(i < 5, "sample ", i, " is unreadable");
    for (int k = 0; k < 4; ++k) out[k] = i;
  }
  using SampleDataset::get;
};

TEST(BackgroundLoader, ErrorsInTheThreadReachTheCaller) {
  lf::data::BackgroundLoader loader(std::make_shared<FailingDataset>(), PretrainingSampler(100, 2, 0, 1));
  EXPECT_TRUE(loader.next());
  EXPECT_TRUE(loader.next());
  try {
    loader.next();  // samples 4, 5
    FAIL();
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample 5 is unreadable"), std::string::npos);
  }
}

}  // namespace

namespace {
size_t thread_count() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory();
  return n;
}
}  // namespace

// --num-workers: N threads assemble micro-batches (delivered in sampler order whatever thread
// finished first), 0 assembles them on the caller's thread; the batches are the same.
TEST(BackgroundLoader, WorkersChangeThreadsNotBatches) {
  std::string dir = lf::testing::make_temp_dir("loader-workers");
  make_dataset(dir + "/a", 1, 300);
  lf::data::GptDatasetConfig c;
  c.seq_length = 8;
  c.num_samples = 120;
  c.use_cache = false;
  auto ds = std::make_shared<lf::data::GptDataset>(std::make_shared<lf::data::IndexedDataset>(dir + "/a"),
                                                   lf::data::DocRange{0, 300}, c);
  std::vector<std::vector<int64_t>> want;
  const size_t before = thread_count();
  for (int workers : {0, 1, 3}) {
    lf::data::LoaderOptions o;
    o.workers = workers;
    o.prefetch = 2;
    lf::data::BackgroundLoader loader(ds, PretrainingSampler(120, 4, 0, 1), o);
    EXPECT_EQ(thread_count(), before + static_cast<size_t>(workers)) << workers << " workers";
    std::vector<std::vector<int64_t>> got;
    while (auto b = loader.next()) got.push_back(b->tokens);
    EXPECT_EQ(loader.state().consumed_samples, 120);
    if (want.empty()) want = got;
    EXPECT_EQ(got, want) << workers << " workers";
  }
  ASSERT_EQ(want.size(), 30u);
  EXPECT_THROW(lf::data::BackgroundLoader(ds, PretrainingSampler(120, 4, 0, 1), {2, -1}), lf::Error);
}

// The diffusion data: the latent store (written in shards, read back sample by sample, mistakes
// named), the word-table text encoder, the squares demo's clips and its scorer (every ground-truth
// clip scores right; a blank or wrong clip does not).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "loongforge/core/error.h"
#include "loongforge/data/latent_store.h"
#include "loongforge/data/squares_demo.h"
#include "loongforge/data/text_table.h"
#include "multiprocess.h"

namespace {
namespace fs = std::filesystem;
using lf::data::LatentSample;

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const lf::Error& e) {
    return e.what();
  }
  return "";
}

TEST(LatentStore, ShardsRoundTripSampleBySample) {
  const std::string dir = lf::testing::make_temp_dir("latents") + "/store";
  std::vector<LatentSample> want;
  {
    lf::data::LatentStoreWriter w(dir, "identity", "table", /*shard_bytes=*/1000);  // several shards
    for (int i = 0; i < 9; ++i) {
      LatentSample s{at::randn({3, 2, 4, 4}), at::randn({1 + i % 3, 5}), at::randn({2, 7}), "clip " + std::to_string(i)};
      w.add(s);
      want.push_back(s);
    }
    EXPECT_EQ(w.finish(), 9);
  }
  lf::data::LatentStore store(dir);
  EXPECT_EQ(store.size(), 9);
  EXPECT_EQ(store.info().latent_channels, 3);
  EXPECT_EQ(store.info().text_dim, 5);
  EXPECT_EQ(store.info().image_dim, 7);
  EXPECT_GT(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 3);  // shards + index
  for (int i = 8; i >= 0; --i) {
    auto s = store.get(i);
    EXPECT_TRUE(at::equal(s.latents, want[i].latents)) << i;
    EXPECT_TRUE(at::equal(s.text, want[i].text)) << i;
    EXPECT_TRUE(at::equal(s.image, want[i].image)) << i;
    EXPECT_EQ(s.caption, want[i].caption);
  }
  EXPECT_NE(error_of([&] { store.get(9); }).find("outside"), std::string::npos);
  // A second store in the same place is refused.
  EXPECT_NE(error_of([&] { lf::data::LatentStoreWriter(dir, "", ""); }).find("already holds"), std::string::npos);
}

TEST(LatentStore, MistakesNameTheFileAndTheSample) {
  const std::string root = lf::testing::make_temp_dir("latents-bad");
  lf::data::LatentStoreWriter w(root + "/a", "identity", "table");
  w.add({at::zeros({3, 1, 2, 2}), at::zeros({2, 4}), {}, ""});
  const auto e = error_of([&] { w.add({at::zeros({4, 1, 2, 2}), at::zeros({2, 4}), {}, ""}); });
  EXPECT_NE(e.find("sample 1 has 4 latent channels"), std::string::npos) << e;
  w.finish();
  EXPECT_NE(error_of([&] { lf::data::LatentStore(root + "/none"); }).find("no latent store"), std::string::npos);
  fs::remove(root + "/a/shard-00000.safetensors");
  EXPECT_NE(error_of([&] { lf::data::LatentStore(root + "/a"); }).find("shard-00000.safetensors"), std::string::npos);
}

TEST(TextTable, EncodesCaptionsAndNamesUnknownWords) {
  auto t = lf::data::squares_text_table(6, 3);
  const std::string path = lf::testing::make_temp_dir("table") + "/t.safetensors";
  t.write(path);
  auto r = lf::data::TextTable::read(path);
  EXPECT_EQ(r.words(), t.words());
  auto a = r.encode("A red square, moving LEFT.");
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{8, 6}));
  EXPECT_TRUE(at::equal(a, t.encode("a red square moving left")));
  EXPECT_TRUE(at::equal(a.narrow(0, 5, 3), at::zeros({3, 6})));  // padded with zero rows
  EXPECT_FALSE(at::equal(a[1], t.encode("a blue square moving left")[1]));
  const auto e = error_of([&] { r.encode("a purple square"); });
  EXPECT_NE(e.find("'purple'"), std::string::npos) << e;
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(error_of([&] { r.encode("a a a a a a a a a"); }).find("at most 8"), std::string::npos);
}

TEST(SquaresDemo, GroundTruthClipsScoreRightAndOthersDoNot) {
  const auto table = lf::data::squares_text_table(8, 1);
  lf::data::SquaresOptions o;
  for (int64_t i = 0; i < 64; ++i) {
    auto s = lf::data::squares_clip(i, 5, o, table);
    EXPECT_EQ(s.latents.sizes(), (std::vector<int64_t>{3, 4, 16, 16}));
    EXPECT_EQ(s.latents.min().item<float>(), -1.0f);
    EXPECT_EQ(s.latents[0][0][0][0].item<float>(), -0.6f);  // the border (a corner: no square reaches it)
    const auto& colour = lf::data::squares_colours()[i % 4];
    const auto& direction = lf::data::squares_directions()[(i / 4) % 4];
    EXPECT_EQ(s.caption, lf::data::squares_caption(colour, direction));
    auto score = lf::data::score_squares_clip(s.latents, colour, direction);
    EXPECT_TRUE(score.colour_ok && score.direction_ok) << i << ": " << score.colour << " " << score.direction;
    // The same clip played backwards moves the other way.
    auto back = lf::data::score_squares_clip(s.latents.flip(1), colour, direction);
    EXPECT_FALSE(back.direction_ok) << i;
    // Deterministic in (seed, index).
    EXPECT_TRUE(at::equal(s.latents, lf::data::squares_clip(i, 5, o, table).latents));
  }
  // A clip without a square scores nothing.
  auto blank = lf::data::score_squares_clip(at::full({3, 4, 16, 16}, -1.0f), "red", "left");
  EXPECT_FALSE(blank.colour_ok || blank.direction_ok);
}

}  // namespace

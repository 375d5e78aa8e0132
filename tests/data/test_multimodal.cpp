// The multimodal store: `loongforge-data preprocess --multimodal` on conversations in the formats
// users have (messages with <image> tags, LLaVA conversations, typed content entries, text only,
// two images) against transformers (tests/data/vlm_data_oracle.py: the template rendered, each
// <|image_pad|> expanded by the processor's grid, the PIL image processor's pixel_values); videos
// sampled and stored; bad media and mismatched tags named with the file and line.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../models/cached_oracle.h"
#include "loongforge/core/error.h"
#include "loongforge/data/hf_bpe_tokenizer.h"
#include "loongforge/data/multimodal.h"
#include "loongforge/media/qwen_vision_input.h"
#include "loongforge/media/video.h"

namespace {

namespace fs = std::filesystem;
using lf::testing::run_command;

std::string oracle_dir() {
  static const std::string d = lf::testing::cached_oracle(
      lf::testing::source_dir() + "/tests/data/vlm_data_oracle.py", "vlm_data", "done");
  return d;
}

#define NEED_ORACLE()                                                   \
  const std::string o = oracle_dir();                                   \
  if (o.empty()) GTEST_SKIP() << "Python oracle unavailable (.venv missing)"

std::string bin(const std::string& name) { return lf::testing::binary_dir() + "/bin/" + name; }

lf::testing::RankResult preprocess(const std::string& input, const std::string& prefix,
                                   const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {bin("loongforge-data"), "preprocess", "--multimodal", "--tokenizer-model",
                                   oracle_dir() + "/tok", "--input", input, "--output-prefix", prefix};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_command(argv, {}, std::chrono::seconds(120));
}

// A sample's media as the trainer feeds them: each medium's rows (normalised, patch order), in order.
std::pair<at::Tensor, at::Tensor> rows_of(const lf::data::MultimodalSample& s, const lf::media::QwenVisionPreprocess& p) {
  std::vector<at::Tensor> rows, grids;
  for (const auto& m : s.media) {
    std::vector<const lf::media::Image*> frames;
    for (const auto& f : m.images) frames.push_back(&f);
    auto v = lf::media::qwen_patches_of_resized(frames, p);
    rows.push_back(v.pixel_values);
    grids.push_back(at::tensor({v.grid[0], v.grid[1], v.grid[2]}, at::kLong).view({1, 3}));
  }
  if (rows.empty()) return {};
  return {at::cat(rows), at::cat(grids)};
}

TEST(MultimodalStore, TokensAndPixelsEqualTransformers) {
  NEED_ORACLE();
  const std::string d = lf::testing::make_temp_dir("mm_store");
  auto r = preprocess(o + "/conversations.jsonl", d + "/store");
  ASSERT_TRUE(r.ok()) << r.output;
  const auto want = lf::testing::read_safetensors(o + "/expected.safetensors");
  const auto cases = nlohmann::json::parse(lf::testing::read_text(o + "/cases.json"));
  lf::data::MultimodalDataset ds(d + "/store");
  ASSERT_EQ(ds.size(), cases["samples"].get<int64_t>());
  EXPECT_EQ(ds.info().image_token_id, cases["image_pad"].get<int64_t>());
  EXPECT_EQ(ds.info().vision.min_pixels, 3136);  // from the directory's preprocessor_config.json
  lf::data::HfBpeTokenizer tok(o + "/tok");
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto s = ds.read(i);
    const at::Tensor ids = at::tensor(std::vector<int64_t>(s.tokens.begin(), s.tokens.end()), at::kLong);
    const at::Tensor& want_ids = want.at("s" + std::to_string(i) + "/input_ids");
    ASSERT_EQ(ids.sizes(), want_ids.sizes()) << "sample " << i;
    EXPECT_TRUE(at::equal(ids, want_ids)) << "sample " << i;
    const auto key = "s" + std::to_string(i) + "/pixel_values";
    if (!want.count(key)) {
      EXPECT_TRUE(s.media.empty()) << "sample " << i;
      continue;
    }
    auto [rows, grids] = rows_of(s, ds.info().vision);
    EXPECT_TRUE(at::equal(grids, want.at("s" + std::to_string(i) + "/grid"))) << "sample " << i;
    ASSERT_EQ(rows.sizes(), want.at(key).sizes()) << "sample " << i;
    EXPECT_LE(at::max(at::abs(rows - want.at(key))).item<float>(), 1e-6f) << "sample " << i;
    // The answer mask covers answers, never a placeholder.
    std::vector<int32_t> answer;
    for (size_t k = 0; k < s.tokens.size(); ++k) {
      if (s.mask[k]) answer.push_back(s.tokens[k]);
      if (s.tokens[k] == ds.info().image_token_id) EXPECT_EQ(s.mask[k], 0);
    }
    EXPECT_FALSE(answer.empty());
    if (i == 0) EXPECT_NE(tok.decode(answer).find("It is red."), std::string::npos) << tok.decode(answer);
  }
  // The store does not depend on the worker count.
  auto r4 = preprocess(o + "/conversations.jsonl", d + "/store4", {"--workers", "3", "--chunk-bytes", "64"});
  ASSERT_TRUE(r4.ok()) << r4.output;
  for (const char* part : {"input_ids", "assistant_masks", "media_meta", "media_pixels"}) {
    const std::string a = d + "/store_" + part + "_document.bin", b = d + "/store4_" + part + "_document.bin";
    EXPECT_EQ(lf::testing::read_text(a), lf::testing::read_text(b)) << part;
  }
}

TEST(MultimodalStore, VideosAreSampledAndStored) {
  NEED_ORACLE();
  const std::string d = lf::testing::make_temp_dir("mm_video");
  std::vector<lf::media::Image> frames;
  for (int t = 0; t < 5; ++t) {
    lf::media::Image im{60, 80, std::vector<uint8_t>(60 * 80 * 3)};
    for (size_t i = 0; i < im.rgb.size(); ++i) im.rgb[i] = uint8_t((i * 3 + t * 50) % 256);
    frames.push_back(std::move(im));
  }
  lf::media::write_video(frames, 4.0, d + "/clip.mkv");
  std::ofstream(d + "/v.jsonl") << R"({"messages": [{"role": "user", "content": "<video>What moves?"}, )"
                                << R"({"role": "assistant", "content": "Nothing."}], "videos": ["clip.mkv"]})" << "\n";
  auto r = preprocess(d + "/v.jsonl", d + "/store", {"--video-fps", "2", "--video-min-pixels", "3136",
                                                       "--video-max-pixels", "6272"});
  ASSERT_TRUE(r.ok()) << r.output;
  lf::data::MultimodalDataset ds(d + "/store");
  const auto s = ds.read(0);
  ASSERT_EQ(s.media.size(), 1u);
  const auto& v = s.media[0];
  EXPECT_EQ(v.kind, lf::data::MediaRecord::kVideo);
  // 5 frames at 4 fps sampled at 2 fps: 2.5 wanted, raised to min_frames 4 -> frames 0, 1, 2, 3.
  EXPECT_EQ(v.frames, 4);
  EXPECT_NEAR(v.seconds_per_grid, 2.0 / (4.0 / (5.0 / 4.0)), 1e-6);
  const auto [h, w] = lf::media::smart_resize(60, 80, 28, 3136, 6272);
  EXPECT_EQ(v.height, h);
  EXPECT_EQ(v.width, w);
  EXPECT_EQ(v.images[1].rgb, lf::media::resize_bicubic(frames[1], h, w).rgb);
  int64_t placeholders = 0;
  for (int32_t id : s.tokens) placeholders += id == ds.info().video_token_id;
  EXPECT_EQ(placeholders, 2 * (h / 14) * (w / 14) / 4);
}

void expect_failure(const lf::testing::RankResult& r, const std::vector<std::string>& needles) {
  EXPECT_FALSE(r.ok()) << r.output;
  for (const auto& n : needles) EXPECT_NE(r.output.find(n), std::string::npos) << "missing '" << n << "' in\n" << r.output;
}

TEST(MultimodalStore, BadMediaAndTagsAreNamed) {
  NEED_ORACLE();
  const std::string d = lf::testing::make_temp_dir("mm_errors");
  fs::copy(o + "/img", d + "/img");
  const auto write = [&](const std::string& name, const std::string& line) {
    std::ofstream(d + "/" + name) << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]})"
                                  << "\n" << line << "\n";
    return d + "/" + name;
  };
  expect_failure(preprocess(write("missing.jsonl", R"({"messages": [{"role": "user", "content": "<image>?"}, )"
                                                   R"({"role": "assistant", "content": "a"}], "images": ["img/nope.png"]})"),
                            d + "/s1"),
                 {"missing.jsonl:2", "img/nope.png"});
  std::ofstream(d + "/img/bad.png") << "\x89PNG\r\n\x1a\n garbage";
  expect_failure(preprocess(write("corrupt.jsonl", R"({"messages": [{"role": "user", "content": "<image>?"}, )"
                                                   R"({"role": "assistant", "content": "a"}], "images": ["img/bad.png"]})"),
                            d + "/s2"),
                 {"corrupt.jsonl:2", "bad.png", "corrupt PNG"});
  expect_failure(preprocess(write("tags.jsonl", R"({"messages": [{"role": "user", "content": "<image><image>?"}, )"
                                                R"({"role": "assistant", "content": "a"}], "images": ["img/a.png"]})"),
                            d + "/s3"),
                 {"tags.jsonl:2", "<image> tag without an image"});
  expect_failure(preprocess(write("extra.jsonl", R"({"messages": [{"role": "user", "content": "?"}, )"
                                                 R"({"role": "assistant", "content": "a"}], "images": ["img/a.png"]})"),
                            d + "/s4"),
                 {"extra.jsonl:2", "lists 1 image(s)"});
  expect_failure(preprocess(write("shape.jsonl", R"({"prompt": "x"})"), d + "/s5"),
                 {"shape.jsonl:2", "neither \"messages\" nor \"conversations\""});
  // A store missing a part is refused by the reader, naming it.
  auto r = preprocess(o + "/conversations.jsonl", d + "/ok");
  ASSERT_TRUE(r.ok()) << r.output;
  fs::remove(d + "/ok_media_meta_document.idx");
  try {
    lf::data::MultimodalDataset ds(d + "/ok");
    ADD_FAILURE() << "a store without its media index opened";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ok_media_meta_document"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// The VLM demo's data (make-demo-vlm): a tokenizer directory the store accepts, one 56 x 56
// picture per conversation (4 placeholders), and answers that describe the pictures: the shape's
// colour is the picture's most saturated colour, and the ablation picture has none.
TEST(MultimodalStore, DemoDataDescribesItsPictures) {
  const std::string d = lf::testing::make_temp_dir("mm_demo");
  auto made = run_command({bin("loongforge-data"), "make-demo-vlm", "--out", d, "--train-images", "6", "--eval-images",
                           "4"});
  ASSERT_TRUE(made.ok()) << made.output;
  auto pre = run_command({bin("loongforge-data"), "preprocess", "--multimodal", "--tokenizer-model", d + "/tok",
                          "--input", d + "/train.jsonl", "--output-prefix", d + "/train"});
  ASSERT_TRUE(pre.ok()) << pre.output;
  lf::data::MultimodalDataset ds(d + "/train");
  ASSERT_EQ(ds.size(), 18);
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto s = ds.read(i);
    ASSERT_EQ(s.media.size(), 1u);
    EXPECT_EQ(s.media[0].height, 56);
    int64_t pads = 0;
    for (int32_t id : s.tokens) pads += id == ds.info().image_token_id;
    EXPECT_EQ(pads, 4);
  }
  const std::map<std::string, int> channel = {{"red", 0}, {"green", 1}, {"blue", 2}};
  std::ifstream eval(d + "/eval.jsonl");
  int checked = 0;
  for (std::string line; std::getline(eval, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["attribute"] != "colour") continue;
    const auto img = lf::media::decode_image(d + "/" + j["images"][0].get<std::string>());
    // The most saturated pixel (max - min over channels) carries the shape's colour.
    int best = -1;
    size_t at = 0;
    for (size_t p = 0; p < img.rgb.size(); p += 3) {
      const int sat = std::max({img.rgb[p], img.rgb[p + 1], img.rgb[p + 2]}) -
                      std::min({img.rgb[p], img.rgb[p + 1], img.rgb[p + 2]});
      if (sat > best) best = sat, at = p;
    }
    EXPECT_GT(best, 100) << line;
    const std::string answer = j["answer"];
    if (answer == "yellow") {
      EXPECT_LT(img.rgb[at + 2], img.rgb[at]) << line;
      EXPECT_LT(img.rgb[at + 2], img.rgb[at + 1]) << line;
    } else {
      const int c = channel.at(answer);
      EXPECT_EQ(std::max({img.rgb[at], img.rgb[at + 1], img.rgb[at + 2]}), img.rgb[at + c]) << line;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 4);
  const auto blank = lf::media::decode_image(d + "/img/blank.png");
  int blank_sat = 0;
  for (size_t p = 0; p < blank.rgb.size(); p += 3)
    blank_sat = std::max(blank_sat, std::max({blank.rgb[p], blank.rgb[p + 1], blank.rgb[p + 2]}) -
                                        std::min({blank.rgb[p], blank.rgb[p + 1], blank.rgb[p + 2]}));
  EXPECT_LT(blank_sat, 40);
}

}  // namespace

namespace {

// Flags over the directory's preprocessor_config.json, and --media-root for relative paths.
TEST(MultimodalStore, FlagsOverrideTheProcessorConfigAndMediaRootResolvesPaths) {
  NEED_ORACLE();
  const std::string d = lf::testing::make_temp_dir("mm_flags");
  fs::copy_file(o + "/conversations.jsonl", d + "/conversations.jsonl");  // its paths are relative to o
  auto lost = preprocess(d + "/conversations.jsonl", d + "/lost");
  EXPECT_FALSE(lost.ok()) << lost.output;
  EXPECT_NE(lost.output.find("img/a.png"), std::string::npos) << lost.output;
  auto r = preprocess(d + "/conversations.jsonl", d + "/store",
                      {"--media-root", o, "--max-pixels", "3136", "--image-mean", "0.5", "0.5", "0.5"});
  ASSERT_TRUE(r.ok()) << r.output;
  lf::data::MultimodalDataset ds(d + "/store");
  EXPECT_EQ(ds.info().vision.min_pixels, 3136);  // the file's
  EXPECT_EQ(ds.info().vision.max_pixels, 3136);  // the flag's, over the file's 12544
  EXPECT_EQ(ds.info().vision.image_mean[0], 0.5);
  EXPECT_EQ(ds.info().vision.image_std[0], 0.26862954);  // the file's
  const auto [h, w] = lf::media::smart_resize(120, 90, 28, 3136, 3136);  // b.jpg under the flag's bound
  for (const auto& m : ds.read(1).media) {
    EXPECT_EQ(m.height, h);
    EXPECT_EQ(m.width, w);
    EXPECT_LE(m.height * m.width, 3136);
  }
}

}  // namespace

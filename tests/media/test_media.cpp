// Media: PNG/JPEG decoding, Pillow's bicubic resize and Qwen's vision preprocessing against
// Pillow + transformers (tests/media/media_oracle.py, cached in the build tree), video decoding
// round trips, frames at timestamps, Qwen's frame sampling, and the errors a bad file gets.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../models/cached_oracle.h"
#include "loongforge/core/error.h"
#include "loongforge/media/image.h"
#include "loongforge/media/qwen_vision_input.h"
#include "loongforge/media/video.h"

namespace {

using lf::media::Image;
namespace fs = std::filesystem;

struct Oracle {
  std::string dir;
  nlohmann::json cases;
  std::map<std::string, at::Tensor> t;
};

const Oracle* oracle() {
  static Oracle o = [] {
    Oracle r;
    r.dir = lf::testing::cached_oracle(lf::testing::source_dir() + "/tests/media/media_oracle.py", "media", "done");
    if (!r.dir.empty() && fs::exists(r.dir + "/done")) {
      r.cases = nlohmann::json::parse(lf::testing::read_text(r.dir + "/cases.json"));
      r.t = lf::testing::read_safetensors(r.dir + "/expected.safetensors");
    }
    return r;
  }();
  return o.t.empty() ? nullptr : &o;
}

#define NEED_ORACLE()                                                       \
  const Oracle* o = oracle();                                               \
  if (!o) GTEST_SKIP() << "Python oracle unavailable (.venv missing)"

at::Tensor as_tensor(const Image& im) {
  return at::from_blob(const_cast<uint8_t*>(im.rgb.data()), {im.height, im.width, 3}, at::kByte).to(at::kFloat);
}

std::string temp_dir(const std::string& name) {
  const std::string d = lf::testing::binary_dir() + "/test-tmp/media-" + name + "-" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(MediaImage, DecodesEveryKindAsTransformersConvertToRgb) {
  NEED_ORACLE();
  for (const auto& n : o->cases["images"]) {
    const Image im = lf::media::decode_image(o->dir + "/" + n.get<std::string>());
    const at::Tensor& want = o->t.at("decoded/" + n.get<std::string>());
    ASSERT_EQ(at::IntArrayRef(want.sizes()), at::IntArrayRef({im.height, im.width, 3})) << n;
    EXPECT_EQ(at::max(at::abs(as_tensor(im) - want)).item<float>(), 0.f) << n;
  }
}

TEST(MediaImage, BicubicResizeIsPillowBitForBit) {
  NEED_ORACLE();
  const Image src = lf::media::decode_image(o->dir + "/large.png");
  int i = 0;
  for (const auto& r : o->cases["resizes"]) {
    const Image out = lf::media::resize_bicubic(src, r[2].get<int64_t>(), r[3].get<int64_t>());
    const at::Tensor& want = o->t.at("resize/" + std::to_string(i++));
    ASSERT_EQ(at::IntArrayRef(want.sizes()), at::IntArrayRef({out.height, out.width, 3})) << r;
    EXPECT_EQ(at::max(at::abs(as_tensor(out) - want)).item<float>(), 0.f) << r;
  }
}

lf::media::QwenVisionPreprocess config_named(const std::string& name) {
  lf::media::QwenVisionPreprocess p;
  if (name == "small") {
    p.min_pixels = 32 * 32;
    p.max_pixels = 112 * 112;
  } else if (name == "qwen3") {
    p.patch_size = 16;
    p.image_mean = {0.5, 0.5, 0.5};
    p.image_std = {0.5, 0.5, 0.5};
    p.min_pixels = 64 * 64;
    p.max_pixels = 256 * 256;
  }
  return p;
}

TEST(MediaQwen, PixelValuesEqualTheHfImageProcessor) {
  NEED_ORACLE();
  float worst = 0;
  for (const auto& c : o->cases["configs"]) {
    const auto p = config_named(c.get<std::string>());
    for (const auto& n : o->cases["images"]) {
      const std::string key = c.get<std::string>() + "/" + n.get<std::string>();
      const auto got = lf::media::qwen_image_patches(lf::media::decode_image(o->dir + "/" + n.get<std::string>()), p);
      const at::Tensor& grid = o->t.at(key + "/grid");
      EXPECT_EQ(got.grid[0], grid[0][0].item<int64_t>()) << key;
      EXPECT_EQ(got.grid[1], grid[0][1].item<int64_t>()) << key;
      EXPECT_EQ(got.grid[2], grid[0][2].item<int64_t>()) << key;
      const at::Tensor& want = o->t.at(key + "/pixel_values");
      ASSERT_EQ(got.pixel_values.sizes(), want.sizes()) << key;
      const float d = at::max(at::abs(got.pixel_values - want)).item<float>();
      EXPECT_LE(d, 1e-6f) << key;
      worst = std::max(worst, d);
    }
  }
  std::printf("max |pixel_values - HF| over %zu images x %zu configs: %.3g\n", o->cases["images"].size(),
              o->cases["configs"].size(), worst);
}

TEST(MediaQwen, VideoPatchesEqualTheProcessorSteps) {
  NEED_ORACLE();
  std::vector<Image> frames;
  for (int i = 0; i < o->cases["frames"].get<int>(); ++i) {
    frames.push_back(lf::media::decode_image(o->dir + "/frame" + std::to_string(i) + ".png"));
  }
  const auto got = lf::media::qwen_video_patches(frames, {});
  const at::Tensor& grid = o->t.at("video/grid");
  EXPECT_EQ(got.grid[0], grid[0][0].item<int64_t>());  // 5 frames padded to 6: 3 temporal steps
  EXPECT_EQ(got.grid[1], grid[0][1].item<int64_t>());
  EXPECT_EQ(got.grid[2], grid[0][2].item<int64_t>());
  const at::Tensor& want = o->t.at("video/pixel_values");
  ASSERT_EQ(got.pixel_values.sizes(), want.sizes());
  EXPECT_LE(at::max(at::abs(got.pixel_values - want)).item<float>(), 1e-6f);
}

TEST(MediaQwen, SmartResizeRoundsHalfToEvenAndBoundsPixels) {
  using lf::media::smart_resize;
  // 42 / 28 = 1.5 -> 2, 70 / 28 = 2.5 -> 2 (Python's round), 98 / 28 = 3.5 -> 4.
  EXPECT_EQ(smart_resize(42, 70, 28, 1, 1 << 30), std::make_pair(int64_t(56), int64_t(56)));
  EXPECT_EQ(smart_resize(98, 28, 28, 1, 1 << 30), std::make_pair(int64_t(112), int64_t(28)));
  // Too small: scaled up (ceil) to at least min_pixels.
  auto [h, w] = smart_resize(10, 20, 28, 56 * 56, 1 << 30);
  EXPECT_GE(h * w, 56 * 56);
  EXPECT_EQ(h % 28, 0);
  // Too large: scaled down (floor) to at most max_pixels.
  auto [h2, w2] = smart_resize(4000, 3000, 28, 56 * 56, 28 * 28 * 1280);
  EXPECT_LE(h2 * w2, 28 * 28 * 1280);
  EXPECT_EQ(w2 % 28, 0);
  EXPECT_THROW(smart_resize(10, 2010, 28, 56 * 56, 1 << 30), lf::Error);  // aspect ratio 201
}

TEST(MediaVideo, LosslessRoundTripAndFrameRate) {
  std::vector<Image> frames;
  for (int t = 0; t < 7; ++t) {
    Image im{18, 26, std::vector<uint8_t>(18 * 26 * 3)};
    for (size_t i = 0; i < im.rgb.size(); ++i) im.rgb[i] = uint8_t((i * 7 + t * 31) % 251);
    frames.push_back(std::move(im));
  }
  const std::string d = temp_dir("video");
  lf::media::write_video(frames, 4.0, d + "/clip.mkv");
  lf::media::VideoInfo info;
  const auto back = lf::media::decode_video(d + "/clip.mkv", &info);
  ASSERT_EQ(back.size(), frames.size());
  EXPECT_NEAR(info.fps, 4.0, 1e-9);
  EXPECT_EQ(info.total_frames, 7);
  for (size_t i = 0; i < frames.size(); ++i) {
    ASSERT_EQ(back[i].height, 18);
    ASSERT_EQ(back[i].width, 26);
    EXPECT_EQ(back[i].rgb, frames[i].rgb) << "frame " << i;
  }
  fs::remove_all(d);
}

// Animated GIFs: frames with at most 256 colours come back exactly (one palette of their colours);
// with more, each channel comes back at the nearest level of the 6 x 7 x 6 colour cube (within half
// a step: 25.5 for red and blue, 21.25 for green). Decoded by libavformat: frame count and size.
TEST(MediaVideo, GifWriterKeepsFewColoursExactlyAndQuantisesMany) {
  const std::string d = temp_dir("gif");
  std::vector<Image> few, many;
  for (int t = 0; t < 5; ++t) {
    Image a{12, 10, std::vector<uint8_t>(12 * 10 * 3)}, b = a;
    for (size_t p = 0; p < 120; ++p) {
      const uint8_t colour = uint8_t((p / 7 + size_t(t) * 3) % 9 * 30);  // 9 colours, moving
      a.rgb[p * 3] = colour;
      a.rgb[p * 3 + 1] = uint8_t(255 - colour);
      a.rgb[p * 3 + 2] = uint8_t(colour / 2);
      for (size_t c = 0; c < 3; ++c) b.rgb[p * 3 + c] = uint8_t((p * 37 + c * 101 + size_t(t) * 53) % 256);
    }
    few.push_back(std::move(a));
    many.push_back(std::move(b));
  }
  lf::media::write_gif(few, 10.0, d + "/few.gif");
  lf::media::write_gif(many, 10.0, d + "/many.gif");
  const auto back_few = lf::media::decode_video(d + "/few.gif");
  const auto back_many = lf::media::decode_video(d + "/many.gif");
  ASSERT_EQ(back_few.size(), 5u);
  ASSERT_EQ(back_many.size(), 5u);
  const double half_step[3] = {25.5, 21.25, 25.5};
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_EQ(back_few[i].height, 12);
    ASSERT_EQ(back_few[i].width, 10);
    EXPECT_EQ(back_few[i].rgb, few[i].rgb) << "frame " << i;
    ASSERT_EQ(back_many[i].rgb.size(), many[i].rgb.size());
    for (size_t k = 0; k < many[i].rgb.size(); ++k)
      ASSERT_LE(std::abs(int(back_many[i].rgb[k]) - int(many[i].rgb[k])), half_step[k % 3] + 1) << i << " " << k;
  }
  fs::remove_all(d);
}

TEST(MediaVideo, QwenFrameSamplingAsTransformers) {
  using lf::media::qwen_sample_frames;
  // 30 frames at 30 fps sampled at 2 fps: 2 frames, raised to min_frames 4: arange(0, 30, 7.5).
  EXPECT_EQ(qwen_sample_frames(30, 30.0, 2.0, 4, 768, 2), (std::vector<int64_t>{0, 7, 15, 22}));
  // 10 s at 25 fps (250 frames) at 2 fps: 20 frames, every 12.5th.
  const auto idx = qwen_sample_frames(250, 25.0, 2.0, 4, 768, 2);
  ASSERT_EQ(idx.size(), 20u);
  EXPECT_EQ(idx[1], 12);
  EXPECT_EQ(idx[2], 25);
  EXPECT_EQ(idx.back(), 237);
  // 5 frames, 2 fps from 1 fps: 10 wanted, capped at floor(5 / 2) x 2 = 4.
  EXPECT_EQ(qwen_sample_frames(5, 1.0, 2.0, 4, 768, 2), (std::vector<int64_t>{0, 1, 2, 3}));
  // fps <= 0: every frame.
  EXPECT_EQ(qwen_sample_frames(3, 1.0, 0.0, 4, 768, 2).size(), 3u);
  EXPECT_THROW(qwen_sample_frames(1, 1.0, 2.0, 4, 768, 2), lf::Error);
}

void expect_error_naming(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MediaErrors, BadFilesAreNamed) {
  const std::string d = temp_dir("errors");
  expect_error_naming([&] { lf::media::decode_image(d + "/missing.png"); }, "missing.png");
  std::ofstream(d + "/text.png") << "not an image";
  expect_error_naming([&] { lf::media::decode_image(d + "/text.png"); }, "neither PNG nor JPEG");
  std::ofstream(d + "/empty.jpg").close();
  expect_error_naming([&] { lf::media::decode_image(d + "/empty.jpg"); }, "empty");
  // A valid PNG cut in half, a JPEG cut after its header.
  Image im{40, 40, std::vector<uint8_t>(40 * 40 * 3, 90)};
  for (size_t i = 0; i < im.rgb.size(); ++i) im.rgb[i] = uint8_t(i * 13);
  lf::media::write_png(im, d + "/ok.png");
  EXPECT_EQ(lf::media::decode_image(d + "/ok.png").rgb, im.rgb);
  std::string bytes = lf::testing::read_text(d + "/ok.png");
  std::ofstream(d + "/cut.png", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  expect_error_naming([&] { lf::media::decode_image(d + "/cut.png"); }, "cut.png");
  const std::string jpeg_head = "\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00";
  std::ofstream(d + "/cut.jpg", std::ios::binary) << jpeg_head;
  expect_error_naming([&] { lf::media::decode_image(d + "/cut.jpg"); }, "corrupt JPEG");
  expect_error_naming([&] { lf::media::decode_video(d + "/missing.mp4"); }, "missing.mp4");
  expect_error_naming([&] { lf::media::decode_video(d + "/text.png"); }, "text.png");
  fs::remove_all(d);
}

// Frames at timestamps (LeRobot's lookup): any order and repeats, the nearest frame's pts within the
// tolerance, an error naming the file past the end or between frames.
TEST(MediaVideo, FramesAtTimestampsAreTheNearestWithinTolerance) {
  std::vector<Image> frames;
  for (int t = 0; t < 12; ++t) {
    Image im{10, 14, std::vector<uint8_t>(10 * 14 * 3)};
    for (size_t i = 0; i < im.rgb.size(); ++i) im.rgb[i] = uint8_t((i * 5 + t * 41) % 253);
    frames.push_back(std::move(im));
  }
  const std::string d = temp_dir("video-at");
  lf::media::write_video(frames, 4.0, d + "/clip.mkv");
  std::vector<double> pts;
  const auto got = lf::media::decode_video_at(d + "/clip.mkv", {2.0, 0.0, 0.5, 0.50004, 2.75}, 1e-4,
                                              lf::media::RgbConversion::kPyAV, &pts);
  ASSERT_EQ(got.size(), 5u);
  const int want[] = {8, 0, 2, 2, 11};
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].rgb, frames[size_t(want[i])].rgb) << "timestamp " << i;
    EXPECT_DOUBLE_EQ(pts[i], want[i] * 0.25) << "timestamp " << i;
  }
  const auto late = lf::media::decode_video_at(d + "/clip.mkv", {1.25, 1.5}, 1e-4, lf::media::RgbConversion::kAccurate);
  EXPECT_EQ(late[0].rgb, frames[5].rgb);  // RGB in, RGB out: both conversions copy
  EXPECT_EQ(late[1].rgb, frames[6].rgb);
  expect_error_naming([&] { lf::media::decode_video_at(d + "/clip.mkv", {0.3}, 1e-4); }, "no frame within");
  expect_error_naming([&] { lf::media::decode_video_at(d + "/clip.mkv", {1.0, 3.25}, 1e-4); }, "clip.mkv");
  fs::remove_all(d);
}

}  // namespace

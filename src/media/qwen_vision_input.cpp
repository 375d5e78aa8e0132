// Qwen-VL vision inputs (media/qwen_vision_input.h).
#include "loongforge/media/qwen_vision_input.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loongforge/core/error.h"

namespace lf::media {
namespace {

// Python's round(): half to even.
int64_t round_half_even(double x) {
  const double r = std::nearbyint(x);  // default rounding mode: to nearest, ties to even
  return int64_t(r);
}

void check(const QwenVisionPreprocess& p) {
  LF_CHECK(p.patch_size > 0 && p.temporal_patch_size > 0 && p.merge_size > 0,
           "vision preprocessing: patch_size ", p.patch_size, ", temporal_patch_size ", p.temporal_patch_size,
           ", merge_size ", p.merge_size, " must be positive");
  LF_CHECK(p.min_pixels > 0 && p.max_pixels >= p.min_pixels, "vision preprocessing: min_pixels ", p.min_pixels,
           " and max_pixels ", p.max_pixels, " must satisfy 0 < min_pixels <= max_pixels");
  for (int c = 0; c < 3; ++c) {
    LF_CHECK(p.image_std[c] != 0.0, "vision preprocessing: image_std[", c, "] is 0");
  }
}

// frames (resized, same size) -> rows, as the processors' patchify: rows ordered (t, h/m, w/m, m,
// m), each row (C, T, P, P); values (x / 255 - mean) / std in float32 as transformers computes
// them (rescale in float64 then float32; normalize in float32).
VisionPatches patchify(const std::vector<const Image*>& frames, const QwenVisionPreprocess& p) {
  LF_CHECK(!frames.empty() && int64_t(frames.size()) % p.temporal_patch_size == 0, "vision patches: ", frames.size(),
           " frames is not a positive multiple of temporal_patch_size ", p.temporal_patch_size);
  const int64_t unit = p.patch_size * p.merge_size;
  for (const Image* f : frames) {
    LF_CHECK(f->height == frames[0]->height && f->width == frames[0]->width && f->height % unit == 0 &&
                 f->width % unit == 0 && f->rgb.size() == size_t(f->height * f->width * 3),
             "vision patches: a ", f->height, "x", f->width, " frame (", f->rgb.size(),
             " bytes) is not a multiple of patch_size x merge_size = ", unit, " or differs from the first frame");
  }
  const int64_t P = p.patch_size, T = p.temporal_patch_size, M = p.merge_size;
  const int64_t H = frames[0]->height, W = frames[0]->width;
  const int64_t gt = int64_t(frames.size()) / T, gh = H / P, gw = W / P;
  const int64_t row = 3 * T * P * P;
  VisionPatches out;
  out.grid = {gt, gh, gw};
  out.pixel_values = at::empty({gt * gh * gw, row}, at::kFloat);
  float* dst = out.pixel_values.data_ptr<float>();
  float mean[3], std[3];
  for (int c = 0; c < 3; ++c) {
    mean[c] = float(p.image_mean[c]);
    std[c] = float(p.image_std[c]);
  }
  float lut[3][256];
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      const float scaled = float(double(v) * (1.0 / 255.0));
      lut[c][v] = (scaled - mean[c]) / std[c];
    }
  }
  int64_t r = 0;
  for (int64_t t = 0; t < gt; ++t) {
    for (int64_t bh = 0; bh < gh / M; ++bh) {
      for (int64_t bw = 0; bw < gw / M; ++bw) {
        for (int64_t mh = 0; mh < M; ++mh) {
          for (int64_t mw = 0; mw < M; ++mw, ++r) {
            float* o = dst + r * row;
            const int64_t y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
            for (int64_t c = 0; c < 3; ++c) {
              for (int64_t tt = 0; tt < T; ++tt) {
                const uint8_t* px = frames[t * T + tt]->rgb.data();
                for (int64_t y = 0; y < P; ++y) {
                  const uint8_t* line = px + ((y0 + y) * W + x0) * 3 + c;
                  for (int64_t x = 0; x < P; ++x) *o++ = lut[c][line[x * 3]];
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

}  // namespace

VisionPatches qwen_patches_of_resized(const std::vector<const Image*>& frames, const QwenVisionPreprocess& p) {
  check(p);
  LF_CHECK(!frames.empty(), "vision patches: no frames");
  std::vector<const Image*> padded = frames;
  while (int64_t(padded.size()) % p.temporal_patch_size != 0) padded.push_back(padded.back());
  return patchify(padded, p);
}

std::pair<int64_t, int64_t> qwen_resized_size(int64_t height, int64_t width, const QwenVisionPreprocess& p) {
  check(p);
  return smart_resize(height, width, p.patch_size * p.merge_size, p.min_pixels, p.max_pixels);
}

QwenVisionPreprocess read_preprocessor_config(const std::string& file, QwenVisionPreprocess p) {
  nlohmann::json j;
  try {
    std::ifstream in(file);
    LF_CHECK(in.good(), file, ": cannot open");
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    LF_FAIL(file, ": not JSON: ", e.what());
  }
  const auto integer = [&](const nlohmann::json& o, const char* key, int64_t& into) {
    if (!o.contains(key) || o[key].is_null()) return;
    LF_CHECK(o[key].is_number_integer(), file, ": ", key, " must be an integer, got ", o[key].dump());
    into = o[key].get<int64_t>();
  };
  integer(j, "min_pixels", p.min_pixels);
  integer(j, "max_pixels", p.max_pixels);
  if (j.contains("size") && j["size"].is_object()) {
    integer(j["size"], "shortest_edge", p.min_pixels);
    integer(j["size"], "longest_edge", p.max_pixels);
  }
  integer(j, "patch_size", p.patch_size);
  integer(j, "merge_size", p.merge_size);
  integer(j, "temporal_patch_size", p.temporal_patch_size);
  for (const auto& [key, into] : {std::pair<const char*, std::array<double, 3>*>{"image_mean", &p.image_mean},
                                  {"image_std", &p.image_std}})
    if (j.contains(key) && !j[key].is_null()) {
      LF_CHECK(j[key].is_array() && j[key].size() == 3 && j[key][0].is_number() && j[key][1].is_number() &&
                   j[key][2].is_number(),
               file, ": ", key, " must be 3 numbers, got ", j[key].dump());
      for (size_t c = 0; c < 3; ++c) (*into)[c] = j[key][c].get<double>();
    }
  return p;
}

std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                         int64_t max_pixels) {
  LF_CHECK(height > 0 && width > 0, "smart_resize: image size ", height, "x", width, " must be positive");
  const double ratio = double(std::max(height, width)) / double(std::min(height, width));
  LF_CHECK(ratio <= 200.0, "smart_resize: aspect ratio ", ratio, " of a ", height, "x", width,
           " image is above 200 (Qwen's limit)", lf::hint("crop or pad the image"));
  int64_t h = round_half_even(double(height) / double(factor)) * factor;
  int64_t w = round_half_even(double(width) / double(factor)) * factor;
  if (h * w > max_pixels) {
    const double beta = std::sqrt(double(height * width) / double(max_pixels));
    h = std::max(factor, int64_t(std::floor(double(height) / beta / double(factor))) * factor);
    w = std::max(factor, int64_t(std::floor(double(width) / beta / double(factor))) * factor);
  } else if (h * w < min_pixels) {
    const double beta = std::sqrt(double(min_pixels) / double(height * width));
    h = int64_t(std::ceil(double(height) * beta / double(factor))) * factor;
    w = int64_t(std::ceil(double(width) * beta / double(factor))) * factor;
  }
  return {h, w};
}

VisionPatches qwen_image_patches(const Image& image, const QwenVisionPreprocess& p) {
  check(p);
  const auto [h, w] =
      smart_resize(image.height, image.width, p.patch_size * p.merge_size, p.min_pixels, p.max_pixels);
  const Image resized = resize_bicubic(image, h, w);
  std::vector<const Image*> frames(size_t(p.temporal_patch_size), &resized);
  return patchify(frames, p);
}

VisionPatches qwen_video_patches(const std::vector<Image>& frames, const QwenVisionPreprocess& p) {
  check(p);
  LF_CHECK(!frames.empty(), "qwen_video_patches: a video needs at least one frame");
  for (size_t i = 1; i < frames.size(); ++i) {
    LF_CHECK(frames[i].height == frames[0].height && frames[i].width == frames[0].width, "video frame ", i, " is ",
             frames[i].height, "x", frames[i].width, ", frame 0 ", frames[0].height, "x", frames[0].width,
             " (all frames of a video must have one size)");
  }
  const auto [h, w] =
      smart_resize(frames[0].height, frames[0].width, p.patch_size * p.merge_size, p.min_pixels, p.max_pixels);
  std::vector<Image> resized;
  resized.reserve(frames.size());
  for (const Image& f : frames) resized.push_back(resize_bicubic(f, h, w));
  std::vector<const Image*> ptrs;
  for (const Image& f : resized) ptrs.push_back(&f);
  while (int64_t(ptrs.size()) % p.temporal_patch_size != 0) ptrs.push_back(ptrs.back());
  return patchify(ptrs, p);
}

}  // namespace lf::media

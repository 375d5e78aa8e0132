// Qwen-VL vision inputs: images and videos -> the `pixel_values` rows and (t, h, w) grids that
// transformers' Qwen2VLImageProcessor / Qwen2VLVideoProcessor produce and the Qwen2.5-VL and
// Qwen3-VL vision towers take. smart_resize to a multiple of patch x merge within
// [min_pixels, max_pixels], Pillow bicubic (media/image.h), x/255, (x - mean) / std, then each
// temporal_patch_size frames x patch x patch block flattened as one row (C, T, P, P), rows
// ordered merge unit by merge unit (2 x 2 patches in a row) as the mergers expect.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <string>
#include <cstdint>
#include <utility>
#include <vector>

#include "loongforge/media/image.h"

namespace lf::media {

// transformers' preprocessor_config.json fields of Qwen2-VL / Qwen2.5-VL (defaults: theirs for
// images; Qwen3-VL uses patch_size 16, mean = std = 0.5).
struct QwenVisionPreprocess {
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  int64_t min_pixels = 56 * 56;         // size.shortest_edge
  int64_t max_pixels = 28 * 28 * 1280;  // size.longest_edge
  std::array<double, 3> image_mean = {0.48145466, 0.4578275, 0.40821073};  // OpenAI CLIP
  std::array<double, 3> image_std = {0.26862954, 0.26130258, 0.27577711};
};

// transformers' preprocessor_config.json (Qwen2VLImageProcessor's fields) over `base`: min_pixels /
// max_pixels or size.shortest_edge / longest_edge, patch_size, merge_size, temporal_patch_size,
// image_mean, image_std; fields it lacks keep base's. A malformed file or value is an lf::Error naming
// the file and key.
QwenVisionPreprocess read_preprocessor_config(const std::string& file, QwenVisionPreprocess base);

// Qwen's smart_resize: (height, width) -> the nearest (h, w), multiples of `factor` (Python's
// round-half-even), scaled down (floor) to at most max_pixels or up (ceil) to at least
// min_pixels, aspect kept. An aspect ratio above 200 is an error.
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                         int64_t max_pixels);

struct VisionPatches {
  at::Tensor pixel_values;     // [t * h * w, C * T * P * P] float32
  std::array<int64_t, 3> grid;  // (t, h, w) in patches
};

// One image (repeated temporal_patch_size times, as the processor does): grid (1, h, w).
VisionPatches qwen_image_patches(const Image& image, const QwenVisionPreprocess& p);

// A video's frames (all the same size): resized with the processor's size rule on the first
// frame, padded with copies of the last frame to a multiple of temporal_patch_size; grid (t, h, w).
VisionPatches qwen_video_patches(const std::vector<Image>& frames, const QwenVisionPreprocess& p);

// Frames already resized to multiples of patch x merge (as a store keeps them), padded with copies
// of the last to a multiple of temporal_patch_size, -> their rows (normalisation and patch order as
// above).
VisionPatches qwen_patches_of_resized(const std::vector<const Image*>& frames, const QwenVisionPreprocess& p);

// The size a medium is resized to: smart_resize with the processor's factor and pixel bounds.
std::pair<int64_t, int64_t> qwen_resized_size(int64_t height, int64_t width, const QwenVisionPreprocess& p);

// The placeholder tokens a grid takes in the sequence: t h w / merge^2.
inline int64_t qwen_placeholder_count(const std::array<int64_t, 3>& grid, int64_t merge_size) {
  return grid[0] * grid[1] * grid[2] / (merge_size * merge_size);
}

}  // namespace lf::media

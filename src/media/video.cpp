// media/video.h: Qwen's frame sampling here; decoding and writing forward to the video module
// (video_codecs.cpp), loaded the first time a video is touched.
#include "loongforge/media/video.h"

#include <algorithm>
#include <cmath>

#include "loongforge/core/error.h"
#include "loongforge/core/modules.h"
#include "video_codecs.h"

namespace lf::media {
namespace {

const VideoCodecs& codecs() {
  static const VideoCodecs* table = reinterpret_cast<VideoCodecsFn>(
      lf::module_symbol(kVideoModule, kVideoCodecsSymbol, "decoding and writing videos with FFmpeg"))();
  return *table;
}

}  // namespace

std::vector<Image> decode_video(const std::string& path, VideoInfo* info) {
  return codecs().decode_video(path, info);
}

std::vector<Image> decode_video_at(const std::string& path, const std::vector<double>& timestamps, double tolerance_s,
                                   RgbConversion conversion, std::vector<double>* frame_pts) {
  return codecs().decode_video_at(path, timestamps, tolerance_s, conversion, frame_pts);
}

void write_video(const std::vector<Image>& frames, double fps, const std::string& path) {
  codecs().write_video(frames, fps, path);
}

void write_gif(const std::vector<Image>& frames, double fps, const std::string& path) {
  codecs().write_gif(frames, fps, path);
}

std::vector<int64_t> qwen_sample_frames(int64_t total_frames, double video_fps, double fps, int64_t min_frames,
                                        int64_t max_frames, int64_t temporal_patch_size) {
  LF_CHECK(total_frames > 0 && temporal_patch_size > 0, "qwen_sample_frames: ", total_frames, " frames, temporal ",
           temporal_patch_size);
  std::vector<int64_t> idx;
  if (fps <= 0) {
    for (int64_t i = 0; i < total_frames; ++i) idx.push_back(i);
    return idx;
  }
  LF_CHECK(video_fps > 0, "qwen_sample_frames: sampling at ", fps, " fps needs the video's frame rate (got ",
           video_fps, ")");
  const int64_t cap = (std::min(max_frames, total_frames) / temporal_patch_size) * temporal_patch_size;
  double n = double(total_frames) / video_fps * fps;
  n = std::min({std::max(n, double(min_frames)), double(cap), double(total_frames)});
  const int64_t num = int64_t(std::floor(n / double(temporal_patch_size))) * temporal_patch_size;
  LF_CHECK(num > 0, "qwen_sample_frames: a video of ", total_frames, " frames yields no group of ",
           temporal_patch_size, " frames at ", fps, " fps", lf::hint("use a longer video"));
  // torch.arange(0, total, total / num).int(): float32 steps (arange's default dtype for a float step).
  const float step = float(total_frames) / float(num);
  for (int64_t i = 0;; ++i) {
    const float v = float(i) * step;
    if (!(v < float(total_frames)) || int64_t(idx.size()) >= num) break;
    idx.push_back(int64_t(v));
  }
  return idx;
}

}  // namespace lf::media

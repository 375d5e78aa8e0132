// The table of video functions the video module (video_codecs.cpp, libloongforge_video.so)
// exports, so that video.cpp can load FFmpeg on first use (core/modules.h). Internal to media.
#pragma once

#include <string>
#include <vector>

#include "loongforge/media/video.h"

namespace lf::media {

struct VideoCodecs {
  std::vector<Image> (*decode_video)(const std::string& path, VideoInfo* info);
  std::vector<Image> (*decode_video_at)(const std::string& path, const std::vector<double>& timestamps,
                                        double tolerance_s, RgbConversion conversion,
                                        std::vector<double>* frame_pts);
  void (*write_video)(const std::vector<Image>& frames, double fps, const std::string& path);
  void (*write_gif)(const std::vector<Image>& frames, double fps, const std::string& path);
};

inline constexpr const char* kVideoModule = "libloongforge_video.so";
inline constexpr const char* kVideoCodecsSymbol = "lf_video_codecs";
using VideoCodecsFn = const VideoCodecs* (*)();

}  // namespace lf::media

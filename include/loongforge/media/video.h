// Videos for VLM and robot data: decoding a file's frames with libavformat/libavcodec (any
// container and codec the system FFmpeg reads) to RGB, all of them or those at given timestamps
// (LeRobot datasets), Qwen's frame sampling, a lossless writer (PNG frames in Matroska) for tests
// and demos, and an animated-GIF writer for previews.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/media/image.h"

namespace lf::media {

struct VideoInfo {
  double fps = 0;            // the stream's average frame rate
  int64_t total_frames = 0;  // frames decoded
};

// Every frame of the file's best video stream, in presentation order, as 8-bit RGB (libswscale,
// same size). An lf::Error naming the file for a missing file, no video stream, an unsupported
// codec or a corrupt stream.
std::vector<Image> decode_video(const std::string& path, VideoInfo* info = nullptr);

// How decoded 4:2:0 YUV becomes RGB (libswscale, same size). The two upsample chroma differently:
// at sharp colour edges they differ by tens of levels (docs/data.md, "LeRobot datasets").
enum class RgbConversion {
  kAccurate,  // bicubic, accurate rounding, full chroma interpolation (decode_video's)
  kPyAV,      // swscale's defaults as PyAV's frame.to_ndarray(format="rgb24") asks for them:
              // bilinear, no colourspace set (BT.601, limited range); what LeRobot decodes with
};

// The frames of `path` at `timestamps` (seconds, any order, repeats allowed), as LeRobot's
// decode_video_frames does it with PyAV: seek to the keyframe at or before the earliest timestamp,
// decode forward until a frame's pts reaches the latest, and give each timestamp the decoded frame
// whose pts (seconds) is nearest, compared in float32. An lf::Error naming the file and the
// timestamps when that frame is `tolerance_s` or more away (a video shorter than asked, a gap, or
// timestamps off the frame grid), plus decode_video's errors. `frame_pts`, when given, receives
// the chosen frames' pts in seconds.
std::vector<Image> decode_video_at(const std::string& path, const std::vector<double>& timestamps, double tolerance_s,
                                   RgbConversion conversion = RgbConversion::kPyAV,
                                   std::vector<double>* frame_pts = nullptr);

// Which frames Qwen's video processor keeps (transformers' Qwen2VLVideoProcessor.sample_frames
// with `fps`): n = total / video_fps x fps, clamped to [min_frames, min(max_frames, total)],
// floored to a multiple of temporal_patch_size; indices int(i x total / n). fps <= 0 keeps every
// frame. An error when fewer frames than temporal_patch_size remain.
std::vector<int64_t> qwen_sample_frames(int64_t total_frames, double video_fps, double fps, int64_t min_frames,
                                        int64_t max_frames, int64_t temporal_patch_size);

// Writes frames (one size) losslessly (PNG-coded frames in Matroska) at `fps` frames per second.
void write_video(const std::vector<Image>& frames, double fps, const std::string& path);

// Writes frames (one size) as an animated GIF looping forever (libavformat's gif muxer and
// libavcodec's GIF encoder), each frame 1 / fps seconds (GIF counts hundredths). One palette for
// the animation: exact when the frames have at most 256 colours, otherwise the 6 x 7 x 6 colour
// cube, each channel rounded to its nearest level (no dithering), a preview rather than data.
void write_gif(const std::vector<Image>& frames, double fps, const std::string& path);

}  // namespace lf::media

// Videos for VLM data: decoding a file's frames with libavformat/libavcodec (any container and
// codec the system FFmpeg reads) to RGB, Qwen's frame sampling, a lossless writer (PNG frames in
// Matroska) for tests and demos, and an animated-GIF writer for previews.
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

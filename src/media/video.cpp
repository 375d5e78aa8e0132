// Video decoding / writing with FFmpeg's libraries (media/video.h).
#include "loongforge/media/video.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libswscale/swscale.h>
}

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <cmath>
#include <cstring>
#include <memory>

#include "loongforge/core/error.h"

namespace lf::media {
namespace {

std::string av_message(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(code, buf, sizeof(buf));
  return buf;
}

struct FormatIn {
  AVFormatContext* ctx = nullptr;
  ~FormatIn() {
    if (ctx) avformat_close_input(&ctx);
  }
};
struct Codec {
  AVCodecContext* ctx = nullptr;
  ~Codec() {
    if (ctx) avcodec_free_context(&ctx);
  }
};
struct Frame {
  AVFrame* f = av_frame_alloc();
  ~Frame() { av_frame_free(&f); }
};
struct Packet {
  AVPacket* p = av_packet_alloc();
  ~Packet() { av_packet_free(&p); }
};
struct Sws {
  SwsContext* ctx = nullptr;
  ~Sws() { sws_freeContext(ctx); }
};

Image to_rgb(const AVFrame* frame, Sws& sws) {
  Image img;
  img.height = frame->height;
  img.width = frame->width;
  img.rgb.resize(size_t(img.height * img.width * 3));
  sws.ctx = sws_getCachedContext(sws.ctx, frame->width, frame->height, AVPixelFormat(frame->format), frame->width,
                                 frame->height, AV_PIX_FMT_RGB24, SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT,
                                 nullptr, nullptr, nullptr);
  LF_CHECK(sws.ctx != nullptr, "video: cannot convert pixel format ",
           av_get_pix_fmt_name(AVPixelFormat(frame->format)), " to RGB");
  uint8_t* dst[4] = {img.rgb.data(), nullptr, nullptr, nullptr};
  int stride[4] = {int(img.width * 3), 0, 0, 0};
  sws_scale(sws.ctx, frame->data, frame->linesize, 0, frame->height, dst, stride);
  return img;
}

}  // namespace

std::vector<Image> decode_video(const std::string& path, VideoInfo* info) {
  FormatIn in;
  int rc = avformat_open_input(&in.ctx, path.c_str(), nullptr, nullptr);
  if (rc < 0) {
    LF_FAIL("video ", path, ": cannot open (", av_message(rc), ")",
            lf::hint("check the path; the file must be a video FFmpeg can read"));
  }
  rc = avformat_find_stream_info(in.ctx, nullptr);
  if (rc < 0) LF_FAIL("video ", path, ": cannot read stream information (", av_message(rc), ")");
  const AVCodec* decoder = nullptr;
  const int stream = av_find_best_stream(in.ctx, AVMEDIA_TYPE_VIDEO, -1, -1, &decoder, 0);
  if (stream < 0 || !decoder) {
    LF_FAIL("video ", path, ": no decodable video stream (", av_message(stream), ")",
            lf::hint("re-encode the file with a common codec (H.264, VP9, FFV1, MJPEG)"));
  }
  AVStream* st = in.ctx->streams[stream];
  Codec dec;
  dec.ctx = avcodec_alloc_context3(decoder);
  avcodec_parameters_to_context(dec.ctx, st->codecpar);
  dec.ctx->thread_count = 1;
  rc = avcodec_open2(dec.ctx, decoder, nullptr);
  if (rc < 0) LF_FAIL("video ", path, ": cannot open the ", decoder->name, " decoder (", av_message(rc), ")");

  std::vector<Image> frames;
  Frame frame;
  Packet pkt;
  Sws sws;
  auto drain = [&]() {
    while (true) {
      const int r = avcodec_receive_frame(dec.ctx, frame.f);
      if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return;
      if (r < 0) LF_FAIL("video ", path, ": decoding frame ", frames.size(), " failed (", av_message(r), ")");
      frames.push_back(to_rgb(frame.f, sws));
      av_frame_unref(frame.f);
    }
  };
  while ((rc = av_read_frame(in.ctx, pkt.p)) >= 0) {
    if (pkt.p->stream_index == stream) {
      const int r = avcodec_send_packet(dec.ctx, pkt.p);
      if (r < 0 && r != AVERROR(EAGAIN)) {
        av_packet_unref(pkt.p);
        LF_FAIL("video ", path, ": corrupt packet after frame ", frames.size(), " (", av_message(r), ")",
                lf::hint("re-encode or remove the file"));
      }
      drain();
    }
    av_packet_unref(pkt.p);
  }
  if (rc != AVERROR_EOF) LF_FAIL("video ", path, ": read error after frame ", frames.size(), " (", av_message(rc), ")");
  avcodec_send_packet(dec.ctx, nullptr);
  drain();
  if (frames.empty()) LF_FAIL("video ", path, ": no frames decoded", lf::hint("the file holds an empty video stream"));
  if (info) {
    const AVRational r = st->avg_frame_rate.num ? st->avg_frame_rate : st->r_frame_rate;
    info->fps = r.den ? av_q2d(r) : 0.0;
    info->total_frames = int64_t(frames.size());
  }
  return frames;
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

namespace {

// Encodes `frames` with `codec` in the container `format` at `fps` frames per second; `fill` writes
// an image into the encoder's frame (of `pix_fmt`). `what` names the writer in messages.
void write_frames(const std::vector<Image>& frames, double fps, const std::string& path, const char* what,
                  const char* format, AVCodecID codec, AVPixelFormat pix_fmt,
                  const std::function<void(const Image&, AVFrame*)>& fill) {
  LF_CHECK(!frames.empty() && fps > 0, what, ": ", frames.size(), " frames at ", fps, " fps");
  AVFormatContext* out = nullptr;
  int rc = avformat_alloc_output_context2(&out, nullptr, format, path.c_str());
  LF_CHECK(rc >= 0 && out, what, " ", path, ": ", av_message(rc));
  std::unique_ptr<AVFormatContext, void (*)(AVFormatContext*)> guard(out, [](AVFormatContext* c) {
    if (!(c->oformat->flags & AVFMT_NOFILE)) avio_closep(&c->pb);
    avformat_free_context(c);
  });
  const AVCodec* enc = avcodec_find_encoder(codec);
  LF_CHECK(enc != nullptr, what, ": this FFmpeg has no ", avcodec_get_name(codec), " encoder");
  AVStream* st = avformat_new_stream(out, nullptr);
  Codec c;
  c.ctx = avcodec_alloc_context3(enc);
  c.ctx->width = int(frames[0].width);
  c.ctx->height = int(frames[0].height);
  c.ctx->pix_fmt = pix_fmt;
  const AVRational rate = av_d2q(fps, 1000);
  c.ctx->time_base = av_inv_q(rate);
  c.ctx->framerate = rate;
  if (out->oformat->flags & AVFMT_GLOBALHEADER) c.ctx->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  rc = avcodec_open2(c.ctx, enc, nullptr);
  LF_CHECK(rc >= 0, what, ": cannot open the ", avcodec_get_name(codec), " encoder (", av_message(rc), ")");
  avcodec_parameters_from_context(st->codecpar, c.ctx);
  st->time_base = c.ctx->time_base;
  st->avg_frame_rate = rate;
  rc = avio_open(&out->pb, path.c_str(), AVIO_FLAG_WRITE);
  LF_CHECK(rc >= 0, what, " ", path, ": cannot open for writing (", av_message(rc), ")");
  rc = avformat_write_header(out, nullptr);
  LF_CHECK(rc >= 0, what, " ", path, ": ", av_message(rc));
  Frame frame;
  frame.f->format = pix_fmt;
  frame.f->width = c.ctx->width;
  frame.f->height = c.ctx->height;
  av_frame_get_buffer(frame.f, 0);
  Packet pkt;
  auto flush = [&]() {
    while (avcodec_receive_packet(c.ctx, pkt.p) >= 0) {
      av_packet_rescale_ts(pkt.p, c.ctx->time_base, st->time_base);
      pkt.p->stream_index = st->index;
      av_interleaved_write_frame(out, pkt.p);
    }
  };
  for (size_t i = 0; i < frames.size(); ++i) {
    const Image& im = frames[i];
    LF_CHECK(im.height == frames[0].height && im.width == frames[0].width, what, ": frame ", i, " size differs");
    av_frame_make_writable(frame.f);
    fill(im, frame.f);
    frame.f->pts = int64_t(i);
    LF_CHECK(avcodec_send_frame(c.ctx, frame.f) >= 0, what, ": encoding frame ", i);
    flush();
  }
  avcodec_send_frame(c.ctx, nullptr);
  flush();
  rc = av_write_trailer(out);
  LF_CHECK(rc >= 0, what, " ", path, ": ", av_message(rc));
}

uint32_t rgb_key(const uint8_t* p) { return (uint32_t(p[0]) << 16) | (uint32_t(p[1]) << 8) | uint32_t(p[2]); }

}  // namespace

void write_video(const std::vector<Image>& frames, double fps, const std::string& path) {
  write_frames(frames, fps, path, "write_video", "matroska", AV_CODEC_ID_PNG, AV_PIX_FMT_RGB24,
               [](const Image& im, AVFrame* f) {
                 for (int64_t y = 0; y < im.height; ++y)
                   std::memcpy(f->data[0] + y * f->linesize[0], &im.rgb[size_t(y * im.width * 3)],
                               size_t(im.width * 3));
               });
}

void write_gif(const std::vector<Image>& frames, double fps, const std::string& path) {
  // One palette for the whole animation: its colours when there are at most 256, otherwise the
  // 6 x 7 x 6 cube (252 colours) each pixel goes to the nearest level of per channel.
  std::vector<uint32_t> palette;
  std::unordered_map<uint32_t, uint8_t> index;
  for (const auto& im : frames) {
    for (size_t p = 0; p + 2 < im.rgb.size() && palette.size() <= 256; p += 3) {
      const uint32_t k = rgb_key(&im.rgb[p]);
      if (index.count(k)) continue;
      index[k] = uint8_t(palette.size() & 0xff);
      palette.push_back(k);
    }
  }
  const bool exact = palette.size() <= 256;
  constexpr int kLevels[3] = {6, 7, 6};
  if (!exact) {
    palette.clear();
    for (int r = 0; r < kLevels[0]; ++r)
      for (int g = 0; g < kLevels[1]; ++g)
        for (int b = 0; b < kLevels[2]; ++b)
          palette.push_back((uint32_t(r * 255 / (kLevels[0] - 1)) << 16) | (uint32_t(g * 255 / (kLevels[1] - 1)) << 8) |
                            uint32_t(b * 255 / (kLevels[2] - 1)));
  }
  auto nearest = [&](uint8_t v, int c) { return int(std::lround(double(v) * (kLevels[c] - 1) / 255.0)); };
  write_frames(frames, fps, path, "write_gif", "gif", AV_CODEC_ID_GIF, AV_PIX_FMT_PAL8,
               [&](const Image& im, AVFrame* f) {
                 auto* pal = reinterpret_cast<uint32_t*>(f->data[1]);
                 for (size_t i = 0; i < 256; ++i) pal[i] = 0xff000000u | (i < palette.size() ? palette[i] : 0u);
                 for (int64_t y = 0; y < im.height; ++y)
                   for (int64_t x = 0; x < im.width; ++x) {
                     const uint8_t* p = &im.rgb[size_t((y * im.width + x) * 3)];
                     f->data[0][y * f->linesize[0] + x] =
                         exact ? index.at(rgb_key(p))
                               : uint8_t((nearest(p[0], 0) * kLevels[1] + nearest(p[1], 1)) * kLevels[2] +
                                         nearest(p[2], 2));
                   }
               });
}

}  // namespace lf::media

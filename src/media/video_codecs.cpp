// The video module, libloongforge_video.so: decoding and writing with FFmpeg's libraries, behind
// media/video.h (video.cpp loads it on first use through video_codecs.h's table). FFmpeg links
// ~130 libraries (codecs, TLS, SVG, ...); only a process that touches a video maps them.
#include "video_codecs.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavutil/log.h>
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
#include <mutex>

#include "loongforge/core/error.h"

namespace lf::media::codecs {
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

Image to_rgb(const AVFrame* frame, Sws& sws, RgbConversion conversion = RgbConversion::kAccurate) {
  Image img;
  img.height = frame->height;
  img.width = frame->width;
  img.rgb.resize(size_t(img.height * img.width * 3));
  // kPyAV: at the same size swscale then takes its unscaled YUV -> RGB path, whose chroma
  // upsampling and rounding differ from the accurate, fully interpolated one.
  const int flags = conversion == RgbConversion::kPyAV ? SWS_BILINEAR
                                                       : SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT;
  sws.ctx = sws_getCachedContext(sws.ctx, frame->width, frame->height, AVPixelFormat(frame->format), frame->width,
                                 frame->height, AV_PIX_FMT_RGB24, flags, nullptr, nullptr, nullptr);
  LF_CHECK(sws.ctx != nullptr, "video: cannot convert pixel format ",
           av_get_pix_fmt_name(AVPixelFormat(frame->format)), " to RGB");
  uint8_t* dst[4] = {img.rgb.data(), nullptr, nullptr, nullptr};
  int stride[4] = {int(img.width * 3), 0, 0, 0};
  sws_scale(sws.ctx, frame->data, frame->linesize, 0, frame->height, dst, stride);
  return img;
}

// An opened file with its best video stream's decoder.
struct Input {
  FormatIn in;
  Codec dec;
  int stream = -1;
  AVStream* st = nullptr;
};

void open_input(const std::string& path, Input& v) {
  // Some decoders (libdav1d) print a banner at FFmpeg's default level, info, on every open; a data
  // loader opens thousands of files. Quiet it unless the process chose a level itself.
  static std::once_flag quiet;
  std::call_once(quiet, [] {
    if (av_log_get_level() == AV_LOG_INFO) av_log_set_level(AV_LOG_ERROR);
  });
  int rc = avformat_open_input(&v.in.ctx, path.c_str(), nullptr, nullptr);
  if (rc < 0) {
    LF_FAIL("video ", path, ": cannot open (", av_message(rc), ")",
            lf::hint("check the path; the file must be a video FFmpeg can read"));
  }
  rc = avformat_find_stream_info(v.in.ctx, nullptr);
  if (rc < 0) LF_FAIL("video ", path, ": cannot read stream information (", av_message(rc), ")");
  const AVCodec* decoder = nullptr;
  v.stream = av_find_best_stream(v.in.ctx, AVMEDIA_TYPE_VIDEO, -1, -1, &decoder, 0);
  if (v.stream < 0 || !decoder) {
    LF_FAIL("video ", path, ": no decodable video stream (", av_message(v.stream), ")",
            lf::hint("re-encode the file with a common codec (H.264, VP9, AV1, FFV1, MJPEG)"));
  }
  v.st = v.in.ctx->streams[v.stream];
  v.dec.ctx = avcodec_alloc_context3(decoder);
  avcodec_parameters_to_context(v.dec.ctx, v.st->codecpar);
  v.dec.ctx->thread_count = 1;
  rc = avcodec_open2(v.dec.ctx, decoder, nullptr);
  if (rc < 0) LF_FAIL("video ", path, ": cannot open the ", decoder->name, " decoder (", av_message(rc), ")");
}

// Reads packets and decodes them, handing each frame to `on_frame` until it returns false or the
// stream ends (then the decoder is drained). `decoded` counts frames for messages.
void decode_frames(const std::string& path, Input& v, const std::function<bool(AVFrame*)>& on_frame) {
  Frame frame;
  Packet pkt;
  int64_t decoded = 0;
  bool more = true;
  auto drain = [&]() {
    while (more) {
      const int r = avcodec_receive_frame(v.dec.ctx, frame.f);
      if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return;
      if (r < 0) LF_FAIL("video ", path, ": decoding frame ", decoded, " failed (", av_message(r), ")");
      ++decoded;
      more = on_frame(frame.f);
      av_frame_unref(frame.f);
    }
  };
  int rc = 0;
  while (more && (rc = av_read_frame(v.in.ctx, pkt.p)) >= 0) {
    if (pkt.p->stream_index == v.stream) {
      const int r = avcodec_send_packet(v.dec.ctx, pkt.p);
      if (r < 0 && r != AVERROR(EAGAIN)) {
        av_packet_unref(pkt.p);
        LF_FAIL("video ", path, ": corrupt packet after frame ", decoded, " (", av_message(r), ")",
                lf::hint("re-encode or remove the file"));
      }
      drain();
    }
    av_packet_unref(pkt.p);
  }
  if (!more) return;
  if (rc != AVERROR_EOF) LF_FAIL("video ", path, ": read error after frame ", decoded, " (", av_message(rc), ")");
  avcodec_send_packet(v.dec.ctx, nullptr);
  drain();
}

}  // namespace

std::vector<Image> decode_video(const std::string& path, VideoInfo* info) {
  Input v;
  open_input(path, v);
  std::vector<Image> frames;
  Sws sws;
  decode_frames(path, v, [&](AVFrame* f) {
    frames.push_back(to_rgb(f, sws));
    return true;
  });
  if (frames.empty()) LF_FAIL("video ", path, ": no frames decoded", lf::hint("the file holds an empty video stream"));
  if (info) {
    const AVRational r = v.st->avg_frame_rate.num ? v.st->avg_frame_rate : v.st->r_frame_rate;
    info->fps = r.den ? av_q2d(r) : 0.0;
    info->total_frames = int64_t(frames.size());
  }
  return frames;
}

std::vector<Image> decode_video_at(const std::string& path, const std::vector<double>& timestamps, double tolerance_s,
                                   RgbConversion conversion, std::vector<double>* frame_pts) {
  LF_CHECK(!timestamps.empty(), "video ", path, ": no timestamps to decode");
  Input v;
  open_input(path, v);
  const double first = *std::min_element(timestamps.begin(), timestamps.end());
  const double last = *std::max_element(timestamps.begin(), timestamps.end());
  const AVRational tb = v.st->time_base;
  // PyAV's container.seek(round(first / time_base) - 1, backward=True, stream=stream): the
  // keyframe at or before one tick ahead of the first timestamp (round half to even, as Python).
  const int64_t target = int64_t(std::nearbyint(first * double(tb.den) / double(tb.num))) - 1;
  int rc = av_seek_frame(v.in.ctx, v.stream, target, AVSEEK_FLAG_BACKWARD);
  if (rc < 0) LF_FAIL("video ", path, ": cannot seek to ", first, " s (", av_message(rc), ")");
  avcodec_flush_buffers(v.dec.ctx);

  // torch.cdist over float32 tensors, then the first minimum: each timestamp keeps the nearest
  // frame so far (a strictly nearer later one replaces it), so only chosen frames stay in memory.
  const size_t n = timestamps.size();
  std::vector<float> query(n), best_d(n, INFINITY);
  for (size_t i = 0; i < n; ++i) query[i] = float(timestamps[i]);
  std::vector<double> best_pts(n, 0.0);
  std::vector<std::shared_ptr<AVFrame>> best(n);
  double first_pts = NAN, last_pts = NAN;
  decode_frames(path, v, [&](AVFrame* f) {
    if (f->pts == AV_NOPTS_VALUE) return true;  // PyAV skips frames without a pts
    // float(frame.pts * stream.time_base): an exact rational, rounded once.
    const double t = double(f->pts * tb.num) / double(tb.den);
    if (std::isnan(first_pts)) first_pts = t;
    last_pts = t;
    std::shared_ptr<AVFrame> shared;
    for (size_t i = 0; i < n; ++i) {
      const float d = std::fabs(query[i] - float(t));
      if (!(d < best_d[i])) continue;
      if (!shared) {
        shared.reset(av_frame_clone(f), [](AVFrame* p) { av_frame_free(&p); });
        LF_CHECK(shared != nullptr, "video ", path, ": out of memory");
      }
      best_d[i] = d, best[i] = shared, best_pts[i] = t;
    }
    return t < last;
  });
  if (std::isnan(first_pts)) {
    LF_FAIL("video ", path, ": no frame decoded in [", first, ", ", last, "] s",
            lf::hint("the video is shorter than its episode, or its timestamps are wrong"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (!(best_d[i] < float(tolerance_s))) {
      LF_FAIL("video ", path, ": no frame within ", tolerance_s, " s of timestamp ", timestamps[i], " s (nearest at ",
              best_pts[i], " s; frames decoded from ", first_pts, " to ", last_pts, " s)",
              lf::hint("the video is shorter than its episode or out of step with the data's timestamps; "
                       "re-encode the episode's video or drop the episode"));
    }
  }
  std::vector<Image> out;
  out.reserve(n);
  if (frame_pts) frame_pts->assign(best_pts.begin(), best_pts.end());
  Sws sws;
  for (size_t i = 0; i < n; ++i) out.push_back(to_rgb(best[i].get(), sws, conversion));
  return out;
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

}  // namespace lf::media::codecs

// The module's entry point (video_codecs.h: VideoCodecsFn).
extern "C" __attribute__((visibility("default"))) const lf::media::VideoCodecs* lf_video_codecs() {
  namespace c = lf::media::codecs;
  static const lf::media::VideoCodecs table{&c::decode_video, &c::decode_video_at, &c::write_video,
                                            &c::write_gif};
  return &table;
}

// Multimodal conversations: the line encoder's pieces (conversation normalisation, media loading)
// and the store reader (data/multimodal.h). The encoder itself runs in preprocess.cpp's pipeline.
#include "loongforge/data/multimodal.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loongforge/core/error.h"
#include "loongforge/data/chat_template.h"
#include "loongforge/data/indexed_dataset.h"
#include "loongforge/media/video.h"
#include "multimodal_internal.h"

namespace lf::data {
namespace mm {

namespace {

std::vector<std::string> path_list(const nlohmann::json& j, const char* key) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (it->is_string()) return {it->get<std::string>()};
  LF_CHECK(it->is_array(), "\"", key, "\" must be a path or a list of paths, not ", it->type_name());
  for (const auto& p : *it) {
    LF_CHECK(p.is_string(), "\"", key, "\" entries must be paths (strings), not ", p.type_name());
    out.push_back(p.get<std::string>());
  }
  return out;
}

// A string with <image> / <video> tags -> transformers' content list (a tagless string stays a string).
nlohmann::json split_tags(const std::string& text, std::vector<Medium>& order, std::vector<std::string>& images,
                          std::vector<std::string>& videos, size_t& next_image, size_t& next_video) {
  if (text.find("<image>") == std::string::npos && text.find("<video>") == std::string::npos) return text;
  nlohmann::json list = nlohmann::json::array();
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t i = text.find("<image>", pos), v = text.find("<video>", pos);
    const size_t at = std::min(i, v);
    if (at == std::string::npos) {
      list.push_back({{"type", "text"}, {"text", text.substr(pos)}});
      break;
    }
    if (at > pos) list.push_back({{"type", "text"}, {"text", text.substr(pos, at - pos)}});
    const bool image = at == i;
    if (image) {
      LF_CHECK(next_image < images.size(), "an <image> tag without an image (the sample lists ", images.size(),
               ")", lf::hint("list one path in \"images\" per <image> tag"));
      order.push_back({MediaRecord::kImage, images[next_image++]});
      list.push_back({{"type", "image"}});
    } else {
      LF_CHECK(next_video < videos.size(), "a <video> tag without a video (the sample lists ", videos.size(), ")",
               lf::hint("list one path in \"videos\" per <video> tag"));
      order.push_back({MediaRecord::kVideo, videos[next_video++]});
      list.push_back({{"type", "video"}});
    }
    pos = at + 7;  // both tags are 7 bytes
  }
  return list;
}

}  // namespace

Conversation normalise(const nlohmann::json& line) {
  Conversation c;
  std::vector<std::string> images = path_list(line, "images"), videos = path_list(line, "videos");
  for (const auto& p : path_list(line, "image")) images.push_back(p);
  for (const auto& p : path_list(line, "video")) videos.push_back(p);
  size_t next_image = 0, next_video = 0;
  nlohmann::json messages = nlohmann::json::array();
  if (line.contains("messages")) {
    LF_CHECK(line["messages"].is_array(), "\"messages\" must be a list");
    for (const auto& m : line["messages"]) {
      LF_CHECK(m.is_object() && m.contains("role") && m.contains("content"),
               "each message needs \"role\" and \"content\"");
      nlohmann::json out = m;
      if (m["content"].is_string()) {
        out["content"] = split_tags(m["content"].get<std::string>(), c.media, images, videos, next_image, next_video);
      } else if (m["content"].is_array()) {
        for (auto& e : out["content"]) {
          const std::string type = e.value("type", "");
          if (type != "image" && type != "video") continue;
          const bool image = type == "image";
          std::string path;
          for (const char* key : {"image", "video", "path", "url"})
            if (e.contains(key) && e[key].is_string()) path = e[key].get<std::string>();
          if (path.empty()) {
            auto& list = image ? images : videos;
            size_t& next = image ? next_image : next_video;
            LF_CHECK(next < list.size(), "a {\"type\": \"", type, "\"} entry without a path and none left in \"",
                     type, "s\"");
            path = list[next++];
          }
          c.media.push_back({image ? MediaRecord::kImage : MediaRecord::kVideo, path});
          e = nlohmann::json{{"type", type}};
        }
      }
      messages.push_back(out);
    }
  } else if (line.contains("conversations")) {
    LF_CHECK(line["conversations"].is_array(), "\"conversations\" must be a list");
    for (const auto& m : line["conversations"]) {
      LF_CHECK(m.is_object() && m.contains("from") && m.contains("value") && m["value"].is_string(),
               "each LLaVA turn needs \"from\" and a string \"value\"");
      const std::string from = m["from"].get<std::string>();
      std::string role = from == "human" || from == "user"        ? "user"
                         : from == "gpt" || from == "assistant"   ? "assistant"
                         : from == "system"                       ? "system"
                                                                  : "";
      LF_CHECK(!role.empty(), "a LLaVA turn from \"", from, "\" (expected human, gpt or system)");
      messages.push_back({{"role", role},
                          {"content", split_tags(m["value"].get<std::string>(), c.media, images, videos, next_image,
                                                 next_video)}});
    }
  } else {
    LF_FAIL("the line has neither \"messages\" nor \"conversations\"",
            lf::hint("e.g. {\"messages\": [{\"role\": \"user\", \"content\": \"<image>What is this?\"}, ...], "
                     "\"images\": [\"a.png\"]}"));
  }
  LF_CHECK(next_image == images.size() && next_video == videos.size(), "the sample lists ", images.size(),
           " image(s) and ", videos.size(), " video(s) but its messages place ", next_image, " and ", next_video,
           lf::hint("each medium needs an <image> / <video> tag (or a typed content entry) where it goes"));
  c.json = nlohmann::json{{"messages", messages}};
  if (line.contains("tools")) c.json["tools"] = line["tools"];
  return c;
}

MediaRecord load(const Medium& m, const std::string& root, const MultimodalOptions& o) {
  namespace fs = std::filesystem;
  const std::string path = fs::path(m.path).is_absolute() || root.empty() ? m.path : (fs::path(root) / m.path).string();
  MediaRecord r;
  r.kind = m.kind;
  if (m.kind == MediaRecord::kImage) {
    const lf::media::Image img = lf::media::decode_image(path);
    const auto [h, w] = lf::media::qwen_resized_size(img.height, img.width, o.image);
    r.images.push_back(lf::media::resize_bicubic(img, h, w));
    r.frames = 1;
    r.height = h;
    r.width = w;
    return r;
  }
  lf::media::VideoInfo info;
  const auto all = lf::media::decode_video(path, &info);
  const int64_t T = o.image.temporal_patch_size;
  const auto idx = lf::media::qwen_sample_frames(info.total_frames, info.fps, o.video_fps, o.video_min_frames,
                                                 o.video_max_frames, T);
  lf::media::QwenVisionPreprocess vp = o.image;
  vp.min_pixels = o.video_min_pixels;
  vp.max_pixels = o.video_max_pixels;
  const auto [h, w] = lf::media::qwen_resized_size(all[0].height, all[0].width, vp);
  for (int64_t k : idx) r.images.push_back(lf::media::resize_bicubic(all[size_t(k)], h, w));
  r.frames = int64_t(r.images.size());
  r.height = h;
  r.width = w;
  // The sampled frames' rate: n frames over the video's duration (the requested fps when kept all).
  const double sampled_fps = o.video_fps > 0 && info.fps > 0
                                 ? double(r.frames) / (double(info.total_frames) / info.fps)
                                 : (info.fps > 0 ? info.fps : 1.0);
  r.seconds_per_grid = float(double(T) / sampled_fps);
  return r;
}

int64_t placeholders(const MediaRecord& r, const lf::media::QwenVisionPreprocess& p) {
  const int64_t T = p.temporal_patch_size, gt = (r.frames + T - 1) / T;
  return gt * (r.height / p.patch_size) * (r.width / p.patch_size) / (p.merge_size * p.merge_size);
}

std::string info_json(const MultimodalOptions& o, int64_t image_token_id, int64_t video_token_id) {
  nlohmann::json j;
  j["format"] = "loongforge-multimodal-1";
  j["patch_size"] = o.image.patch_size;
  j["temporal_patch_size"] = o.image.temporal_patch_size;
  j["merge_size"] = o.image.merge_size;
  j["image_mean"] = o.image.image_mean;
  j["image_std"] = o.image.image_std;
  j["min_pixels"] = o.image.min_pixels;
  j["max_pixels"] = o.image.max_pixels;
  j["video_min_pixels"] = o.video_min_pixels;
  j["video_max_pixels"] = o.video_max_pixels;
  j["video_fps"] = o.video_fps;
  j["image_token"] = o.image_token;
  j["video_token"] = o.video_token;
  j["image_token_id"] = image_token_id;
  j["video_token_id"] = video_token_id;
  return j.dump(1);
}

}  // namespace mm

namespace {
std::string part(const std::string& prefix, const char* key) { return preprocess_output_prefix(prefix, key); }
}  // namespace

MultimodalSample render_multimodal(std::string_view line_json, const ChatTemplate& chat_template, Tokenizer& tokenizer,
                                   const MultimodalOptions& o, const std::string& root, int32_t image_token_id,
                                   int32_t video_token_id, bool add_generation_prompt) {
  nlohmann::json line;
  try {
    line = nlohmann::json::parse(line_json);
  } catch (const nlohmann::json::exception& e) {
    LF_FAIL("malformed JSON line: ", e.what());
  }
  LF_CHECK(line.is_object(), "the line is JSON but not an object");
  const mm::Conversation conv = mm::normalise(line);
  const ChatTokens t = chat_template.tokenize(conv.json.dump(), add_generation_prompt, tokenizer);
  MultimodalSample out;
  for (size_t k = 0; k < conv.media.size(); ++k) {
    try {
      out.media.push_back(mm::load(conv.media[k], root, o));
    } catch (const lf::Error& e) {
      LF_FAIL("medium ", k, " (", conv.media[k].path, "): ", e.message(),
              e.hint().empty() ? lf::hint("fix or drop this sample") : lf::hint(e.hint()));
    }
  }
  size_t next = 0;
  for (size_t p = 0; p < t.input_ids.size(); ++p) {
    const int32_t id = t.input_ids[p];
    const bool image = id == image_token_id, video = id == video_token_id;
    if (!image && !video) {
      out.tokens.push_back(id);
      out.mask.push_back(t.assistant_masks[p]);
      continue;
    }
    LF_CHECK(next < out.media.size(), "the chat template rendered more media placeholders than the sample's ",
             out.media.size(), " media",
             lf::hint("the conversation's text holds a literal " + o.image_token + " / " + o.video_token + "; remove it"));
    const MediaRecord& r = out.media[next];
    LF_CHECK((r.kind == MediaRecord::kImage) == image, "medium ", next, " (", conv.media[next].path, ") is ",
             image ? "a video" : "an image", " but the template placed ", image ? o.image_token : o.video_token,
             " there");
    const int64_t n = mm::placeholders(r, o.image);
    out.tokens.insert(out.tokens.end(), size_t(n), id);
    out.mask.insert(out.mask.end(), size_t(n), 0);
    ++next;
  }
  LF_CHECK(next == out.media.size(), "the chat template rendered ", next, " media placeholders for the sample's ",
           out.media.size(), " media",
           lf::hint("the template must render " + o.image_token + " for {\"type\": \"image\"} content entries "
                    "(Qwen-VL's does); is this a vision-language model's tokenizer directory?"));
  return out;
}

bool MultimodalDataset::exists(const std::string& prefix) {
  return std::filesystem::exists(prefix + "_media.json") && std::filesystem::exists(idx_path(part(prefix, "media_meta")));
}

MultimodalDataset::MultimodalDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string sidecar = prefix + "_media.json";
  std::ifstream in(sidecar);
  LF_CHECK(in.good(), "multimodal store ", prefix, ": ", sidecar, " is missing",
           lf::hint("the store comes from `loongforge-data preprocess --multimodal`"));
  nlohmann::json j;
  try {
    in >> j;
    LF_CHECK(j.value("format", "") == "loongforge-multimodal-1", sidecar, ": unknown format ", j.value("format", ""));
    info_.vision.patch_size = j.at("patch_size");
    info_.vision.temporal_patch_size = j.at("temporal_patch_size");
    info_.vision.merge_size = j.at("merge_size");
    info_.vision.image_mean = j.at("image_mean");
    info_.vision.image_std = j.at("image_std");
    info_.vision.min_pixels = j.at("min_pixels");
    info_.vision.max_pixels = j.at("max_pixels");
    info_.image_token_id = j.at("image_token_id");
    info_.video_token_id = j.at("video_token_id");
  } catch (const nlohmann::json::exception& e) {
    LF_FAIL(sidecar, ": malformed (", e.what(), ")", lf::hint("rerun `loongforge-data preprocess --multimodal`"));
  }
  tokens_ = std::make_unique<IndexedDataset>(part(prefix, "input_ids"));
  masks_ = std::make_unique<IndexedDataset>(part(prefix, "assistant_masks"));
  meta_ = std::make_unique<IndexedDataset>(part(prefix, "media_meta"));
  pixels_ = std::make_unique<IndexedDataset>(part(prefix, "media_pixels"));
  const std::string fix = "the parts come from one `loongforge-data preprocess --multimodal` run; rerun it";
  for (const auto* d : {masks_.get(), meta_.get(), pixels_.get()})
    LF_CHECK(d->num_sequences() == tokens_->num_sequences(), idx_path(d->prefix()), " holds ", d->num_sequences(),
             " samples but ", idx_path(tokens_->prefix()), " holds ", tokens_->num_sequences(), lf::hint(fix));
  LF_CHECK(masks_->dtype() == TokenDType::u8 && pixels_->dtype() == TokenDType::u8 && meta_->dtype() == TokenDType::i32,
           "multimodal store ", prefix, ": unexpected part dtypes", lf::hint(fix));
}

MultimodalDataset::~MultimodalDataset() = default;

int64_t MultimodalDataset::size() const { return tokens_->num_sequences(); }

int64_t MultimodalDataset::length(int64_t i) const {
  LF_CHECK(i >= 0 && i < size(), prefix_, ": sample ", i, " out of range [0, ", size(), ")");
  return tokens_->sequence_length(i);
}

void MultimodalDataset::read_text(int64_t i, std::vector<int32_t>& tokens, std::vector<uint8_t>& mask) const {
  const int64_t n = length(i);
  std::vector<int64_t> buf(static_cast<size_t>(n));
  tokens_->read(i, 0, n, buf.data());
  tokens.assign(buf.begin(), buf.end());
  LF_CHECK(masks_->sequence_length(i) == n, idx_path(masks_->prefix()), ": sample ", i, " mask length differs");
  masks_->read(i, 0, n, buf.data());
  mask.assign(buf.begin(), buf.end());
}

MultimodalSample MultimodalDataset::read(int64_t i) const {
  MultimodalSample s;
  read_text(i, s.tokens, s.mask);
  const int64_t metas = meta_->sequence_length(i);
  LF_CHECK(metas % 5 == 0, idx_path(meta_->prefix()), ": sample ", i, " has ", metas, " values, not 5 per medium");
  std::vector<int64_t> meta(static_cast<size_t>(metas));
  meta_->read(i, 0, metas, meta.data());
  const int64_t bytes = pixels_->sequence_length(i);
  std::vector<int64_t> px(static_cast<size_t>(bytes));
  pixels_->read(i, 0, bytes, px.data());
  int64_t off = 0;
  for (int64_t k = 0; k < metas; k += 5) {
    MediaRecord r;
    r.kind = meta[size_t(k)] == 1 ? MediaRecord::kVideo : MediaRecord::kImage;
    r.frames = meta[size_t(k + 1)];
    r.height = meta[size_t(k + 2)];
    r.width = meta[size_t(k + 3)];
    const int32_t bits = int32_t(meta[size_t(k + 4)]);
    std::memcpy(&r.seconds_per_grid, &bits, 4);
    const int64_t frame = r.height * r.width * 3;
    LF_CHECK(r.frames > 0 && frame > 0 && off + r.frames * frame <= bytes, idx_path(pixels_->prefix()), ": sample ",
             i, " medium ", k / 5, " (", r.frames, " x ", r.height, "x", r.width, ") overruns its ", bytes, " bytes");
    for (int64_t f = 0; f < r.frames; ++f) {
      lf::media::Image im{r.height, r.width, std::vector<uint8_t>(size_t(frame))};
      for (int64_t b = 0; b < frame; ++b) im.rgb[size_t(b)] = uint8_t(px[size_t(off + b)]);
      off += frame;
      r.images.push_back(std::move(im));
    }
    s.media.push_back(std::move(r));
  }
  LF_CHECK(off == bytes, idx_path(pixels_->prefix()), ": sample ", i, " has ", bytes - off, " bytes beyond its media");
  return s;
}

}  // namespace lf::data

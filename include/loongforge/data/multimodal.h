// Multimodal conversations for VLM training: `loongforge-data preprocess --multimodal` turns a
// JSONL of conversations with media (LLaVA / ShareGPT style) into a store of tokens, answer masks
// and media, and MultimodalDataset reads it back. The media are decoded, checked and resized once
// (Qwen's smart resize, Pillow's bicubic: media/qwen_vision_input.h); the trainer normalises and
// cuts them into patch rows. Layout (docs/data.md, "Multimodal conversations"):
//   <prefix>_input_ids_document       tokens, each medium's placeholder expanded to t h w / merge^2
//   <prefix>_assistant_masks_document uint8, 1 = answer token (0 on every placeholder)
//   <prefix>_media_meta_document      int32, 5 per medium: kind (0 image, 1 video), frames, height,
//                                     width, seconds per temporal grid step (float32 bits)
//   <prefix>_media_pixels_document    uint8, the media's resized RGB frames back to back
//   <prefix>_media.json               the preprocessing settings (patch, merge, mean, std, token ids)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/data/preprocess.h"
#include "loongforge/media/qwen_vision_input.h"

namespace lf::data {

class ChatTemplate;
class IndexedDataset;

struct MultimodalOptions {
  std::string media_root;  // relative media paths resolve here ("": the input file's directory)
  lf::media::QwenVisionPreprocess image;  // images: patch / merge / temporal sizes, pixel bounds, mean / std
  // Videos: the same patch sizes and normalisation as images, their own pixel bounds per frame
  // (transformers' Qwen2VLVideoProcessor: 128 x 28 x 28 .. 768 x 28 x 28).
  int64_t video_min_pixels = 128 * 28 * 28, video_max_pixels = 768 * 28 * 28;
  double video_fps = 2.0;  // frames sampled per second (<= 0: every frame)
  int64_t video_min_frames = 4, video_max_frames = 768;
  std::string image_token = "<|image_pad|>", video_token = "<|video_pad|>";
};

// One line: {"messages": [{"role", "content"}...], "images": [...], "videos": [...]} (content a
// string with <image> / <video> tags, or transformers' list of {"type": "text" | "image" |
// "video", ...} entries, an entry's path under "image" / "video" / "path" or taken from the
// lists in order), or LLaVA's {"conversations": [{"from": "human" | "gpt" | "system", "value"}],
// "image": path or [paths], "video": ...}. The chat template must render one image_token /
// video_token per medium (as Qwen-VL's does for {"type": "image"} entries). Errors name the file,
// the line (sample) and the medium: a missing or undecodable file, tags that do not match the
// media, a template that drops placeholders.
PreprocessStats preprocess_multimodal(const PreprocessOptions& options, const Tokenizer& tokenizer,
                                      const ChatTemplate& chat_template, const MultimodalOptions& media);

struct MediaRecord {
  enum Kind : int32_t { kImage = 0, kVideo = 1 };
  Kind kind = kImage;
  int64_t frames = 1, height = 0, width = 0;  // resized
  float seconds_per_grid = 0;                 // videos: seconds per temporal_patch_size frames
  std::vector<lf::media::Image> images;       // the frames
};

struct MultimodalSample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<MediaRecord> media;  // in placeholder order
};

// One conversation line rendered as preprocess --multimodal renders it (the template, media loaded
// and resized, placeholders expanded, answer mask): also what generation and evaluation feed a
// VLM. `root` resolves relative media paths; the placeholder ids are the tokenizer's. Errors carry
// no file or line (callers add them).
MultimodalSample render_multimodal(std::string_view line_json, const ChatTemplate& chat_template, Tokenizer& tokenizer,
                                   const MultimodalOptions& options, const std::string& root, int32_t image_token_id,
                                   int32_t video_token_id, bool add_generation_prompt);

// <prefix>_media.json
struct MultimodalStoreInfo {
  lf::media::QwenVisionPreprocess vision;  // patch sizes and mean / std (pixel bounds as preprocessed)
  int64_t image_token_id = -1, video_token_id = -1;
};

class MultimodalDataset {
 public:
  // Throws lf::Error naming the file when a part is missing, malformed or inconsistent.
  explicit MultimodalDataset(const std::string& prefix);
  ~MultimodalDataset();
  static bool exists(const std::string& prefix);  // the media parts are there

  int64_t size() const;
  int64_t length(int64_t i) const;  // tokens of sample i
  MultimodalSample read(int64_t i) const;
  // Only sample i's tokens and mask (no media read): what a batch's token rows need.
  void read_text(int64_t i, std::vector<int32_t>& tokens, std::vector<uint8_t>& mask) const;
  const MultimodalStoreInfo& info() const { return info_; }

 private:
  std::string prefix_;
  std::unique_ptr<IndexedDataset> tokens_, masks_, meta_, pixels_;
  MultimodalStoreInfo info_;
};

}  // namespace lf::data

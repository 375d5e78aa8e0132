// The multimodal encoder's pieces shared by preprocess.cpp and multimodal.cpp (not installed).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loongforge/data/multimodal.h"

namespace lf::data::mm {

struct Medium {
  MediaRecord::Kind kind;
  std::string path;
};

struct Conversation {
  nlohmann::json json;        // {"messages": [...]} with media as {"type": "image" | "video"} entries
  std::vector<Medium> media;  // in the order the messages place them
};

// A JSONL line (messages or LLaVA conversations, tags or typed entries) -> the template's input.
Conversation normalise(const nlohmann::json& line);
// Decodes, samples (videos) and resizes one medium; `root` resolves relative paths.
MediaRecord load(const Medium& m, const std::string& root, const MultimodalOptions& o);
// Placeholder tokens the medium takes.
int64_t placeholders(const MediaRecord& r, const lf::media::QwenVisionPreprocess& p);
// <prefix>_media.json's text.
std::string info_json(const MultimodalOptions& o, int64_t image_token_id, int64_t video_token_id);

}  // namespace lf::data::mm

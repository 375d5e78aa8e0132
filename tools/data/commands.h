// Subcommands of loongforge-data that are more than a call into the data library. Not a public
// API: the library (include/loongforge/data) is what other programs use.
#pragma once

#include <cstdint>
#include <string>

#include "loongforge/data/chat_template.h"

namespace lf::data::tools {

struct InspectOptions {
  std::string prefix;
  std::string tokenizer_type, tokenizer_model;  // empty type: show ids only
  int64_t vocab_size = -1;                      // -1: the tokenizer's, or no check
  int64_t sample = 0;
  int64_t max_tokens = 64;
};

// Prints counts, dtype, the sequence-length histogram and one sample; returns the exit code.
int run_inspect(const InspectOptions& options);

struct RenderChatOptions {
  std::string tokenizer_model, input, output;
  bool add_generation_prompt = false;
  std::string chat_template_kwargs;  // JSON object, empty: none
  std::string chat_template_name;    // empty: transformers' default choice
};

// render-chat: one {"input_ids", "assistant_masks"} line per conversation line.
int run_render_chat(const RenderChatOptions& options);
// The chat template of a tokenizer directory with --chat-template-kwargs applied.
ChatTemplate load_chat_template(const std::string& dir, const std::string& name, const std::string& kwargs);

struct DemoVlmOptions {
  std::string out;
  uint64_t seed = 1;
  int64_t train_images = 1200, eval_images = 100;
};

// make-demo-vlm: synthetic shape images, attribute questions, a held-out set and its image-ablated
// twin, and a tokenizer directory for them (tools/data/demo_vlm.cpp).
int run_make_demo_vlm(const DemoVlmOptions& options);

}  // namespace lf::data::tools

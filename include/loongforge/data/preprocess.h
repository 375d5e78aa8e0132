// Preprocessing: a jsonl corpus -> Megatron indexed datasets, one per JSON key
// (<output_prefix>_<key>_document.{bin,idx}, Megatron's naming), tokenized by N worker threads;
// or conversations rendered with a chat template into tokens and assistant masks. The output is
// byte-identical for any worker count. Not a shuffler or a deduplicator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/data/tokenizer.h"

namespace lf::data {

class ChatTemplate;

struct PreprocessOptions {
  std::string input;                         // .jsonl, one JSON object per line
  std::vector<std::string> json_keys{"text"};
  std::string output_prefix;
  bool append_eod = false;                   // end every document with the tokenizer's eod id
  int workers = 1;
  int64_t chunk_bytes = 1 << 20;             // lines are handed to workers in chunks this big
  double log_interval_s = 10;                // progress lines (0: none)
};

struct PreprocessStats {
  struct Worker {
    int64_t chunks = 0, bytes = 0;
    double busy_s = 0;
  };
  int64_t lines = 0, documents = 0, empty_skipped = 0, input_bytes = 0;
  std::vector<int64_t> tokens;               // per key
  std::vector<std::string> output_prefixes;  // per key
  std::vector<Worker> workers;
  double seconds = 0;
};

// Throws lf::Error naming the file and line for malformed JSON, a missing or non-string key,
// invalid UTF-8, and a tokenizer without an eod when append_eod is set.
PreprocessStats preprocess_jsonl(const PreprocessOptions& options, const Tokenizer& tokenizer);

// Conversations: each line {"messages": [...], "tools": [...]} becomes one document in
// <prefix>_input_ids_document (the rendered conversation's tokens, dtype by vocabulary) and one
// of equal length in <prefix>_assistant_masks_document (uint8, 1 = answer token), exactly
// ChatTemplate::tokenize(line, add_generation_prompt=false). json_keys and append_eod do not
// apply. Errors name the file and line (malformed JSON, no messages, a template error).
PreprocessStats preprocess_conversations(const PreprocessOptions& options, const Tokenizer& tokenizer,
                                         const ChatTemplate& chat_template);

// <prefix>_<key>_document
std::string preprocess_output_prefix(const std::string& prefix, const std::string& key);

}  // namespace lf::data

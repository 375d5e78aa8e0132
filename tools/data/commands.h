// Subcommands of loongforge-data that are more than a call into the data library. Not a public
// API: the library (include/loongforge/data) is what other programs use.
#pragma once

#include <cstdint>
#include <string>

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

}  // namespace lf::data::tools

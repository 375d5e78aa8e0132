// The word-table text encoder of small diffusion demos: a caption is split on spaces (lower-cased,
// punctuation dropped) and each word looks up its row of a fixed [words, dim] table, padded with
// zero rows to max_length (as Wan pads its UMT5 embeddings with zeros to 512). Real models use
// text embeddings computed offline (diffusers' UMT5 encoder) instead. File: one safetensors with
// tensor "embeddings" [words, dim] (fp32) and metadata "words" (a JSON list, in row order) and
// "max_length".
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lf::data {

class TextTable {
 public:
  // A table of `words` with rows drawn N(0, 1) from `seed` (fixed per word order and seed).
  static TextTable random(std::vector<std::string> words, int64_t dim, int64_t max_length, uint64_t seed);
  // Reads `path`; throws naming it when malformed.
  static TextTable read(const std::string& path);
  void write(const std::string& path) const;

  // [max_length, dim] fp32. Throws naming the word (and the table's words) when one is unknown
  // and the caption when it has more than max_length words.
  at::Tensor encode(const std::string& caption) const;
  // The caption's words as encode() reads them.
  static std::vector<std::string> words_of(const std::string& caption);

  const std::vector<std::string>& words() const { return words_; }
  int64_t dim() const;
  int64_t max_length() const { return max_length_; }

 private:
  std::vector<std::string> words_;
  at::Tensor embeddings_;  // [words, dim]
  int64_t max_length_ = 0;
  std::string source_;
};

}  // namespace lf::data

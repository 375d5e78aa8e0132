// HfBpeTokenizer: Hugging Face tokenizer.json BPE. Byte-level BPE as LLaMA-3, Qwen and GPT-2 use
// it: added/special tokens split out first (leftmost-longest), normalizer (none or NFC), Split regex
// pre-tokenizers (PCRE2, UTF+UCP) and ByteLevel, BPE merges ("a b" or ["a","b"]) with
// ignore_merges, ByteLevel decoding. SentencePiece-style BPE as Gemma / PaliGemma and LLaMA-2's
// converted files use it: Replace / Prepend normalizers, Split MergedWithPrevious, merges over
// characters with byte_fallback (<0xXX>) and unk / fuse_unk, decoders Replace, ByteFallback,
// Fuse, Strip. Not Unigram/WordPiece; encode() adds no post-processor tokens (BOS/EOS are the
// caller's choice), encode_with_special_tokens() adds the TemplateProcessing ones as HF's
// add_special_tokens=True does. Unsupported parts are errors naming them.
#pragma once

#include <memory>
#include <string>

#include "loongforge/data/tokenizer.h"

namespace lf::data {

namespace detail {
struct BpeModel;       // immutable, shared by clones
struct EncoderState;   // per-instance cache and regex match data
}  // namespace detail

class HfBpeTokenizer final : public Tokenizer {
 public:
  // path: a tokenizer.json, or a directory with one. The end-of-document token is the
  // eos_token of a tokenizer_config.json beside it, else the first of <|endoftext|>,
  // <|end_of_text|>, </s>, <eos> that exists.
  explicit HfBpeTokenizer(const std::string& path);
  ~HfBpeTokenizer() override;

  void encode_into(std::string_view text, std::vector<int32_t>& out) override;
  // Offsets in text: a BPE token covers its decoded bytes (inside a run that NFC rewrote, the
  // tokens of the run cover the whole run). Throws when the tokens do not cover the text byte for
  // byte (ByteLevel add_prefix_space, or bytes missing from the vocabulary).
  void encode_with_offsets(std::string_view text, std::vector<int32_t>& out,
                           std::vector<ByteSpan>& spans) override;
  std::optional<std::string> added_token_content(int32_t id) const override;
  // Special tokens are kept (as HF's decode(ids, skip_special_tokens=False)); invalid UTF-8 from
  // partial byte tokens becomes U+FFFD, as HF does.
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;
  std::optional<int32_t> eod_id() const override;
  std::unique_ptr<Tokenizer> clone() const override;
  std::string describe() const override;

  std::optional<int32_t> token_to_id(const std::string& token) const;  // vocab or added token
  // HF's encode(text, add_special_tokens=True): the post-processor's single template around
  // encode(text) (Gemma: <bos> first). An error naming the file for a post-processor other than
  // TemplateProcessing / ByteLevel. With max_length (HF's truncation=True, max_length=N): the
  // text's ids are cut so that the template's tokens, suffix included, and the text fit in N; N
  // below the template's own tokens is an error (HF would return the whole text then).
  std::vector<int32_t> encode_with_special_tokens(std::string_view text,
                                                  std::optional<int64_t> max_length = std::nullopt);

 private:
  HfBpeTokenizer(std::shared_ptr<const detail::BpeModel> model);
  // encode_with_offsets for SentencePiece-style tokenizers and Replace / Prepend normalizers.
  void encode_with_offsets_aligned(std::string_view text, std::vector<int32_t>& out, std::vector<ByteSpan>& spans);
  std::shared_ptr<const detail::BpeModel> model_;
  std::unique_ptr<detail::EncoderState> state_;
};

}  // namespace lf::data

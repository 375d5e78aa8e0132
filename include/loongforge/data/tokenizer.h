// Tokenizers behind one interface: the HF tokenizer.json byte-level BPE (hf_bpe_tokenizer.h) and
// a byte tokenizer that needs no files. Text in and out is UTF-8. Not a chat template
// (chat_template.h) or a padding/truncation policy: the data pipeline works on raw id streams.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lf::data {

// A token's bytes [begin, end) in the text it was encoded from.
struct ByteSpan {
  size_t begin = 0, end = 0;
  bool operator==(const ByteSpan&) const = default;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of text to out. Not const: encoders keep a cache, so an instance serves one
  // thread at a time; clone() one per thread (clones share the immutable model).
  virtual void encode_into(std::string_view text, std::vector<int32_t>& out) = 0;
  // encode_into that also appends each token's byte range in text to spans, as HF's offsets
  // (in bytes): a byte-level token covers its bytes, a SentencePiece-style one the characters it
  // was normalized from (a byte-fallback token its whole character), an added token its content
  // (chat masks map template spans to tokens).
  virtual void encode_with_offsets(std::string_view text, std::vector<int32_t>& out,
                                   std::vector<ByteSpan>& spans) = 0;
  // The content of an added (special or not) token id, nullopt for a vocabulary token.
  virtual std::optional<std::string> added_token_content(int32_t id) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // One past the largest id (added tokens included): the dataset dtype is chosen from it.
  virtual int64_t vocab_size() const = 0;
  // End-of-document id appended by --append-eod; nullopt when the tokenizer has none.
  virtual std::optional<int32_t> eod_id() const = 0;
  virtual std::unique_ptr<Tokenizer> clone() const = 0;
  virtual std::string describe() const = 0;

  std::vector<int32_t> encode(std::string_view text) {
    std::vector<int32_t> out;
    encode_into(text, out);
    return out;
  }
};

// Bytes are ids 0..255; id 256 is the end-of-document token, so vocab_size() is 257. decode
// renders id 256 as "<|endoftext|>".
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEod = 256;
  void encode_into(std::string_view text, std::vector<int32_t>& out) override;
  void encode_with_offsets(std::string_view text, std::vector<int32_t>& out,
                           std::vector<ByteSpan>& spans) override;
  std::optional<std::string> added_token_content(int32_t) const override { return std::nullopt; }
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return 257; }
  std::optional<int32_t> eod_id() const override { return kEod; }
  std::unique_ptr<Tokenizer> clone() const override { return std::make_unique<ByteTokenizer>(); }
  std::string describe() const override { return "ByteTokenizer (257 ids: 256 bytes + eod)"; }
};

// By --tokenizer-type: "ByteTokenizer" (or "byte"; model ignored) or "HuggingFaceTokenizer"
// (or "hf"; model = a tokenizer.json or a directory holding one). Throws on an unknown type,
// listing the known ones.
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view type, const std::string& model);

}  // namespace lf::data

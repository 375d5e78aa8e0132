// Megatron's indexed dataset (<prefix>.idx + <prefix>.bin), read through mmap and written
// byte-compatibly with Megatron-LM. Not a sampler: GPT samples are cut from it by gpt_dataset.h.
//
// .idx layout (little endian, no padding):
//   "MMIDIDX\0\0" | u64 version=1 | u8 dtype code | u64 S (sequences) | u64 D (document entries)
//   | i32 lengths[S] | i64 byte pointers[S] (into .bin) | i64 document_indices[D]
// document_indices[0] == 0; entry k+1 is one past the last sequence of document k, so D is the
// number of documents + 1 and document_indices[D-1] == S. .bin holds the tokens, nothing else.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loongforge/data/sequence_source.h"

namespace lf::data {

// Megatron's dtype codes (the byte after the version in .idx).
enum class TokenDType : uint8_t {
  u8 = 1, i8 = 2, i16 = 3, i32 = 4, i64 = 5, f64 = 6, f32 = 7, u16 = 8,
};
int64_t dtype_size(TokenDType dtype);
std::string_view dtype_name(TokenDType dtype);
// uint16 when every id fits (vocab_size < 65500, Megatron's threshold), else int32.
TokenDType optimal_dtype(int64_t vocab_size);

inline std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
inline std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

}  // namespace lf::data
namespace lf {
class MappedFile;
}  // namespace lf
namespace lf::data {

class IndexedDataset final : public SequenceSource {
 public:
  // Maps <prefix>.idx and <prefix>.bin and validates the header, sizes, pointers and document
  // indices (throws lf::Error naming the file and the bad value). Tokens are not scanned; see
  // validate_tokens.
  explicit IndexedDataset(std::string prefix);
  ~IndexedDataset() override;

  int64_t num_sequences() const override { return num_sequences_; }
  int64_t sequence_length(int64_t i) const override;
  void read(int64_t i, int64_t offset, int64_t count, int64_t* out) const override;
  std::string id() const override { return prefix_; }

  // Number of documents (document_indices has one more entry).
  int64_t num_documents() const { return num_doc_entries_ - 1; }
  int64_t sequence_pointer(int64_t i) const;  // byte offset in .bin
  int64_t document_index(int64_t k) const;    // raw entry k of document_indices, k < D
  TokenDType dtype() const { return dtype_; }
  int64_t total_tokens() const { return total_tokens_; }
  const std::string& prefix() const { return prefix_; }

  // Scans every token and throws on the first id outside [0, vocab_size), naming the file, the
  // sequence, the position and the value.
  void validate_tokens(int64_t vocab_size) const;

 private:
  std::string prefix_;
  std::unique_ptr<lf::MappedFile> idx_, bin_;
  TokenDType dtype_{};
  int64_t num_sequences_ = 0, num_doc_entries_ = 0, total_tokens_ = 0;
  const unsigned char* lengths_ = nullptr;   // i32[S], possibly unaligned
  const unsigned char* pointers_ = nullptr;  // i64[S]
  const unsigned char* docs_ = nullptr;      // i64[D]
};

// Writes <prefix>.bin while sequences arrive and <prefix>.idx on finalize(), as Megatron's
// IndexedDatasetBuilder does. Tokens are range-checked against the dtype and, when given, the
// vocabulary size.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(std::string prefix, TokenDType dtype, int64_t vocab_size = -1);
  ~IndexedDatasetBuilder();

  void add_sequence(std::span<const int32_t> tokens);  // Megatron's add_item
  void end_document();
  // Sequences of the given lengths (summing to tokens.size()), then end_document().
  void add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths);
  // Appends every sequence and document of another dataset with the same dtype.
  void add_index(const std::string& other_prefix);
  void finalize();  // writes .idx; the builder is then closed

  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(doc_indices_.size()) - 1; }

 private:
  void write_tokens(std::span<const int32_t> tokens);

  std::string prefix_;
  TokenDType dtype_;
  int64_t vocab_size_;
  std::ofstream bin_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_indices_{0};
  std::vector<char> scratch_;
  bool finalized_ = false;
};

}  // namespace lf::data

// Megatron indexed dataset: validating mmap reader and byte-compatible writer.
#include "loongforge/data/indexed_dataset.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "loongforge/core/error.h"
#include "loongforge/core/mapped_file.h"

namespace lf::data {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr int64_t kHeaderSize = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, S, D

template <class T>
T load(const unsigned char* p) {  // the arrays in .idx are not aligned to their element size
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

bool known_dtype(uint8_t code) { return code >= 1 && code <= 8; }

template <class T>
void convert(const unsigned char* src, int64_t count, int64_t* out) {
  for (int64_t j = 0; j < count; ++j) out[j] = static_cast<int64_t>(load<T>(src + j * sizeof(T)));
}

}  // namespace

int64_t dtype_size(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::u8: case TokenDType::i8: return 1;
    case TokenDType::i16: case TokenDType::u16: return 2;
    case TokenDType::i32: case TokenDType::f32: return 4;
    case TokenDType::i64: case TokenDType::f64: return 8;
  }
  LF_FAIL("unknown dtype code ", static_cast<int>(dtype));
}

std::string_view dtype_name(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::u8: return "uint8";
    case TokenDType::i8: return "int8";
    case TokenDType::i16: return "int16";
    case TokenDType::i32: return "int32";
    case TokenDType::i64: return "int64";
    case TokenDType::f64: return "float64";
    case TokenDType::f32: return "float32";
    case TokenDType::u16: return "uint16";
  }
  return "unknown";
}

TokenDType optimal_dtype(int64_t vocab_size) {
  return vocab_size >= 0 && vocab_size < 65500 ? TokenDType::u16 : TokenDType::i32;
}

// ---------------------------------------------------------------------------------------------
// Reader

IndexedDataset::IndexedDataset(std::string prefix) : prefix_(std::move(prefix)) {
  idx_ = std::make_unique<lf::MappedFile>(idx_path(prefix_));
  const std::string& ip = idx_->path();
  const unsigned char* p = idx_->data();
  int64_t n = idx_->size();
  LF_CHECK(n >= kHeaderSize, ip, ": ", n, " bytes is shorter than the ", kHeaderSize,
           "-byte header", lf::hint("the file is truncated or not a Megatron .idx"));
  LF_CHECK(std::memcmp(p, kMagic, 9) == 0, ip, ": bad magic (expected \"MMIDIDX\\0\\0\")",
           lf::hint("not a Megatron indexed dataset index (the old lazy/cached formats are not "
                    "supported; re-run preprocessing)"));
  uint64_t version = load<uint64_t>(p + 9);
  LF_CHECK(version == kVersion, ip, ": index version ", version, ", expected ", kVersion);
  uint8_t code = p[17];
  LF_CHECK(known_dtype(code), ip, ": unknown dtype code ", static_cast<int>(code),
           lf::hint("codes are 1..8 (uint8 int8 int16 int32 int64 float64 float32 uint16)"));
  dtype_ = static_cast<TokenDType>(code);
  uint64_t s = load<uint64_t>(p + 18), d = load<uint64_t>(p + 26);
  // Bound the counts before multiplying so a garbage header cannot overflow the size check.
  LF_CHECK(s <= static_cast<uint64_t>(n) && d <= static_cast<uint64_t>(n), ip, ": sequence count ",
           s, " / document count ", d, " cannot fit in a ", n, "-byte file");
  num_sequences_ = static_cast<int64_t>(s);
  num_doc_entries_ = static_cast<int64_t>(d);
  int64_t expected = kHeaderSize + 12 * num_sequences_ + 8 * num_doc_entries_;
  LF_CHECK(n == expected, ip, ": size ", n, " bytes, but the header's ", num_sequences_,
           " sequences and ", num_doc_entries_, " document entries need ", expected,
           lf::hint("the .idx is truncated or was written by an incompatible tool"));
  lengths_ = p + kHeaderSize;
  pointers_ = lengths_ + 4 * num_sequences_;
  docs_ = pointers_ + 8 * num_sequences_;

  LF_CHECK(num_doc_entries_ >= 1 && document_index(0) == 0 &&
               document_index(num_doc_entries_ - 1) == num_sequences_,
           ip, ": document_indices must start at 0 and end at the sequence count ",
           num_sequences_, "; got ", num_doc_entries_, " entries",
           num_doc_entries_ ? lf::str(" from ", document_index(0), " to ",
                                      document_index(num_doc_entries_ - 1))
                            : std::string());
  for (int64_t k = 1; k < num_doc_entries_; ++k)
    LF_CHECK(document_index(k) >= document_index(k - 1), ip, ": document_indices decrease at entry ",
             k, " (", document_index(k - 1), " -> ", document_index(k), ")");

  bin_ = std::make_unique<lf::MappedFile>(bin_path(prefix_));
  int64_t esize = dtype_size(dtype_), bin_size = bin_->size();
  for (int64_t i = 0; i < num_sequences_; ++i) {
    int64_t len = sequence_length(i), ptr = sequence_pointer(i);
    LF_CHECK(len >= 0 && ptr >= 0 && ptr % esize == 0 && ptr + len * esize <= bin_size,
             bin_->path(), ": sequence ", i, " (", len, " tokens at byte ", ptr,
             ") lies outside the ", bin_size, "-byte file",
             lf::hint("the .bin is truncated or does not belong to this .idx"));
    total_tokens_ += len;
  }
}

IndexedDataset::~IndexedDataset() = default;

int64_t IndexedDataset::sequence_length(int64_t i) const {
  LF_DCHECK(i >= 0 && i < num_sequences_, "sequence ", i);
  return load<int32_t>(lengths_ + 4 * i);
}

int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  LF_DCHECK(i >= 0 && i < num_sequences_, "sequence ", i);
  return load<int64_t>(pointers_ + 8 * i);
}

int64_t IndexedDataset::document_index(int64_t k) const {
  LF_DCHECK(k >= 0 && k < num_doc_entries_, "document entry ", k);
  return load<int64_t>(docs_ + 8 * k);
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t count, int64_t* out) const {
  LF_CHECK(i >= 0 && i < num_sequences_, prefix_, ": sequence ", i, " out of range [0, ",
           num_sequences_, ")");
  int64_t len = sequence_length(i);
  LF_CHECK(offset >= 0 && count >= 0 && offset + count <= len, prefix_, ": sequence ", i, " has ",
           len, " tokens; asked for [", offset, ", ", offset + count, ")");
  const unsigned char* src = bin_->data() + sequence_pointer(i) + offset * dtype_size(dtype_);
  switch (dtype_) {
    case TokenDType::u8: convert<uint8_t>(src, count, out); break;
    case TokenDType::i8: convert<int8_t>(src, count, out); break;
    case TokenDType::i16: convert<int16_t>(src, count, out); break;
    case TokenDType::u16: convert<uint16_t>(src, count, out); break;
    case TokenDType::i32: convert<int32_t>(src, count, out); break;
    case TokenDType::i64: convert<int64_t>(src, count, out); break;
    case TokenDType::f32: case TokenDType::f64:
      LF_FAIL(prefix_, ": float token dtype ", dtype_name(dtype_), " cannot hold token ids",
              lf::hint("re-run preprocessing; token datasets are uint16 or int32"));
  }
}

void IndexedDataset::validate_tokens(int64_t vocab_size) const {
  std::vector<int64_t> buf;
  for (int64_t i = 0; i < num_sequences_; ++i) {
    int64_t len = sequence_length(i);
    buf.resize(static_cast<size_t>(len));
    read(i, 0, len, buf.data());
    for (int64_t j = 0; j < len; ++j)
      LF_CHECK(buf[j] >= 0 && buf[j] < vocab_size, bin_path(prefix_), ": token id ", buf[j],
               " at sequence ", i, " position ", j, " is outside the vocabulary [0, ", vocab_size,
               ")", lf::hint("the dataset was made with another tokenizer, or --vocab-size is "
                             "too small"));
  }
}

// ---------------------------------------------------------------------------------------------
// Writer

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string prefix, TokenDType dtype,
                                             int64_t vocab_size)
    : prefix_(std::move(prefix)), dtype_(dtype), vocab_size_(vocab_size) {
  LF_CHECK(dtype == TokenDType::u8 || dtype == TokenDType::i8 || dtype == TokenDType::i16 ||
               dtype == TokenDType::u16 || dtype == TokenDType::i32 || dtype == TokenDType::i64,
           "cannot write token dataset ", prefix_, " with dtype ", dtype_name(dtype));
  auto dir = std::filesystem::path(prefix_).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  bin_.open(bin_path(prefix_), std::ios::binary | std::ios::trunc);
  LF_CHECK(bin_.good(), "cannot create ", bin_path(prefix_), lf::hint("check the output prefix"));
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() = default;

void IndexedDatasetBuilder::write_tokens(std::span<const int32_t> tokens) {
  int64_t es = dtype_size(dtype_);
  int64_t lo = 0, hi = 0;
  switch (dtype_) {
    case TokenDType::u8: hi = 255; break;
    case TokenDType::i8: lo = -128; hi = 127; break;
    case TokenDType::i16: lo = -32768; hi = 32767; break;
    case TokenDType::u16: hi = 65535; break;
    default: lo = INT32_MIN; hi = INT32_MAX; break;
  }
  if (vocab_size_ >= 0) hi = std::min(hi, vocab_size_ - 1), lo = std::max<int64_t>(lo, 0);
  scratch_.resize(tokens.size() * static_cast<size_t>(es));
  char* dst = scratch_.data();
  for (size_t j = 0; j < tokens.size(); ++j, dst += es) {
    int64_t t = tokens[j];
    LF_CHECK(t >= lo && t <= hi, bin_path(prefix_), ": token id ", t, " (sequence ",
             lengths_.size(), ", position ", j, ") does not fit ", dtype_name(dtype_),
             vocab_size_ >= 0 ? lf::str(" / vocabulary size ", vocab_size_) : std::string(),
             lf::hint("the tokenizer's vocabulary is larger than the one the dataset was made for"));
    switch (dtype_) {
      case TokenDType::u8: { uint8_t v = static_cast<uint8_t>(t); std::memcpy(dst, &v, 1); break; }
      case TokenDType::i8: { int8_t v = static_cast<int8_t>(t); std::memcpy(dst, &v, 1); break; }
      case TokenDType::i16: { int16_t v = static_cast<int16_t>(t); std::memcpy(dst, &v, 2); break; }
      case TokenDType::u16: { uint16_t v = static_cast<uint16_t>(t); std::memcpy(dst, &v, 2); break; }
      case TokenDType::i32: { int32_t v = static_cast<int32_t>(t); std::memcpy(dst, &v, 4); break; }
      default: std::memcpy(dst, &t, 8); break;
    }
  }
  bin_.write(scratch_.data(), static_cast<std::streamsize>(scratch_.size()));
}

void IndexedDatasetBuilder::add_sequence(std::span<const int32_t> tokens) {
  LF_CHECK(!finalized_, prefix_, ": add_sequence after finalize()");
  LF_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), prefix_, ": a sequence of ",
           tokens.size(), " tokens exceeds the format's int32 length");
  write_tokens(tokens);
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
}

void IndexedDatasetBuilder::end_document() {
  doc_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetBuilder::add_document(std::span<const int32_t> tokens,
                                         std::span<const int32_t> lengths) {
  size_t pos = 0;
  for (int32_t l : lengths) {
    LF_CHECK(l >= 0 && pos + static_cast<size_t>(l) <= tokens.size(), prefix_,
             ": document lengths exceed its ", tokens.size(), " tokens");
    add_sequence(tokens.subspan(pos, static_cast<size_t>(l)));
    pos += static_cast<size_t>(l);
  }
  LF_CHECK(pos == tokens.size(), prefix_, ": document lengths sum to ", pos, ", not ",
           tokens.size());
  end_document();
}

void IndexedDatasetBuilder::add_index(const std::string& other_prefix) {
  IndexedDataset other(other_prefix);
  LF_CHECK(other.dtype() == dtype_, other_prefix, " has dtype ", dtype_name(other.dtype()),
           ", this dataset ", dtype_name(dtype_));
  int64_t base = static_cast<int64_t>(lengths_.size());
  for (int64_t i = 0; i < other.num_sequences(); ++i)
    lengths_.push_back(static_cast<int32_t>(other.sequence_length(i)));
  for (int64_t k = 1; k < other.num_documents() + 1; ++k)
    doc_indices_.push_back(base + other.document_index(k));
  std::ifstream in(bin_path(other_prefix), std::ios::binary);
  bin_ << in.rdbuf();
}

void IndexedDatasetBuilder::finalize() {
  LF_CHECK(!finalized_, prefix_, ": finalize() called twice");
  finalized_ = true;
  bin_.close();
  LF_CHECK(!bin_.fail(), "failed writing ", bin_path(prefix_), lf::hint("disk full?"));
  std::string out;
  out.reserve(static_cast<size_t>(kHeaderSize) + lengths_.size() * 12 + doc_indices_.size() * 8);
  out.append(kMagic, 9);
  put<uint64_t>(out, kVersion);
  put<uint8_t>(out, static_cast<uint8_t>(dtype_));
  put<uint64_t>(out, lengths_.size());
  put<uint64_t>(out, doc_indices_.size());
  for (int32_t l : lengths_) put<int32_t>(out, l);
  int64_t ptr = 0, es = dtype_size(dtype_);
  for (int32_t l : lengths_) put<int64_t>(out, ptr), ptr += l * es;
  for (int64_t d : doc_indices_) put<int64_t>(out, d);
  std::ofstream idx(idx_path(prefix_), std::ios::binary | std::ios::trunc);
  idx.write(out.data(), static_cast<std::streamsize>(out.size()));
  idx.close();
  LF_CHECK(!idx.fail(), "failed writing ", idx_path(prefix_), lf::hint("disk full?"));
}

}  // namespace lf::data

// safetensors files, read and written natively (no LibTorch here): a reader that maps a file and
// validates every header entry before anything is touched, and a writer that streams tensors from
// caller-owned memory. Checkpoints (train/checkpoint.h) and the HF adapters build on it; it knows
// nothing of their naming or sharding.
//
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:
// [begin, end)}, "__metadata__": {string: string}}, then the data; offsets are relative to the
// first byte after the header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lf {
class MappedFile;
}

namespace lf::safetensors {

enum class DType { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64, F8_E4M3, F8_E5M2 };
int64_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "F32", "BF16" ... as in the header

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
  int64_t numel() const;
};

// A validated view of one safetensors buffer. Every problem (short file, header length past the
// end, JSON syntax, missing/mistyped fields, unknown dtype, negative or overflowing shapes,
// offsets out of range, byte count != numel * dtype size, overlapping tensors) throws lf::Error
// naming `source` and the tensor.
class Reader {
 public:
  // Maps `path` read-only.
  static Reader open(const std::string& path);
  // Parses bytes the caller keeps alive (tests, fuzzing).
  static Reader from_bytes(std::string_view bytes, std::string source);

  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;
  ~Reader();

  const std::string& source() const { return source_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data-offset order
  const TensorInfo* find(std::string_view name) const;
  // Throws naming the file and the tensor when absent.
  const TensorInfo& at(std::string_view name) const;
  const unsigned char* data(const TensorInfo& t) const { return data_ + t.begin; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  Reader() = default;
  void parse(std::string_view bytes);

  std::string source_;
  std::unique_ptr<MappedFile> file_;
  const unsigned char* data_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors (pointers to memory the caller keeps alive until write()) and writes one
// file. Names must be unique; the data is written in the order added.
class Writer {
 public:
  void add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data);
  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }
  // Writes `path` directly (no temporary file: callers that need atomicity write into a
  // temporary directory and rename it). fsync: flush the file to disk before returning.
  // Returns the bytes written.
  uint64_t write(const std::string& path, bool fsync = false) const;
  std::string header() const;  // the padded JSON header (for tests)

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    uint64_t bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace lf::safetensors

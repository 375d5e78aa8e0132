#include "loongforge/core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "loongforge/core/error.h"
#include "loongforge/core/mapped_file.h"

namespace lf::safetensors {
namespace {
using nlohmann::json;

struct DTypeRow {
  DType dtype;
  std::string_view name;
  int64_t size;
};
constexpr std::array<DTypeRow, 15> kDTypes{{{DType::BOOL, "BOOL", 1},
                                            {DType::U8, "U8", 1},
                                            {DType::I8, "I8", 1},
                                            {DType::I16, "I16", 2},
                                            {DType::U16, "U16", 2},
                                            {DType::F16, "F16", 2},
                                            {DType::BF16, "BF16", 2},
                                            {DType::I32, "I32", 4},
                                            {DType::U32, "U32", 4},
                                            {DType::F32, "F32", 4},
                                            {DType::I64, "I64", 8},
                                            {DType::U64, "U64", 8},
                                            {DType::F64, "F64", 8},
                                            {DType::F8_E4M3, "F8_E4M3", 1},
                                            {DType::F8_E5M2, "F8_E5M2", 1}}};

// A header larger than this is not a safetensors file (the reference implementation's limit).
constexpr uint64_t kMaxHeader = 100u << 20;
constexpr const char* kHint = "the file is truncated or not a safetensors file; re-create or re-download it";
}  // namespace

int64_t dtype_size(DType dtype) {
  for (const auto& r : kDTypes)
    if (r.dtype == dtype) return r.size;
  LF_FAIL("unknown safetensors dtype ", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  for (const auto& r : kDTypes)
    if (r.dtype == dtype) return r.name;
  LF_FAIL("unknown safetensors dtype ", static_cast<int>(dtype));
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;
Reader::~Reader() = default;

Reader Reader::open(const std::string& path) {
  Reader r;
  r.source_ = path;
  r.file_ = std::make_unique<MappedFile>(path);
  r.parse(std::string_view(reinterpret_cast<const char*>(r.file_->data()),
                           static_cast<size_t>(r.file_->size())));
  return r;
}

Reader Reader::from_bytes(std::string_view bytes, std::string source) {
  Reader r;
  r.source_ = std::move(source);
  r.parse(bytes);
  return r;
}

void Reader::parse(std::string_view bytes) {
  const std::string& src = source_;
  LF_CHECK(bytes.size() >= 8, src, ": ", bytes.size(), " bytes, shorter than the 8-byte header length",
           lf::hint(kHint));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  LF_CHECK(n <= kMaxHeader && n <= bytes.size() - 8, src, ": header length ", n,
           " runs past the end of the file (", bytes.size(), " bytes)", lf::hint(kHint));
  const std::string_view header = bytes.substr(8, n);
  const uint64_t data_size = bytes.size() - 8 - n;
  data_ = reinterpret_cast<const unsigned char*>(bytes.data()) + 8 + n;

  json j;
  try {
    j = json::parse(header);
  } catch (const json::exception& e) {
    LF_FAIL(src, ": the JSON header does not parse: ", e.what(), lf::hint(kHint));
  }
  LF_CHECK(j.is_object(), src, ": the JSON header is not an object", lf::hint(kHint));
  tensors_.clear();
  metadata_.clear();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      LF_CHECK(e.is_object(), src, ": __metadata__ is not an object");
      for (auto m = e.begin(); m != e.end(); ++m) {
        LF_CHECK(m.value().is_string(), src, ": __metadata__ value of '", m.key(), "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    LF_CHECK(e.is_object(), src, ": entry '", name, "' is not an object", lf::hint(kHint));
    TensorInfo t;
    t.name = name;
    const auto dt = e.find("dtype");
    LF_CHECK(dt != e.end() && dt->is_string(), src, ": tensor '", name, "' has no dtype string");
    const std::string dname = dt->get<std::string>();
    const auto row = std::find_if(kDTypes.begin(), kDTypes.end(), [&](const DTypeRow& r) { return r.name == dname; });
    LF_CHECK(row != kDTypes.end(), src, ": tensor '", name, "' has unsupported dtype '", dname, "'",
             lf::hint("supported: BOOL U8 I8 I16 U16 F16 BF16 I32 U32 F32 I64 U64 F64"));
    t.dtype = row->dtype;
    const auto shape = e.find("shape");
    LF_CHECK(shape != e.end() && shape->is_array(), src, ": tensor '", name, "' has no shape array");
    // numel * size must fit: every dimension is checked against what the data could hold.
    uint64_t bytes_needed = static_cast<uint64_t>(row->size);
    for (const auto& d : *shape) {
      LF_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, src, ": tensor '", name,
               "' has a dimension that is not a non-negative integer: ", d.dump());
      const auto dim = static_cast<uint64_t>(d.get<int64_t>());
      LF_CHECK(dim == 0 || bytes_needed <= std::numeric_limits<uint64_t>::max() / dim, src, ": tensor '",
               name, "' has a shape too large to address: ", shape->dump());
      bytes_needed *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto off = e.find("data_offsets");
    LF_CHECK(off != e.end() && off->is_array() && off->size() == 2 && (*off)[0].is_number_unsigned() &&
                 (*off)[1].is_number_unsigned(),
             src, ": tensor '", name, "' needs data_offsets [begin, end] of non-negative integers");
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    LF_CHECK(t.begin <= t.end && t.end <= data_size, src, ": tensor '", name, "' data_offsets [",
             t.begin, ", ", t.end, ") lie outside the ", data_size, "-byte data section", lf::hint(kHint));
    LF_CHECK(t.end - t.begin == bytes_needed, src, ": tensor '", name, "' has ", t.end - t.begin,
             " bytes for shape ", shape->dump(), " of ", dname, " (needs ", bytes_needed, ")",
             lf::hint(kHint));
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < tensors_.size(); ++i)
    LF_CHECK(tensors_[i].begin >= tensors_[i - 1].end || tensors_[i - 1].begin == tensors_[i - 1].end,
             src, ": tensors '", tensors_[i - 1].name, "' and '", tensors_[i].name, "' overlap",
             lf::hint(kHint));
}

const TensorInfo* Reader::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorInfo& Reader::at(std::string_view name) const {
  const TensorInfo* t = find(name);
  LF_CHECK(t, source_, " has no tensor '", name, "'",
           lf::hint("the file belongs to a different model or was written by another version"));
  return *t;
}

void Writer::add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data) {
  LF_CHECK(name != "__metadata__", "a tensor cannot be named __metadata__");
  for (const auto& e : entries_) LF_CHECK(e.name != name, "tensor '", name, "' added twice");
  uint64_t bytes = static_cast<uint64_t>(dtype_size(dtype));
  for (int64_t d : shape) {
    LF_CHECK(d >= 0, "tensor '", name, "' has a negative dimension");
    bytes *= static_cast<uint64_t>(d);
  }
  entries_.push_back({std::move(name), dtype, std::move(shape), data, bytes});
}

std::string Writer::header() const {
  // Built by hand so the entries keep their insertion order (nlohmann's json sorts keys).
  std::string h = "{";
  if (!metadata_.empty()) h += "\"__metadata__\":" + json(metadata_).dump() + (entries_.empty() ? "" : ",");
  uint64_t offset = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const auto& e = entries_[i];
    h += (i ? "," : "") + json(e.name).dump() + ":{\"dtype\":\"" + std::string(dtype_name(e.dtype)) +
         "\",\"shape\":" + json(e.shape).dump() + ",\"data_offsets\":[" + std::to_string(offset) + "," +
         std::to_string(offset + e.bytes) + "]}";
    offset += e.bytes;
  }
  h += "}";
  while (h.size() % 8) h += ' ';  // data starts 8-byte aligned
  return h;
}

uint64_t Writer::write(const std::string& path, bool fsync) const {
  const std::string h = header();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LF_CHECK(fd >= 0, "cannot create ", path, ": ", std::strerror(errno),
           lf::hint("check that the directory exists and is writable"));
  uint64_t total = 0;
  auto put = [&](const void* p, uint64_t size) {
    const char* c = static_cast<const char*>(p);
    while (size > 0) {
      const ssize_t w = ::write(fd, c, std::min<uint64_t>(size, 1u << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int e = errno;
        ::close(fd);
        LF_FAIL("writing ", path, " failed after ", total, " bytes: ", std::strerror(e),
                lf::hint("check free disk space"));
      }
      c += w;
      size -= static_cast<uint64_t>(w);
      total += static_cast<uint64_t>(w);
    }
  };
  unsigned char len[8];
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
  put(len, 8);
  put(h.data(), h.size());
  for (const auto& e : entries_) put(e.data, e.bytes);
  if (fsync && ::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    LF_FAIL("fsync of ", path, " failed: ", std::strerror(e));
  }
  LF_CHECK(::close(fd) == 0, "closing ", path, " failed: ", std::strerror(errno));
  return total;
}

}  // namespace lf::safetensors

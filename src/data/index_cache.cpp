// Index cache files: "LFINDEX1" | u64 count | int64[count].
#include "index_cache.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"

namespace lf::data {
namespace {

constexpr char kMagic[8] = {'L', 'F', 'I', 'N', 'D', 'E', 'X', '1'};

bool read_array(const std::string& path, std::vector<int64_t>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  char magic[8];
  uint64_t n = 0;
  if (!in.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return false;
  if (!in.read(reinterpret_cast<char*>(&n), 8)) return false;
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  if (ec || size != 16 + n * 8) return false;
  out.resize(n);
  return static_cast<bool>(in.read(reinterpret_cast<char*>(out.data()),
                                   static_cast<std::streamsize>(n * 8)));
}

bool write_file(const std::string& path, const std::string& head, const void* data, size_t bytes) {
  std::string tmp = lf::str(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out.write(head.data(), static_cast<std::streamsize>(head.size()));
    if (bytes) out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!out.good()) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  return !ec;
}

bool write_array(const std::string& path, const std::vector<int64_t>& v) {
  std::string head(kMagic, 8);
  uint64_t n = v.size();
  head.append(reinterpret_cast<const char*>(&n), 8);
  return write_file(path, head, v.data(), v.size() * 8);
}

}  // namespace

std::string description_hash(const std::string& description) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : description) h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool load_cached_indices(const std::string& stem, const std::string& description,
                         CachedIndices& out) {
  std::ifstream in(stem + ".description.json", std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str() != description) return false;
  return read_array(stem + ".doc_index.bin", out.doc) &&
         read_array(stem + ".sample_index.bin", out.sample) &&
         read_array(stem + ".shuffle_index.bin", out.shuffle);
}

bool save_cached_indices(const std::string& stem, const std::string& description,
                         const CachedIndices& indices) {
  bool ok = write_array(stem + ".doc_index.bin", indices.doc) &&
            write_array(stem + ".sample_index.bin", indices.sample) &&
            write_array(stem + ".shuffle_index.bin", indices.shuffle) &&
            write_file(stem + ".description.json", description, nullptr, 0);
  if (!ok)
    LF_WARN("could not write the index cache ", stem, ".*; indices will be rebuilt next time "
            "(set a writable cache directory)");
  return ok;
}

}  // namespace lf::data

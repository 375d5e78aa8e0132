// MappedFile: a read-only memory map of a whole file (datasets, safetensors). Not a writer;
// files are written with ordinary streams and renamed into place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lf {

class MappedFile {
 public:
  explicit MappedFile(std::string path);  // throws lf::Error naming the path and errno text
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace lf

// Read-only mmap of a whole file. Empty files map to a null pointer of size 0.
#include "loongforge/core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loongforge/core/error.h"

namespace lf {

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  LF_CHECK(fd >= 0, "cannot open ", path_, ": ", std::strerror(errno),
           lf::hint("check the path and its permissions"));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    LF_FAIL("cannot stat ", path_, ": ", std::strerror(e));
  }
  size_ = static_cast<int64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    ::close(fd);
    LF_CHECK(p != MAP_FAILED, "cannot mmap ", path_, " (", size_, " bytes): ", std::strerror(e));
    data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), static_cast<size_t>(size_));
}

}  // namespace lf

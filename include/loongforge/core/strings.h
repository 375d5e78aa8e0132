// Small formatting helpers for messages: "[0, 1, 2]" for rank lists and shapes. Header-only, std
// only, so LibTorch and non-LibTorch translation units alike may use it.
#pragma once

#include <sstream>
#include <string>

namespace lf {

// "[a, b, c]" for any range whose elements stream.
template <class Range>
std::string bracket_list(const Range& values) {
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (const auto& v : values) {
    os << (first ? "" : ", ") << v;
    first = false;
  }
  os << "]";
  return os.str();
}

}  // namespace lf

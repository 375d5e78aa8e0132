// Small text helpers of the composites' --dry-run descriptions. Internal to models/.
#pragma once

#include <iomanip>
#include <sstream>
#include <string>

namespace lf::models {

inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  std::ostringstream os;
  os << std::fixed << std::setprecision(b < 10 ? 2 : 1) << b << " " << units[u];
  return os.str();
}

}  // namespace lf::models

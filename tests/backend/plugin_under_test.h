// The XPU plugin the backend tests load: the reference plugin built in this tree, or the one named
// by LOONGFORGE_XPU_COMPAT_PLUGIN (tools/xpu-compat: a vendor's plugin run through the op harness
// and the communicator test, docs/backends.md "Writing a plugin"). A dedicated variable, not
// LOONGFORGE_XPU_PLUGIN, so that a machine whose environment selects its plugin for training still
// runs the project's suite on the reference.
#pragma once

#include <cstdlib>
#include <string>

#include "multiprocess.h"

namespace lf::testing {

inline std::string xpu_plugin_under_test() {
  const char* p = std::getenv("LOONGFORGE_XPU_COMPAT_PLUGIN");
  return p && *p ? std::string(p) : binary_dir() + "/lib/libloongforge_xpu_reference.so";
}

}  // namespace lf::testing

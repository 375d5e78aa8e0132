// The message of the lf::Error a call throws, for tests that check what a user is told.
#pragma once

#include <functional>
#include <string>

#include "loongforge/core/error.h"

namespace lf::testing {

// What `f` threw as lf::Error, or "(no error)" when it returned normally (so a substring check on
// the message fails instead of passing on an empty string).
inline std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const lf::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace lf::testing

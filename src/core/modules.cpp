// Module loading (core/modules.h).
#include "loongforge/core/modules.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "loongforge/core/error.h"

namespace lf {

std::string module_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&module_dir), &info) == 0 || !info.dli_fname) return ".";
  return std::filesystem::path(info.dli_fname).parent_path().string();
}

void* module_symbol(const std::string& file, const char* symbol, const std::string& needed_for) {
  static std::mutex mutex;
  static std::unordered_map<std::string, void*> handles;  // file -> dlopen handle, never closed
  std::lock_guard<std::mutex> lock(mutex);
  void*& handle = handles[file];
  const std::string path = (std::filesystem::path(module_dir()) / file).string();
  if (!handle) {
    std::error_code ec;
    LF_CHECK(std::filesystem::exists(path, ec), "the module ", path, " (", needed_for,
             ") is missing",
             lf::hint("it is built with the rest of LoongForge (tools/build) and installed beside "
                      "libloongforge_core.so; rebuild, or reinstall the whole lib/ directory"));
    // RTLD_LOCAL: the module's dependencies stay out of the global namespace.
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      LF_FAIL("cannot load the module ", path, " (", needed_for, "): ", why ? why : "?",
              lf::hint("a library it links is missing on this machine: the message names it "
                       "(tools/install-deps installs them)"));
    }
  }
  dlerror();
  void* address = dlsym(handle, symbol);
  LF_CHECK(address != nullptr, "the module ", path, " (", needed_for, ") lacks the symbol ", symbol,
           lf::hint("the file is not from this build of LoongForge; rebuild it with the rest"));
  return address;
}

}  // namespace lf

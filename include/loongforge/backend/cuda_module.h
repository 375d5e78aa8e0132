// The entry point of the CUDA backend module (libloongforge_backend_cuda.so), which the
// registry dlopens only when cuda is asked for. The module is built from this tree together
// with the library that loads it, so this is a C++ boundary guarded by a version number, not a
// stable ABI (the stable one is the XPU plugin's, backend/xpu_plugin_abi.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace lf::backend {
class DeviceBackend;
}

// Bump on any change to DeviceBackend, OpTable or the factory's contract.
#define LF_CUDA_MODULE_ABI_VERSION 1u
#define LF_CUDA_MODULE_ABI_SYMBOL "loongforge_cuda_module_abi"
#define LF_CUDA_MODULE_CREATE_SYMBOL "loongforge_cuda_backend_create"

extern "C" {
// The LF_CUDA_MODULE_ABI_VERSION the module was compiled with.
typedef uint32_t (*lf_cuda_module_abi_fn)(void);
// Creates the backend (caller owns it), or returns nullptr with a message in `error` (at most
// error_size bytes, NUL-terminated), e.g. when no CUDA device is visible.
typedef lf::backend::DeviceBackend* (*lf_cuda_backend_create_fn)(char* error, size_t error_size);
}

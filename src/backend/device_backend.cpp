// The backend registry: LOONGFORGE_DEVICE selection, process-wide instances, and loading of the
// CUDA module (the XPU plugin loader is backends/xpu_plugin/plugin_loader.cpp; the CPU backend
// is backends/cpu, linked into this library).
#include <dlfcn.h>

#include <ATen/Functions.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

#include "loongforge/backend/cuda_module.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"

namespace lf::backend {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : fallback;
}

std::string visible_devices_text() { return env_or("CUDA_VISIBLE_DEVICES", "unset"); }

// Directory of the shared object that holds this function (libloongforge_backend.so).
std::string this_library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&this_library_dir), &info) == 0 || !info.dli_fname) return ".";
  return std::filesystem::path(info.dli_fname).parent_path().string();
}

std::unique_ptr<DeviceBackend> create_backend(const std::string& name) {
  if (name == "cuda") return load_cuda_backend(cuda_module_path());
  if (name == "xpu") {
    const char* plugin = std::getenv("LOONGFORGE_XPU_PLUGIN");
    LF_CHECK(plugin != nullptr && *plugin != '\0',
             "LOONGFORGE_DEVICE=xpu but LOONGFORGE_XPU_PLUGIN is not set",
             lf::hint("set LOONGFORGE_XPU_PLUGIN to the path of the vendor's plugin .so "
                      "(build/lib/libloongforge_xpu_reference.so is the CPU reference plugin)"));
    return load_xpu_plugin(plugin);
  }
  LF_FAIL("unknown device backend '", name, "'",
          lf::hint("LOONGFORGE_DEVICE must be one of cpu, cuda, xpu"));
}

}  // namespace

CommunicatorFactory DeviceBackend::communicator_factory() const {
  return [this](const CommunicatorSpec& spec) { return create_communicator(spec); };
}

bool cuda_device_visible() {
  const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
  if (vis != nullptr) {
    const std::string v(vis);
    if (v.empty() || v == "-1" || v == "none" || v == "NoDevFiles") return false;
  }
  std::error_code ec;
  const std::filesystem::path gpus("/proc/driver/nvidia/gpus");
  if (std::filesystem::is_directory(gpus, ec) &&
      std::filesystem::directory_iterator(gpus, ec) != std::filesystem::directory_iterator())
    return true;
  return std::filesystem::exists("/dev/nvidia0", ec);
}

std::string default_device_name() {
  const char* dev = std::getenv("LOONGFORGE_DEVICE");
  if (dev != nullptr && *dev != '\0') return dev;
  return cuda_device_visible() ? "cuda" : "cpu";
}

void init_cpu_math() {
  static std::once_flag once;
  std::call_once(once, [] {
    // 64 elements: far below ATen's grain size, so each call runs in this thread alone. Every
    // function ATen's vml.h routes to MKL (fp32 and fp64).
    for (const auto dt : {at::kFloat, at::kDouble}) {
      const auto x = at::linspace(0.05, 0.95, 64, at::TensorOptions().dtype(dt));
      for (auto f : {&at::acos, &at::asin, &at::atan, &at::cos, &at::erf, &at::erfc, &at::erfinv, &at::exp,
                     &at::log, &at::log10, &at::log2, &at::sin, &at::sqrt, &at::tan, &at::tanh, &at::trunc})
        (void)f(x);
    }
  });
}

int intra_op_team_size() {
  const int64_t n = at::get_num_threads();
  std::vector<std::atomic<int>> ran(static_cast<size_t>(std::max<int64_t>(n, 1)));
  // Grain 1 over n items: each thread of the team gets one item.
  at::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    const int tid = at::get_thread_num();
    if (tid >= 0 && tid < static_cast<int>(ran.size())) ran[static_cast<size_t>(tid)].store(1);
  });
  int used = 0;
  for (const auto& r : ran) used += r.load();
  return used;
}

const DeviceBackend& backend_by_name(std::string_view name) {
  init_cpu_math();
  if (name == "cpu") return cpu_backend();
  // Created once; a failure is not cached, so asking again reports the same error.
  static std::mutex mu;
  static auto* instances = new std::map<std::string, std::unique_ptr<DeviceBackend>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = instances->find(std::string(name));
  if (it != instances->end()) return *it->second;
  auto backend = create_backend(std::string(name));
  return *instances->emplace(std::string(name), std::move(backend)).first->second;
}

const DeviceBackend& select_backend() { return backend_by_name(default_device_name()); }

std::string cuda_module_path() {
  const char* override_path = std::getenv("LOONGFORGE_CUDA_MODULE");
  if (override_path != nullptr && *override_path != '\0') return override_path;
  return (std::filesystem::path(this_library_dir()) / "libloongforge_backend_cuda.so").string();
}

std::unique_ptr<DeviceBackend> load_cuda_backend(const std::string& module_path) {
  std::error_code ec;
  LF_CHECK(std::filesystem::exists(module_path, ec), "CUDA backend module not found at ",
           module_path,
           lf::hint("build it (ninja loongforge_backend_cuda; needs nvcc, LOONGFORGE_CUDA=ON) or "
                    "point LOONGFORGE_CUDA_MODULE at it"));
  // RTLD_LOCAL: its symbols (and libtorch_cuda's) stay out of the global namespace; never
  // closed, since the backend it creates lives until exit.
  void* handle = dlopen(module_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    LF_FAIL("cannot load the CUDA backend module ", module_path, ": ", why ? why : "?",
            lf::hint("libtorch_cuda.so and the CUDA/NCCL libraries from the torch wheel must be "
                     "loadable; check the message above for the missing library"));
  }
  auto abi = reinterpret_cast<lf_cuda_module_abi_fn>(dlsym(handle, LF_CUDA_MODULE_ABI_SYMBOL));
  auto create =
      reinterpret_cast<lf_cuda_backend_create_fn>(dlsym(handle, LF_CUDA_MODULE_CREATE_SYMBOL));
  LF_CHECK(abi != nullptr && create != nullptr, "CUDA backend module ", module_path,
           " lacks the symbols ", LF_CUDA_MODULE_ABI_SYMBOL, " / ", LF_CUDA_MODULE_CREATE_SYMBOL,
           lf::hint("the file is not a LoongForge CUDA module"));
  LF_CHECK(abi() == LF_CUDA_MODULE_ABI_VERSION, "CUDA backend module ", module_path,
           " has ABI version ", abi(), " but this LoongForge expects ", LF_CUDA_MODULE_ABI_VERSION,
           lf::hint("rebuild the module from the same tree as the library loading it"));
  char error[1024] = {0};
  DeviceBackend* backend = create(error, sizeof(error));
  LF_CHECK(backend != nullptr, "LOONGFORGE_DEVICE=cuda but ", error,
           " (CUDA_VISIBLE_DEVICES=", visible_devices_text(), ")",
           lf::hint("run on a machine with an NVIDIA GPU and driver, check CUDA_VISIBLE_DEVICES, "
                    "or use LOONGFORGE_DEVICE=cpu"));
  return std::unique_ptr<DeviceBackend>(backend);
}

}  // namespace lf::backend

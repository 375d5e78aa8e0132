// Choosing a DeviceBackend: LOONGFORGE_DEVICE=cpu|cuda|xpu (unset: cuda when a GPU is visible,
// else cpu). The CPU backend is linked in; cuda is a module (libloongforge_backend_cuda.so)
// dlopened only when asked for, so CPU processes never load libtorch_cuda; xpu is an out-of-tree
// plugin named by LOONGFORGE_XPU_PLUGIN (backend/xpu_plugin_abi.h). Not the backends themselves.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "loongforge/backend/device_backend.h"

namespace lf::backend {

// The process-wide backend for LOONGFORGE_DEVICE (see above). Throws lf::Error when it cannot be
// used: an unknown name, cuda without a visible GPU or without its module, xpu with a missing or
// mismatched plugin. Backends are created once and live until process exit.
const DeviceBackend& select_backend();
// The process-wide backend named "cpu", "cuda" or "xpu" (same errors as select_backend).
const DeviceBackend& backend_by_name(std::string_view name);
// LOONGFORGE_DEVICE if set, else "cuda" when cuda_device_visible(), else "cpu".
std::string default_device_name();

// Whether the machine shows an NVIDIA GPU to this process, judged without loading any CUDA
// library: the driver lists a GPU (/proc/driver/nvidia/gpus or /dev/nvidia0) and
// CUDA_VISIBLE_DEVICES does not hide all of them.
bool cuda_device_visible();

// The CPU reference backend (always available).
const DeviceBackend& cpu_backend();

// Initialises the x86 wheel's MKL vector math (VML: exp, log, tanh, erf, ...) from this thread,
// once per process. ATen sends contiguous fp32/fp64 element-wise math to VML; when two intra-op
// threads make a process's first call of a VML function at the same time, one of them can compute
// with a less accurate kernel for that call (seen: exp off by 2e-5 to 1.5e-4 relative on the second
// thread's half of the tensor, in 2 to 10 processes of 100 at OMP_NUM_THREADS=2), so a first step
// would not be reproducible. A serial first call settles it. select_backend(), backend_by_name() and
// cpu_backend() call this; so does every LibTorch test binary before main().
void init_cpu_math();

// How many threads one at::parallel_for in the backend library runs on at the current
// at::get_num_threads(): the OpenMP team its own kernels (attention, fused norms and activations,
// the optimizer) share with LibTorch. 1 at one thread, and 1 whatever the thread count if the
// library was built without OpenMP, when its kernels would run serially beside multi-threaded
// GEMMs (cmake/LoongForgeDeps.cmake). loongforge-train logs it.
int intra_op_team_size();

// Loading the modules, for the registry and for tests that need a fresh instance or a
// particular file. Both throw lf::Error naming the path on a missing file, a missing symbol or
// an ABI mismatch.
//   cuda: LOONGFORGE_CUDA_MODULE if set, else libloongforge_backend_cuda.so next to
//   libloongforge_backend.so.
std::string cuda_module_path();
std::unique_ptr<DeviceBackend> load_cuda_backend(const std::string& module_path);
std::unique_ptr<DeviceBackend> load_xpu_plugin(const std::string& plugin_path);

}  // namespace lf::backend

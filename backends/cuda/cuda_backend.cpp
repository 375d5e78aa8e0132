// The CUDA backend module (libloongforge_backend_cuda.so): DeviceBackend over ATen CUDA, the
// caching allocator's statistics, CUDA streams/events, the CUDA generator, and NCCL
// communicators (c10d::ProcessGroupNCCL wrapped in C10dCommunicator). Loaded by the registry
// with dlopen only when cuda is asked for (backend/cuda_module.h); it links libtorch_cuda, which
// CPU processes therefore never load.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/Functions.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#if LOONGFORGE_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "cuda_ops.h"
#include "loongforge/backend/c10d_communicator.h"
#include "loongforge/backend/cuda_module.h"
#include "loongforge/backend/device_backend.h"
#include "loongforge/core/error.h"

namespace lf::backend::cuda {
namespace {

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(bool timing)
      : event_(timing ? cudaEventDefault : cudaEventDisableTiming) {}
  void record(const c10::Stream& stream) override {
    LF_CHECK(stream.device_type() == c10::DeviceType::CUDA,
             "CUDA event recorded on a stream of device ", stream.device());
    event_.record(c10::cuda::CUDAStream(stream));
  }
  bool query() const override { return event_.query(); }
  void synchronize() const override { event_.synchronize(); }
  double elapsed_ms(const Event& end) const override {
    auto* e = dynamic_cast<const CudaEvent*>(&end);
    LF_CHECK(e != nullptr, "elapsed_ms: the end event is not a CUDA event");
    return event_.elapsed_time(e->event_);
  }
  void block(const c10::Stream& stream) const {
    const_cast<c10::cuda::CUDAEvent&>(event_).block(c10::cuda::CUDAStream(stream));
  }

 private:
  c10::cuda::CUDAEvent event_;
};

class CudaBackend final : public DeviceBackend {
 public:
  const std::string& name() const override { return name_; }
  c10::Device device() const override {
    return c10::Device(c10::DeviceType::CUDA, c10::cuda::current_device());
  }
  bool is_available() const override { return device_count() > 0; }
  int device_count() const override { return static_cast<int>(c10::cuda::device_count()); }
  void set_device_index(int index) const override {
    LF_CHECK(index >= 0 && index < device_count(), "CUDA device index ", index,
             " is out of range: ", device_count(), " visible",
             lf::hint("LOCAL_RANK must be below the GPUs per node; check CUDA_VISIBLE_DEVICES"));
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
  }

  MemoryStats memory_stats() const override {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
    constexpr auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    MemoryStats s;
    s.supported = true;
    s.allocated_bytes = stats.allocated_bytes[agg].current;
    s.peak_allocated_bytes = stats.allocated_bytes[agg].peak;
    s.reserved_bytes = stats.reserved_bytes[agg].current;
    s.num_allocations = stats.allocation[agg].allocated;
    return s;
  }
  void reset_peak_memory() const override {
    c10::cuda::CUDACachingAllocator::resetPeakStats(c10::cuda::current_device());
  }
  void synchronize() const override { c10::cuda::device_synchronize(); }

  c10::Stream current_stream() const override { return c10::cuda::getCurrentCUDAStream(); }
  c10::Stream new_stream() const override { return c10::cuda::getStreamFromPool(); }
  void set_current_stream(const c10::Stream& stream) const override {
    c10::cuda::setCurrentCUDAStream(c10::cuda::CUDAStream(stream));
  }
  void stream_wait_event(const c10::Stream& stream, const Event& event) const override {
    auto* e = dynamic_cast<const CudaEvent*>(&event);
    LF_CHECK(e != nullptr, "stream_wait_event: not a CUDA event");
    e->block(stream);
  }
  std::unique_ptr<Event> create_event(bool enable_timing) const override {
    return std::make_unique<CudaEvent>(enable_timing);
  }

  void manual_seed(uint64_t seed) const override {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(c10::cuda::current_device());
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  std::vector<uint8_t> rng_state() const override {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(c10::cuda::current_device());
    std::lock_guard<std::mutex> lock(gen.mutex());
    at::Tensor state = gen.get_state();  // uint8 [n] on the CPU
    const auto* p = state.data_ptr<uint8_t>();
    return std::vector<uint8_t>(p, p + state.numel());
  }
  void set_rng_state(const std::vector<uint8_t>& state) const override {
    auto t = at::empty({static_cast<int64_t>(state.size())}, at::kByte);
    std::memcpy(t.data_ptr<uint8_t>(), state.data(), state.size());
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(c10::cuda::current_device());
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(t);
  }

  std::unique_ptr<Communicator> create_communicator(const CommunicatorSpec& spec) const override {
#if LOONGFORGE_HAVE_NCCL
    LF_CHECK(spec.store, "NCCL communicator for group '", spec.name, "' needs a store");
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = spec.timeout;
    options->group_name = spec.name;
    auto engine = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        spec.store, spec.group_rank, static_cast<int>(spec.ranks.size()), options);
    return std::make_unique<C10dCommunicator>(spec, engine,
                                              C10dCommunicatorOptions{/*native_avg=*/true});
#else
    LF_FAIL("this CUDA module was built without NCCL headers; no communicator for group '",
            spec.name, "'", lf::hint("rebuild with nccl.h available (the torch wheel's nvidia-nccl)"));
#endif
  }
  const OpTable& ops() const override { return ops_; }

 private:
  std::string name_ = "cuda";
  CudaOps ops_;
};

}  // namespace
}  // namespace lf::backend::cuda

extern "C" __attribute__((visibility("default"))) uint32_t loongforge_cuda_module_abi(void) {
  return LF_CUDA_MODULE_ABI_VERSION;
}

extern "C" __attribute__((visibility("default"))) lf::backend::DeviceBackend*
loongforge_cuda_backend_create(char* error, size_t error_size) {
  auto fail = [&](const std::string& msg) -> lf::backend::DeviceBackend* {
    if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", msg.c_str());
    return nullptr;
  };
  try {
    // device_count() is 0 (not an exception) without a driver or with every GPU hidden.
    const auto n = c10::cuda::device_count();
    if (n == 0) return fail("no CUDA device is visible");
    return new lf::backend::cuda::CudaBackend();
  } catch (const std::exception& e) {
    return fail(std::string("CUDA initialisation failed: ") + e.what());
  }
}

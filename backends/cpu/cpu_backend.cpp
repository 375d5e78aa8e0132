// The CPU backend: the reference ops, Gloo communicators, the default CPU generator, and memory
// statistics from a counting wrapper around c10's CPU allocator (installed when the backend is
// first created; memory allocated before that is not counted). Streams and events are trivial
// because CPU work is finished when the call returns.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>

#include "loongforge/backend/c10d_communicator.h"
#include "cpu_ops.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"

namespace lf::backend {
namespace {

// c10's CPU allocation (alloc_cpu: aligned, honours c10's CPU memory settings) with live and peak
// byte counts. Each block carries its size in a header just before the data, so the DataPtr's
// context is the data pointer itself, as ATen kernels that use raw_allocate require. Never
// destroyed: tensors may outlive any static object.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  // A multiple of c10's alignment (64), so the data keeps alloc_cpu's alignment.
  static constexpr size_t kHeader = 64;

  c10::DataPtr allocate(size_t n) override {
    auto* base = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    *reinterpret_cast<int64_t*>(base) = static_cast<int64_t>(n);
    void* data = base + kHeader;
    const int64_t now = allocated_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    count_.fetch_add(1);
    return {data, data, &free_block, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  int64_t allocated() const { return allocated_.load(); }
  int64_t peak() const { return peak_.load(); }
  int64_t count() const { return count_.load(); }
  void reset_peak() { peak_.store(allocated_.load()); }

 private:
  static void free_block(void* data);

  std::atomic<int64_t> allocated_{0}, peak_{0}, count_{0};
};

CountingCpuAllocator& counting_allocator() {
  static CountingCpuAllocator* instance = [] {
    auto* a = new CountingCpuAllocator();
    // Priority above the default (0) so a later default registration does not replace it.
    c10::SetCPUAllocator(a, /*priority=*/10);
    return a;
  }();
  return *instance;
}

void CountingCpuAllocator::free_block(void* data) {
  if (!data) return;
  char* base = static_cast<char*>(data) - kHeader;
  counting_allocator().allocated_.fetch_sub(*reinterpret_cast<int64_t*>(base));
  c10::free_cpu(base);
}

class CpuEvent final : public Event {
 public:
  explicit CpuEvent(bool timing) : timing_(timing) {}
  void record(const c10::Stream& stream) override {
    LF_CHECK(stream.device_type() == c10::DeviceType::CPU,
             "CPU event recorded on a stream of device ", stream.device());
    at_ = std::chrono::steady_clock::now();
    recorded_ = true;
  }
  bool query() const override { return true; }
  void synchronize() const override {}
  double elapsed_ms(const Event& end) const override {
    auto* e = dynamic_cast<const CpuEvent*>(&end);
    LF_CHECK(e != nullptr, "elapsed_ms: the end event is not a CPU event");
    LF_CHECK(timing_ && e->timing_ && recorded_ && e->recorded_,
             "elapsed_ms: both events must be created with enable_timing and recorded",
             lf::hint("create_event(true), then record() each"));
    return std::chrono::duration<double, std::milli>(e->at_ - at_).count();
  }

 private:
  bool timing_;
  bool recorded_ = false;
  std::chrono::steady_clock::time_point at_;
};

class CpuBackend final : public DeviceBackend {
 public:
  CpuBackend() { counting_allocator(); }

  const std::string& name() const override { return name_; }
  c10::Device device() const override { return c10::Device(c10::DeviceType::CPU); }
  bool is_available() const override { return true; }
  int device_count() const override { return 1; }
  void set_device_index(int index) const override {
    LF_CHECK(index == 0, "the CPU backend has one device (index 0); asked for ", index,
             lf::hint("LOONGFORGE_DEVICE=cpu ignores LOCAL_RANK: bind with index 0"));
  }

  MemoryStats memory_stats() const override {
    auto& a = counting_allocator();
    MemoryStats s;
    s.supported = true;
    s.allocated_bytes = a.allocated();
    s.peak_allocated_bytes = a.peak();
    s.reserved_bytes = s.allocated_bytes;
    s.num_allocations = a.count();
    return s;
  }
  void reset_peak_memory() const override { counting_allocator().reset_peak(); }
  void synchronize() const override {}

  c10::Stream current_stream() const override {
    return c10::Stream(c10::Stream::DEFAULT, device());
  }
  c10::Stream new_stream() const override { return current_stream(); }
  void set_current_stream(const c10::Stream& stream) const override {
    LF_CHECK(stream.device_type() == c10::DeviceType::CPU,
             "set_current_stream: the CPU backend cannot use a stream of ", stream.device());
  }
  void stream_wait_event(const c10::Stream&, const Event&) const override {}
  std::unique_ptr<Event> create_event(bool enable_timing) const override {
    return std::make_unique<CpuEvent>(enable_timing);
  }

  void manual_seed(uint64_t seed) const override {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  std::vector<uint8_t> rng_state() const override {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    at::Tensor state = gen.get_state();  // uint8 [n]
    const auto* p = state.data_ptr<uint8_t>();
    return std::vector<uint8_t>(p, p + state.numel());
  }
  void set_rng_state(const std::vector<uint8_t>& state) const override {
    auto t = at::empty({static_cast<int64_t>(state.size())}, at::kByte);
    std::memcpy(t.data_ptr<uint8_t>(), state.data(), state.size());
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(t);
  }

  std::unique_ptr<Communicator> create_communicator(const CommunicatorSpec& spec) const override {
    return make_gloo_communicator(spec);
  }
  const OpTable& ops() const override { return ops_; }

 private:
  std::string name_ = "cpu";
  CpuOps ops_;
};

}  // namespace

const DeviceBackend& cpu_backend() {
  static CpuBackend* instance = new CpuBackend();  // never destroyed: see CountingCpuAllocator
  return *instance;
}

}  // namespace lf::backend

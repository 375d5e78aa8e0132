// The CPU backend: the reference ops, Gloo communicators, the default CPU generator, and memory
// statistics from a counting, caching wrapper around c10's CPU allocator (installed when the
// backend is first created; memory allocated before that is not counted). Streams and events are trivial
// because CPU work is finished when the call returns.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>
#include <mutex>

#include "loongforge/backend/shm_communicator.h"
#include "cpu_ops.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"

namespace lf::backend {
namespace {

// c10's CPU allocation (alloc_cpu: aligned, honours c10's CPU memory settings) with live and peak
// byte counts, and a cache of freed large blocks. Each block carries its size and capacity in a
// header just before the data, so the DataPtr's context is the data pointer itself, as ATen
// kernels that use raw_allocate require. Never destroyed: tensors may outlive any static object.
//
// The cache: glibc serves blocks above its mmap threshold (at most 32 MiB) with a fresh mmap and
// unmaps them on free (or trims its heap), so every large tensor of every step (the logits,
// activations, gradients) is faulted in page by page and zeroed by the kernel again. Blocks of at
// least 64 KiB are rounded up to 1/16 of their power of two and kept on free, by capacity, for the
// next request of that capacity (or, when none of it is cached, of up to half of it: take_cached),
// up to LOONGFORGE_CPU_ALLOCATOR_CACHE_MB (default 1024; 0 turns the cache off). Live plus cached
// bytes stay within the highest live total seen so far: a block is kept only if it fits under that
// mark, and before a fresh allocation the cache gives back what the new block would push above it
// (the smallest block that covers the overshoot, else the largest first), so the cache never makes
// the process larger than its own peak of live tensors (a cache that only checked on free held ~170
// MiB above the peak at llama_100m: blocks of one size kept while the peak was reached with other
// sizes). A failed allocation empties the cache and tries once more. The minimum was 1 MiB; pi05's
// bench step then took 823 page faults (its [448, 512] fp32 activations are 896 KiB), 136 with 64
// KiB, and ~86 -> ~82.5 ms a step at 1 thread; llama_10m's step and peak RSS (+1.8%) barely move.
//
// Cached capacities of 1 MiB and more are mapped (mmap) and unmapped by the allocator itself, not
// taken from glibc: glibc's mmap threshold grows to 32 MiB as large blocks are freed, after which
// blocks up to that size come from its heap, and what the cache gave back stayed there
// (fragments, or a free top below the 64 MiB trim threshold). Mapping them took 27 MB off
// llama_100m's peak RSS (1948 -> 1920 MB) and 17 off llama_10m's, with the same page faults: the
// cache keeps the blocks a step reuses. Fixing glibc's threshold instead (mallopt; 128 KiB or 1
// MiB) returned 21-32 MiB but faulted blocks the cache does not hold in every step (llama_10m:
// system time 0.5 -> 0.86 s over 20 steps, -5% tokens/s).
class CountingCpuAllocator final : public c10::Allocator {
 public:
  // A multiple of c10's alignment (64), so the data keeps alloc_cpu's alignment.
  static constexpr size_t kHeader = 64;
  static constexpr size_t kCacheMin = size_t{1} << 16;
  static constexpr size_t kMapMin = size_t{1} << 20;

  CountingCpuAllocator() {
    const char* env = std::getenv("LOONGFORGE_CPU_ALLOCATOR_CACHE_MB");
    int64_t mb = 1024;
    if (env && *env) {
      char* end = nullptr;
      mb = std::strtoll(env, &end, 10);
      LF_CHECK(end && *end == '\0' && mb >= 0, "LOONGFORGE_CPU_ALLOCATOR_CACHE_MB='", env,
               "' is not a number of MiB >= 0", lf::hint("unset it (1024), or 0 to turn the cache off"));
    }
    cache_limit_ = static_cast<size_t>(mb) << 20;
  }

  c10::DataPtr allocate(size_t n) override {
    const size_t want = capacity(n);
    size_t cap = want;
    char* base = cap ? take_cached(cap) : nullptr;
    if (!base) base = fresh(cap ? cap : n, cap);
    auto* header = reinterpret_cast<int64_t*>(base);
    header[0] = static_cast<int64_t>(n);
    header[1] = static_cast<int64_t>(cap);
    void* data = base + kHeader;
    const int64_t now = allocated_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    const int64_t held = now + (slack_ += static_cast<int64_t>(cap - want));
    for (auto [mark, value] : {std::pair{&peak_, now}, std::pair{&high_, held}}) {
      int64_t seen = mark->load();
      while (value > seen && !mark->compare_exchange_weak(seen, value)) {
      }
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
  int64_t cached() const { return static_cast<int64_t>(cached_.load()); }
  int64_t slack() const { return slack_.load(); }
  void reset_peak() { peak_.store(allocated_.load()); }
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [cap, blocks] : free_) {
      for (char* b : blocks) release(b, cap);
      cached_ -= cap * blocks.size();
      blocks.clear();
    }
  }

 private:
  static void free_block(void* data);

  // The cached capacity for a request of n bytes, 0 for blocks not cached.
  size_t capacity(size_t n) const {
    if (cache_limit_ == 0 || n < kCacheMin) return 0;
    size_t pow2 = kCacheMin;
    while (pow2 <= n / 2) pow2 <<= 1;
    const size_t step = pow2 / 16;
    return (n + step - 1) / step * step;
  }
  // A cached block of capacity cap, else the smallest one up to twice as large (cap is then set to
  // its capacity; the unused part counts as held, slack_): tensors whose size varies from step to
  // step (MoE's expert-parallel rows: the all-to-all's received rows, their regrouping) reuse the
  // last step's blocks instead of mapping fresh pages. On the CCT config at EP 2 (moe_cct.yaml),
  // exact capacities only: 125k page faults and ~215 ms of system time a step over both ranks; a
  // quarter larger: 73k; half: 38k; twice: 28k and ~48 ms (EP 1: 13k); with grow_cached too: 14k.
  // Repeating sizes (dense models) still find their own capacity first.
  char* take_cached(size_t& cap) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.lower_bound(cap); it != free_.end() && it->first <= 2 * cap; ++it) {
      if (it->second.empty()) continue;
      char* b = it->second.back();
      it->second.pop_back();
      cap = it->first;
      cached_ -= cap;
      return b;
    }
    return nullptr;
  }
  // Blocks of capacity >= kMapMin: their own mapping (see above); the rest: c10's alloc_cpu.
  static char* map(size_t bytes) {
    void* p = mmap(nullptr, bytes + kHeader, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return static_cast<char*>(p);
  }
  static void release(char* base, size_t cap) {
    if (cap >= kMapMin)
      munmap(base, cap + kHeader);
    else
      c10::free_cpu(base);
  }
  char* fresh(size_t bytes, size_t cap) {
    if (cap >= kMapMin)
      if (char* grown = grow_cached(cap)) return grown;
    make_room(bytes);
    try {
      return cap >= kMapMin ? map(cap) : static_cast<char*>(c10::alloc_cpu(bytes + kHeader));
    } catch (const std::exception&) {
      empty_cache();
      return cap >= kMapMin ? map(cap) : static_cast<char*>(c10::alloc_cpu(bytes + kHeader));
    }
  }
  // The largest cached mapped block smaller than cap, remapped to cap (its pages stay resident:
  // only the growth is faulted in), or null. Under the same rule as a fresh block: only when the
  // cache can give up that block and stay within the peak with the growth added.
  char* grow_cached(size_t cap) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.lower_bound(cap);
    while (it != free_.begin()) {
      --it;
      if (it->first < kMapMin) return nullptr;
      if (it->second.empty()) continue;
      const size_t old = it->first;
      const int64_t after = allocated_.load() + slack_.load() + static_cast<int64_t>(cached_ - old + cap);
      if (after > std::max<int64_t>(high_.load(), allocated_.load() + slack_.load() + static_cast<int64_t>(cap)))
        return nullptr;
      char* base = it->second.back();
      void* p = mremap(base, old + kHeader, cap + kHeader, MREMAP_MAYMOVE);
      if (p == MAP_FAILED) return nullptr;
      it->second.pop_back();
      cached_ -= old;
      return static_cast<char*>(p);
    }
    return nullptr;
  }
  // Frees cached blocks until live + cached + bytes is within the highest live total (or, when the
  // new block makes a new peak, until the cache is empty): the smallest block that covers the
  // overshoot, else the largest and on again, so a small overshoot does not cost a big block.
  void make_room(size_t bytes) {
    if (cached_.load() == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t live_after = allocated_.load() + slack_.load() + static_cast<int64_t>(bytes);
    const int64_t mark = std::max(high_.load(), live_after);
    while (cached_ > 0 && live_after + static_cast<int64_t>(cached_) > mark) {
      // The smallest block that covers the overshoot alone, else the largest (and go on).
      const size_t over = static_cast<size_t>(live_after + static_cast<int64_t>(cached_) - mark);
      auto pick = free_.end(), largest = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second.empty()) continue;
        if (largest == free_.end() || it->first > largest->first) largest = it;
        if (it->first >= over && (pick == free_.end() || it->first < pick->first)) pick = it;
      }
      if (pick == free_.end()) pick = largest;
      if (pick == free_.end()) break;
      release(pick->second.back(), pick->first);
      pick->second.pop_back();
      cached_ -= pick->first;
    }
  }
  // Keeps a freed block for reuse when it fits under the limit; false: free it.
  bool keep(char* base, size_t cap) {
    if (cap == 0) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_ + cap > cache_limit_) return false;
    if (allocated_.load() + slack_.load() + static_cast<int64_t>(cached_ + cap) > high_.load()) return false;
    free_[cap].push_back(base);
    cached_ += cap;
    return true;
  }

  std::atomic<int64_t> allocated_{0}, peak_{0}, count_{0};
  // The highest live total ever, counting the unused part of larger cached blocks that served smaller
  // requests (slack_); reset_peak does not lower it.
  std::atomic<int64_t> high_{0}, slack_{0};
  size_t cache_limit_ = 0;
  std::mutex mutex_;
  std::map<size_t, std::vector<char*>> free_;  // by capacity
  std::atomic<size_t> cached_{0};
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
  const auto* header = reinterpret_cast<const int64_t*>(base);
  auto& a = counting_allocator();
  a.allocated_.fetch_sub(header[0]);
  a.slack_ -= header[1] - static_cast<int64_t>(a.capacity(static_cast<size_t>(header[0])));
  if (!a.keep(base, static_cast<size_t>(header[1]))) a.release(base, static_cast<size_t>(header[1]));
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
    s.reserved_bytes = s.allocated_bytes + a.slack() + a.cached();
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
    return make_cpu_communicator(spec);
  }
  const OpTable& ops() const override { return ops_; }

 private:
  std::string name_ = "cpu";
  CpuOps ops_;
};

}  // namespace

const DeviceBackend& cpu_backend() {
  init_cpu_math();
  static CpuBackend* instance = new CpuBackend();  // never destroyed: see CountingCpuAllocator
  return *instance;
}

}  // namespace lf::backend

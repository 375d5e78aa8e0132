// DeviceBackend: what the engine needs from one kind of device (cpu, cuda, xpu): its device
// type, memory statistics, streams/events/synchronize, RNG state, a communicator factory and the
// fused-op table. Implementations live in backends/; choosing one is backend/registry.h.
// Not a tensor library: tensors are ATen's, on device().
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/backend/communicator.h"
#include "loongforge/backend/op_table.h"

namespace lf::backend {

// Builds one process group's communicator; what dist::ParallelContext is given.
using CommunicatorFactory =
    std::function<std::unique_ptr<Communicator>(const CommunicatorSpec&)>;

struct MemoryStats {
  bool supported = false;          // false: the counters below are meaningless
  int64_t allocated_bytes = 0;     // live tensor memory
  int64_t peak_allocated_bytes = 0;  // max of allocated_bytes since the last reset_peak_memory
  int64_t reserved_bytes = 0;      // held by the allocator (caching allocators); else = allocated
  int64_t num_allocations = 0;     // allocations since start
};

// A marker in a stream. record() captures the work queued so far on the stream; synchronize()
// blocks the host until it is done. On the CPU work is done when queued, so events complete
// at once (timing still works: it reads the host clock at record()).
class Event {
 public:
  virtual ~Event() = default;
  virtual void record(const c10::Stream& stream) = 0;
  virtual bool query() const = 0;   // true when the recorded work has finished
  virtual void synchronize() const = 0;
  // Milliseconds from this event to `end` (both recorded, created with timing enabled).
  virtual double elapsed_ms(const Event& end) const = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual const std::string& name() const = 0;  // "cpu", "cuda", "xpu"
  // Device of the tensors this backend computes on (cuda: the current device index).
  virtual c10::Device device() const = 0;
  virtual bool is_available() const = 0;
  virtual int device_count() const = 0;
  // Binds this process to device `index` (e.g. LOCAL_RANK). CPU: only 0 is valid.
  virtual void set_device_index(int index) const = 0;

  virtual MemoryStats memory_stats() const = 0;
  virtual void reset_peak_memory() const = 0;
  // Blocks until all work queued on the current device has finished.
  virtual void synchronize() const = 0;

  // Streams are c10::Stream values of device(); the CPU has only its default stream.
  virtual c10::Stream current_stream() const = 0;
  virtual c10::Stream new_stream() const = 0;  // CPU: the default stream
  virtual void set_current_stream(const c10::Stream& stream) const = 0;
  // Later work on `stream` waits for `event` (without blocking the host).
  virtual void stream_wait_event(const c10::Stream& stream, const Event& event) const = 0;
  virtual std::unique_ptr<Event> create_event(bool enable_timing = false) const = 0;

  // RNG of device(): the default ATen generator's state as opaque bytes (same format that
  // set_rng_state accepts; not portable across backends).
  virtual void manual_seed(uint64_t seed) const = 0;
  virtual std::vector<uint8_t> rng_state() const = 0;
  virtual void set_rng_state(const std::vector<uint8_t>& state) const = 0;

  // A communicator for one group, on this backend's engine (Gloo, NCCL, the plugin's).
  virtual std::unique_ptr<Communicator> create_communicator(const CommunicatorSpec& spec) const = 0;
  // create_communicator as a value; the backend must outlive the factory.
  CommunicatorFactory communicator_factory() const;

  virtual const OpTable& ops() const = 0;
};

}  // namespace lf::backend

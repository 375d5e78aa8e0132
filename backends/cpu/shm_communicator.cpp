// SharedMemoryCommunicator (see backend/shm_communicator.h).
//
// The segment: one page of header and per-member lines (a phase counter that doubles as a futex
// word, a failure flag, the pid), then two sets of N slots of slot_bytes each. A collective walks
// its data in chunks that fit a slot; chunk k uses set k % 2, so a member may start chunk k + 1
// while a slower peer still reads chunk k. Every step ends with "publish my phase, wait until
// every member has published it" (wait_peers). For all_reduce, per chunk:
//   1. copy my chunk into my slot;                          publish, wait
//   2. reduce 1/N of the chunk (my slice) over all slots into my slot's slice; publish, wait
//   3. copy every member's reduced slice into my tensor.
// Reusing a set two chunks later is safe: a member that writes set p again for chunk k + 2 has
// seen every member publish step 1 of chunk k + 1, which each did after its step 3 of chunk k.
// reduce_scatter and all_gather need one wait per chunk (each member reads what it needs once).
// The member that reduces a slice reduces it for everyone, in rank order, so every member ends
// with the same bits.
#include "loongforge/backend/shm_communicator.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/core/strings.h"

namespace lf::backend {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x4c4653484d310001ULL;
constexpr int64_t kPage = 4096;

struct Header {
  uint64_t magic;
  uint64_t token;
  int64_t size;
  int64_t slot_bytes;
};

// One cache line per member, so publishing does not contend with the peers' lines.
struct alignas(64) MemberLine {
  uint32_t phase;   // futex word: the last step this member finished
  uint32_t failed;  // 1 once a collective failed on this member
  int32_t pid;
  uint64_t pid_ns;  // /proc/self/ns/pid inode: pids are comparable only within one namespace
};
static_assert(sizeof(MemberLine) == 64);

int64_t data_offset(int64_t n) {
  return (64 + n * static_cast<int64_t>(sizeof(MemberLine)) + kPage - 1) / kPage * kPage;
}

uint64_t pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Exited, or a zombie its parent has not reaped yet (kill() still succeeds on those).
bool process_gone(int pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() &&
         (stat[close + 2] == 'Z' || stat[close + 2] == 'X');
}

void futex_wait(uint32_t* word, uint32_t expected, std::chrono::microseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000),
              static_cast<long>(timeout.count() % 1000000) * 1000};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// ---- element-wise reduction of n elements from N sources into dst (dst may be a source) ----

template <class T, class A, class F>
void reduce_typed(char* dst, const char* const* srcs, int n_src, int64_t n, F f, int avg_divisor) {
  constexpr int64_t kBlock = 512;
  A acc[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t b = std::min(kBlock, n - i0);
    const T* s0 = reinterpret_cast<const T*>(srcs[0]) + i0;
    for (int64_t i = 0; i < b; ++i) acc[i] = static_cast<A>(s0[i]);
    for (int s = 1; s < n_src; ++s) {
      const T* sp = reinterpret_cast<const T*>(srcs[s]) + i0;
      for (int64_t i = 0; i < b; ++i) acc[i] = f(acc[i], static_cast<A>(sp[i]));
    }
    if (avg_divisor > 1)  // integers truncate, as the Gloo path's divide does
      for (int64_t i = 0; i < b; ++i) acc[i] = static_cast<A>(acc[i] / static_cast<A>(avg_divisor));
    T* d = reinterpret_cast<T*>(dst) + i0;
    for (int64_t i = 0; i < b; ++i) d[i] = static_cast<T>(acc[i]);
  }
}

template <class T, class A>
void reduce_op(char* dst, const char* const* srcs, int n_src, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return reduce_typed<T, A>(dst, srcs, n_src, n, [](A a, A b) { return static_cast<A>(a + b); },
                                op == ReduceOp::avg ? n_src : 1);
    case ReduceOp::product:
      return reduce_typed<T, A>(dst, srcs, n_src, n, [](A a, A b) { return static_cast<A>(a * b); }, 1);
    case ReduceOp::max:
      return reduce_typed<T, A>(dst, srcs, n_src, n, [](A a, A b) { return a < b ? b : a; }, 1);
    case ReduceOp::min:
      return reduce_typed<T, A>(dst, srcs, n_src, n, [](A a, A b) { return b < a ? b : a; }, 1);
  }
}

// The dtypes the shared-memory path reduces; others go to the wrapped communicator.
bool reducible(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kBFloat16: case at::kHalf: case at::kLong:
    case at::kInt: case at::kShort: case at::kChar: case at::kByte:
      return true;
    default:
      return false;
  }
}

void reduce(at::ScalarType t, char* dst, const char* const* srcs, int n_src, int64_t n,
            ReduceOp op) {
  switch (t) {
    case at::kFloat: return reduce_op<float, float>(dst, srcs, n_src, n, op);
    case at::kDouble: return reduce_op<double, double>(dst, srcs, n_src, n, op);
    // Half precisions accumulate in fp32 and round once.
    case at::kBFloat16: return reduce_op<c10::BFloat16, float>(dst, srcs, n_src, n, op);
    case at::kHalf: return reduce_op<c10::Half, float>(dst, srcs, n_src, n, op);
    case at::kLong: return reduce_op<int64_t, int64_t>(dst, srcs, n_src, n, op);
    case at::kInt: return reduce_op<int32_t, int32_t>(dst, srcs, n_src, n, op);
    case at::kShort: return reduce_op<int16_t, int16_t>(dst, srcs, n_src, n, op);
    case at::kChar: return reduce_op<int8_t, int8_t>(dst, srcs, n_src, n, op);
    case at::kByte: return reduce_op<uint8_t, uint8_t>(dst, srcs, n_src, n, op);
    default: LF_FAIL("shared-memory reduction of dtype ", t, " is not implemented");
  }
}

// ---- one thread per group runs its shared-memory ops in issue order ----

class SerialExecutor {
 public:
  ~SerialExecutor() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::shared_future<void> submit(std::function<void()> job) {
    std::packaged_task<void()> task(std::move(job));
    std::shared_future<void> done = task.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
    return done;
  }

  // Runs on the calling thread when nothing is queued or running, else after what is.
  void run(const std::function<void()>& job) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!queue_.empty() || busy_) {
      lock.unlock();
      submit(job).get();
      return;
    }
    busy_ = true;
    lock.unlock();
    struct Idle {
      SerialExecutor* e;
      ~Idle() {
        { std::lock_guard<std::mutex> l(e->mutex_); e->busy_ = false; }
        e->cv_.notify_all();
      }
    } idle{this};
    job();
  }

  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return (stop_ && queue_.empty()) || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;
      std::packaged_task<void()> task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      task();  // an exception lands in the task's future
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

class FutureWork final : public Work {
 public:
  explicit FutureWork(std::shared_future<void> f) : f_(std::move(f)) {}
  void wait() override { f_.get(); }
  bool is_completed() override {
    return f_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> f_;
};

class SharedMemoryCommunicator final : public Communicator {
 public:
  SharedMemoryCommunicator(std::unique_ptr<Communicator> inner, const CommunicatorSpec& spec,
                           char* base, int64_t bytes, int64_t slot_bytes)
      : inner_(std::move(inner)), timeout_(spec.timeout), base_(base), bytes_(bytes),
        slot_bytes_(slot_bytes), n_(inner_->size()), me_(inner_->rank()),
        my_pid_ns_(pid_namespace()) {}

  ~SharedMemoryCommunicator() override {
    executor_.reset();  // finishes queued ops first
    munmap(base_, static_cast<size_t>(bytes_));
  }

  int rank() const override { return me_; }
  int size() const override { return n_; }
  const std::string& name() const override { return inner_->name(); }
  const std::vector<int>& ranks() const override { return inner_->ranks(); }

  std::shared_ptr<Work> all_reduce(at::Tensor& tensor, ReduceOp op, bool async) override {
    if (!on_cpu(tensor) || !reducible(tensor.scalar_type()))
      return inner_->all_reduce(tensor, op, async);
    at::Tensor t = tensor;
    return dispatch(async, [this, t, op] { run_all_reduce(t, op); });
  }

  std::shared_ptr<Work> reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                       bool async) override {
    if (!on_cpu(output) || !on_cpu(input) || !reducible(output.scalar_type()) ||
        input.scalar_type() != output.scalar_type() || input.numel() != output.numel() * n_ ||
        output.dim() < 1 || input.dim() != output.dim() || input.size(0) != output.size(0) * n_ ||
        overlaps(output, input))
      return inner_->reduce_scatter(output, input, op, async);
    at::Tensor out = output, in = input;
    return dispatch(async, [this, out, in, op] { run_reduce_scatter(out, in, op); });
  }

  std::shared_ptr<Work> all_gather(at::Tensor& output, const at::Tensor& input,
                                   bool async) override {
    if (!on_cpu(output) || !on_cpu(input) || input.scalar_type() != output.scalar_type() ||
        output.numel() != input.numel() * n_ || input.dim() < 1 ||
        output.dim() != input.dim() || output.size(0) != input.size(0) * n_)
      return inner_->all_gather(output, input, async);
    at::Tensor out = output;
    // In place (the input is this member's part of the output, as ZeRO-1 gathers) needs no copy;
    // any other overlap reads from a copy.
    const char* own = static_cast<const char*>(output.data_ptr()) + me_ * input.nbytes();
    at::Tensor in = overlaps(output, input) && input.data_ptr() != own ? input.clone() : input;
    return dispatch(async, [this, out, in] { run_all_gather(out, in); });
  }

  std::shared_ptr<Work> broadcast(at::Tensor& tensor, int root, bool async) override {
    return inner_->broadcast(tensor, root, async);
  }
  std::shared_ptr<Work> all_to_all(at::Tensor& output, const at::Tensor& input,
                                   const std::vector<int64_t>& output_splits,
                                   const std::vector<int64_t>& input_splits,
                                   bool async) override {
    std::vector<int64_t> send, recv;  // bytes to / from each member
    if (!on_cpu(output) || !on_cpu(input) || input.scalar_type() != output.scalar_type() ||
        !byte_splits(input, input_splits, send) || !byte_splits(output, output_splits, recv) ||
        send[me_] != recv[me_] || overlaps(output, input))
      return inner_->all_to_all(output, input, output_splits, input_splits, async);
    at::Tensor out = output, in = input;
    return dispatch(async, [this, out, in, send = std::move(send), recv = std::move(recv)] {
      run_all_to_all(out, in, send, recv);
    });
  }
  std::shared_ptr<Work> send(const at::Tensor& tensor, int dst, int tag, bool async) override {
    return inner_->send(tensor, dst, tag, async);
  }
  std::shared_ptr<Work> recv(at::Tensor& tensor, int src, int tag, bool async) override {
    return inner_->recv(tensor, src, tag, async);
  }
  // Also waits for this member's queued shared-memory ops, as Gloo's barrier waits for its own.
  void barrier() override {
    executor_->drain();
    inner_->barrier();
  }

 private:
  static bool on_cpu(const at::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.is_contiguous() && !t.is_sparse();
  }
  static bool overlaps(const at::Tensor& a, const at::Tensor& b) {
    const char* a0 = static_cast<const char*>(a.data_ptr());
    const char* b0 = static_cast<const char*>(b.data_ptr());
    return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
  }

  std::shared_ptr<Work> dispatch(bool async, std::function<void()> job) {
    if (async) return std::make_shared<FutureWork>(executor_->submit(std::move(job)));
    executor_->run(job);
    return nullptr;
  }

  MemberLine& line(int member) const {
    return reinterpret_cast<MemberLine*>(base_ + 64)[member];
  }
  char* slot(int set, int member) const {
    return base_ + data_offset(n_) + (static_cast<int64_t>(set) * n_ + member) * slot_bytes_;
  }

  void publish() {
    ++phase_;
    std::atomic_ref<uint32_t>(line(me_).phase).store(phase_, std::memory_order_release);
    futex_wake(&line(me_).phase);
  }

  bool reached(int member) const {
    const uint32_t p = std::atomic_ref<uint32_t>(line(member).phase).load(std::memory_order_acquire);
    return static_cast<int32_t>(p - phase_) >= 0;
  }

  [[noreturn]] void fail(const char* op, const std::string& why) {
    broken_ = true;
    std::atomic_ref<uint32_t>(line(me_).failed).store(1, std::memory_order_release);
    futex_wake(&line(me_).phase);
    LF_FAIL(describe_group_op(op, name(), ranks(), me_), " failed: ", why,
            lf::hint(collective_failure_hint(timeout_)));
  }

  // Why the peers cannot get here: one failed, one exited, or the group's timeout passed.
  void check_peers(const char* op, Clock::time_point start) {
    for (int s = 0; s < n_; ++s) {
      if (s == me_ || reached(s)) continue;
      MemberLine& l = line(s);
      if (std::atomic_ref<uint32_t>(l.failed).load(std::memory_order_acquire))
        fail(op, lf::str("a collective failed on group rank ", s, " (global rank ", ranks()[s],
                         "); this shared-memory step cannot complete"));
      if (l.pid_ns != 0 && l.pid_ns == my_pid_ns_ && process_gone(l.pid))
        fail(op, lf::str("group rank ", s, " (global rank ", ranks()[s], ", pid ", l.pid,
                         ") has exited"));
    }
    if (Clock::now() - start > timeout_) {
      std::vector<int> late;
      for (int s = 0; s < n_; ++s)
        if (s != me_ && !reached(s)) late.push_back(ranks()[s]);
      fail(op, lf::str("timed out after ", timeout_.count() / 1000.0,
                       " s in shared memory waiting for global rank(s) ", lf::bracket_list(late)));
    }
  }

  // Publishes this member's step and waits until every member has published it.
  void sync(const char* op, Clock::time_point start) {
    publish();
    for (int s = 0; s < n_; ++s) {
      if (s == me_) continue;
      const auto spin_until = Clock::now() + std::chrono::microseconds(20);
      auto next_check = Clock::now() + std::chrono::milliseconds(50);
      while (!reached(s)) {
        const auto now = Clock::now();
        if (now < spin_until) {
          for (int i = 0; i < 64; ++i) cpu_relax();
          continue;
        }
        const uint32_t seen =
            std::atomic_ref<uint32_t>(line(s).phase).load(std::memory_order_acquire);
        if (static_cast<int32_t>(seen - phase_) >= 0) break;
        futex_wait(&line(s).phase, seen, std::chrono::milliseconds(2));
        if (Clock::now() >= next_check) {
          check_peers(op, start);
          next_check = Clock::now() + std::chrono::milliseconds(50);
        }
      }
    }
  }

  void check_usable(const char* op) {
    if (broken_)
      fail(op, "an earlier collective on this group failed, so its members' shared-memory steps "
               "are out of step");
  }

  void run_all_reduce(const at::Tensor& t, ReduceOp op) {
    const char* name = "all_reduce";
    check_usable(name);
    const auto start = Clock::now();
    const int64_t es = static_cast<int64_t>(t.element_size()), n = t.numel();
    const int64_t per = slot_bytes_ / es;
    char* data = static_cast<char*>(t.data_ptr());
    std::vector<const char*> srcs(static_cast<size_t>(n_));
    for (int64_t a = 0; a < n; a += per) {
      const int64_t c = std::min(per, n - a);
      const int set = static_cast<int>(chunk_++ & 1);
      char* mine = data + a * es;
      std::memcpy(slot(set, me_), mine, static_cast<size_t>(c * es));
      sync(name, start);
      const int64_t lo = c * me_ / n_, hi = c * (me_ + 1) / n_;
      for (int s = 0; s < n_; ++s) srcs[s] = (s == me_ ? mine : slot(set, s)) + lo * es;
      reduce(t.scalar_type(), slot(set, me_) + lo * es, srcs.data(), n_, hi - lo, op);
      sync(name, start);
      for (int s = 0; s < n_; ++s) {
        const int64_t slo = c * s / n_, shi = c * (s + 1) / n_;
        std::memcpy(mine + slo * es, slot(set, s) + slo * es, static_cast<size_t>((shi - slo) * es));
      }
    }
  }

  void run_reduce_scatter(const at::Tensor& out, const at::Tensor& in_any, ReduceOp op) {
    const char* name = "reduce_scatter";
    check_usable(name);
    const auto start = Clock::now();
    const at::Tensor in = in_any.contiguous();
    const int64_t es = static_cast<int64_t>(out.element_size()), m = out.numel();
    const int64_t per = slot_bytes_ / es / n_;
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    std::vector<const char*> srcs(static_cast<size_t>(n_));
    for (int64_t a = 0; a < m; a += per) {
      const int64_t c = std::min(per, m - a);
      const int set = static_cast<int>(chunk_++ & 1);
      for (int s = 0; s < n_; ++s)  // the pieces the peers reduce; mine is read in place
        if (s != me_)
          std::memcpy(slot(set, me_) + s * c * es, src + (s * m + a) * es,
                      static_cast<size_t>(c * es));
      sync(name, start);
      for (int s = 0; s < n_; ++s)
        srcs[s] = s == me_ ? src + (me_ * m + a) * es : slot(set, s) + me_ * c * es;
      reduce(out.scalar_type(), dst + a * es, srcs.data(), n_, c, op);
    }
  }

  // The bytes of each member's rows of `t` (split along dim 0 by `splits`, or evenly when empty);
  // false when they do not add up (the wrapped communicator then reports it).
  bool byte_splits(const at::Tensor& t, const std::vector<int64_t>& splits, std::vector<int64_t>& bytes) const {
    if (t.dim() < 1) return false;
    const int64_t rows = t.size(0);
    int64_t row_bytes = t.element_size();
    for (int64_t d = 1; d < t.dim(); ++d) row_bytes *= t.size(d);
    if (splits.empty()) {
      if (rows % n_ != 0) return false;
      bytes.assign(static_cast<size_t>(n_), rows / n_ * row_bytes);
      return true;
    }
    if (static_cast<int>(splits.size()) != n_) return false;
    int64_t total = 0;
    for (int64_t s : splits) {
      if (s < 0) return false;
      total += s;
      bytes.push_back(s * row_bytes);
    }
    return total == rows;
  }

  // Uneven all-to-all: each member's slot holds one piece per destination (slot / n bytes each);
  // rounds move up to that much of every pair's data, as many rounds as the largest pair needs
  // (agreed in a first step: each member knows only its own pairs' sizes). Its own rows are copied
  // directly.
  void run_all_to_all(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& send,
                      const std::vector<int64_t>& recv) {
    const char* name = "all_to_all";
    check_usable(name);
    const auto start = Clock::now();
    const int64_t piece = slot_bytes_ / n_ / 64 * 64;
    LF_CHECK(piece > 0, "shared-memory all_to_all: slots of ", slot_bytes_, " bytes are too small for ", n_,
             " members");
    std::vector<int64_t> send_at(static_cast<size_t>(n_), 0), recv_at(static_cast<size_t>(n_), 0);
    int64_t mine = 0;
    for (int s = 1; s < n_; ++s) send_at[s] = send_at[s - 1] + send[s - 1], recv_at[s] = recv_at[s - 1] + recv[s - 1];
    for (int s = 0; s < n_; ++s)
      if (s != me_) mine = std::max({mine, (send[s] + piece - 1) / piece, (recv[s] + piece - 1) / piece});
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    if (send[me_] > 0) std::memcpy(dst + recv_at[me_], src + send_at[me_], static_cast<size_t>(send[me_]));
    int set = static_cast<int>(chunk_++ & 1);
    std::memcpy(slot(set, me_), &mine, sizeof mine);
    sync(name, start);
    int64_t rounds = 0;
    for (int s = 0; s < n_; ++s) {
      int64_t r = 0;
      std::memcpy(&r, slot(set, s), sizeof r);
      rounds = std::max(rounds, r);
    }
    for (int64_t r = 0; r < rounds; ++r) {
      set = static_cast<int>(chunk_++ & 1);
      const int64_t at = r * piece;
      for (int d = 0; d < n_; ++d)
        if (d != me_ && send[d] > at)
          std::memcpy(slot(set, me_) + d * piece, src + send_at[d] + at,
                      static_cast<size_t>(std::min(piece, send[d] - at)));
      sync(name, start);
      for (int s = 0; s < n_; ++s)
        if (s != me_ && recv[s] > at)
          std::memcpy(dst + recv_at[s] + at, slot(set, s) + me_ * piece,
                      static_cast<size_t>(std::min(piece, recv[s] - at)));
    }
  }

  void run_all_gather(const at::Tensor& out, const at::Tensor& in_any) {
    const char* name = "all_gather";
    check_usable(name);
    const auto start = Clock::now();
    const at::Tensor in = in_any.contiguous();
    const int64_t es = static_cast<int64_t>(in.element_size()), m = in.numel();
    const int64_t per = slot_bytes_ / es;
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    for (int64_t a = 0; a < m; a += per) {
      const int64_t c = std::min(per, m - a);
      const int set = static_cast<int>(chunk_++ & 1);
      std::memcpy(slot(set, me_), src + a * es, static_cast<size_t>(c * es));
      sync(name, start);
      for (int s = 0; s < n_; ++s) {
        char* to = dst + (s * m + a) * es;
        const char* from = s == me_ ? src + a * es : slot(set, s);
        if (to != from) std::memcpy(to, from, static_cast<size_t>(c * es));
      }
    }
  }

  std::unique_ptr<Communicator> inner_;
  std::chrono::milliseconds timeout_;
  char* base_;
  int64_t bytes_;
  int64_t slot_bytes_;
  int n_, me_;
  uint64_t my_pid_ns_;
  // Touched only by the op that runs (ops run one at a time, in issue order).
  uint32_t phase_ = 0;
  uint64_t chunk_ = 0;
  bool broken_ = false;
  std::unique_ptr<SerialExecutor> executor_ = std::make_unique<SerialExecutor>();
};

// "1" (default) or "0", from LOONGFORGE_SHM_COLLECTIVES (shm_collectives_enabled).
bool enabled_by_env() {
  const char* v = std::getenv("LOONGFORGE_SHM_COLLECTIVES");
  if (!v || !*v) return true;
  const std::string s = v;
  if (s == "1" || s == "on" || s == "auto") return true;
  if (s == "0" || s == "off") return false;
  LF_FAIL("LOONGFORGE_SHM_COLLECTIVES='", s, "' is not 0 or 1",
          lf::hint("unset it (shared memory between the processes of one host, the default) or "
                   "set it to 0 to keep every collective on Gloo"));
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

bool shm_collectives_enabled() { return enabled_by_env(); }

std::unique_ptr<Communicator> with_shared_memory(std::unique_ptr<Communicator> inner,
                                                 const CommunicatorSpec& spec,
                                                 const SharedMemoryOptions& options) {
  if (!inner || inner->size() < 2 || !spec.store || !enabled_by_env()) return inner;
  const int n = inner->size(), me = inner->rank();
  const std::string what = describe_group_op("setting up shared memory", inner->name(),
                                             inner->ranks(), me);
  LF_CHECK(options.slot_bytes >= 64 * n * 8 && options.slot_bytes % 64 == 0, what,
           ": slot_bytes ", options.slot_bytes, " must be a multiple of 64 and >= ", 64 * n * 8);
  const int64_t bytes = data_offset(n) + 2 * n * options.slot_bytes;
  std::string why, shm_name, keys_prefix;
  uint64_t token = 0;
  int fd = -1;
  char* base = nullptr;
  auto map = [&] {
    void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) why = lf::str("mmap of ", bytes, " bytes: ", std::strerror(errno));
    else base = static_cast<char*>(p);
  };
  try {
    // The handshake's keys: each member draws a ticket, so the members of one handshake share
    // (ticket - 1) / n and a group set up again on the same store never reads the last one's keys.
    const int64_t ticket = spec.store->add("lf-shm/tickets", 1);
    keys_prefix = lf::str("lf-shm/", (ticket - 1) / n, "/");
    const std::string segment_key = keys_prefix + "segment";
    if (me == 0) {
      std::random_device rd;
      token = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
      shm_name = lf::str("/loongforge-", getpid(), "-", hex(token));
      fd = shm_open(shm_name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
      if (fd < 0) {
        why = lf::str("shm_open(", shm_name, "): ", std::strerror(errno));
      } else if (int rc = posix_fallocate(fd, 0, bytes); rc != 0) {
        why = lf::str("cannot reserve ", bytes, " bytes in /dev/shm: ", std::strerror(rc),
                      " (containers: raise --shm-size)");
      } else {
        map();
      }
      if (base) {
        auto* h = reinterpret_cast<Header*>(base);
        *h = Header{kMagic, token, n, options.slot_bytes};
      }
      spec.store->set(segment_key, base ? shm_name + " " + hex(token) : std::string());
    } else {
      spec.store->wait({segment_key}, spec.timeout);
      const auto v = spec.store->get(segment_key);
      const std::string value(v.begin(), v.end());
      if (value.empty()) {
        why = "group rank 0 could not create the segment";
      } else {
        shm_name = value.substr(0, value.find(' '));
        token = std::strtoull(value.substr(value.find(' ') + 1).c_str(), nullptr, 16);
        fd = shm_open(shm_name.c_str(), O_RDWR, 0600);
        struct stat st {};
        if (fd < 0) why = lf::str("shm_open(", shm_name, "): ", std::strerror(errno),
                                  " (another host or IPC namespace than group rank 0)");
        else if (fstat(fd, &st) != 0 || st.st_size != bytes)
          why = lf::str(shm_name, " has ", st.st_size, " bytes, expected ", bytes);
        else map();
        if (base) {
          const auto* h = reinterpret_cast<const Header*>(base);
          if (h->magic != kMagic || h->token != token || h->size != n) {
            why = lf::str(shm_name, " is not this group's segment");
            munmap(base, static_cast<size_t>(bytes));
            base = nullptr;
          }
        }
      }
    }
    if (base) {
      auto& l = reinterpret_cast<MemberLine*>(base + 64)[me];
      l.pid = static_cast<int32_t>(getpid());
      l.pid_ns = pid_namespace();
    }
    spec.store->set(lf::str(keys_prefix, "ok/", me), why.empty() ? std::string("ok") : why);
    std::vector<std::string> keys;
    for (int r = 0; r < n; ++r) keys.push_back(lf::str(keys_prefix, "ok/", r));
    spec.store->wait(keys, spec.timeout);
    std::string reasons;
    for (int r = 0; r < n; ++r) {
      const auto v = spec.store->get(keys[static_cast<size_t>(r)]);
      const std::string s(v.begin(), v.end());
      if (s != "ok") reasons += lf::str(reasons.empty() ? "" : "; ", "group rank ", r, ": ", s);
    }
    if (!reasons.empty()) why = reasons;
  } catch (const lf::Error&) {
    throw;
  } catch (const std::exception& e) {
    const auto* ce = dynamic_cast<const c10::Error*>(&e);
    if (base) munmap(base, static_cast<size_t>(bytes));
    if (fd >= 0) close(fd);
    if (me == 0 && !shm_name.empty()) shm_unlink(shm_name.c_str());
    LF_FAIL(what, ": the handshake through the store failed within ", spec.timeout.count(),
            " ms: ", ce ? ce->what_without_backtrace() : e.what(),
            lf::hint(collective_failure_hint(spec.timeout)));
  }
  // Every member has opened the segment or given up: the name is no longer needed, and the
  // memory goes away with the last mapping even if a process dies.
  if (me == 0 && fd >= 0) shm_unlink(shm_name.c_str());
  if (fd >= 0) close(fd);
  if (!why.empty()) {
    if (base) munmap(base, static_cast<size_t>(bytes));
    if (me == 0)
      LF_INFO("group '", inner->name(), "' (ranks ", lf::bracket_list(inner->ranks()),
              "): no shared memory, its collectives keep their usual transport: ", why);
    return inner;
  }
  return std::make_unique<SharedMemoryCommunicator>(std::move(inner), spec, base, bytes,
                                                    options.slot_bytes);
}

std::unique_ptr<Communicator> make_cpu_communicator(const CommunicatorSpec& spec,
                                                    const GlooOptions& gloo) {
  // The switch before Gloo's handshake (see shm_collectives_enabled).
  (void)shm_collectives_enabled();
  return with_shared_memory(make_gloo_communicator(spec, gloo), spec);
}

bool uses_shared_memory(const Communicator& c) {
  return dynamic_cast<const SharedMemoryCommunicator*>(&c) != nullptr;
}

}  // namespace lf::backend

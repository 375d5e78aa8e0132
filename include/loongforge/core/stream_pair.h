// Two streams of work that take turns on two threads, switching where one of them would wait for
// communication: the MoE all-to-all overlap across micro-batches (--overlap-moe-expert-parallel-comm,
// DualPipe-style) runs the forward of one micro-batch as one stream and the backward of an earlier
// one as the other; while one stream's all-to-all is in flight the other computes.
//
// Only one stream runs at any time, and they switch only at yield(): which code runs in which
// order is a function of the program alone, never of timing. So every rank of a group issues its
// collectives in the same order (no mismatched collectives, no deadlock), the streams need no
// locking of what they share (the baton's mutex orders their memory), and the results are those
// of running the same work one stream after the other, when the two do not depend on each other.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace lf {

class StreamPair {
 public:
  StreamPair() = default;
  StreamPair(const StreamPair&) = delete;
  StreamPair& operator=(const StreamPair&) = delete;

  // Runs `first` on the calling thread and `second` on a new thread, `first` first. Whenever the
  // running stream calls yield(), the other runs until it yields or returns; once one has
  // returned, the other runs to its end. Returns when both have returned; if either threw, both
  // still run to their ends and the first exception (by time) is rethrown. Thread-local state
  // (e.g. ATen's grad mode and thread count) is the new thread's own: `second` sets what it needs.
  void run(const std::function<void()>& first, const std::function<void()>& second);

  // Called by a stream of run(): hands over to the other stream unless it has returned, and
  // returns when it is the caller's turn again. From any other thread, or outside run(): returns.
  void yield();

  // While a Hold made on a stream of a run lives, that stream's yield() returns at once: for a
  // stretch in which it has swapped state the other stream must not see (recomputation replaying
  // the dropout generator). Holds nest; one made on any other thread, or with a null pair, does
  // nothing. Which yields are skipped is again fixed by the program, the same on every rank.
  class Hold {
   public:
    explicit Hold(StreamPair* pair);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    StreamPair* pair_;
    int stream_ = -1;
  };

  // Hand-overs in the last run() (or the one in progress), and in every run so far.
  int64_t switches() const;
  int64_t total_switches() const;
  // Whether a run() is in progress.
  bool running() const;

 private:
  // Ends stream `me` (0: first, 1: second): the other runs on.
  void finish(int me, std::exception_ptr error);
  // The calling thread's stream in the run in progress, or -1 (call with mu_ held).
  int stream_of_caller() const;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::thread::id ids_[2];
  bool done_[2] = {false, false};
  int held_[2] = {0, 0};
  int turn_ = 0;
  bool running_ = false;
  int64_t switches_ = 0, total_switches_ = 0;
  std::exception_ptr error_;
};

}  // namespace lf

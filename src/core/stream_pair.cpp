#include "loongforge/core/stream_pair.h"

#include "loongforge/core/error.h"

namespace lf {

void StreamPair::run(const std::function<void()>& first, const std::function<void()>& second) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    LF_CHECK(!running_, "StreamPair::run: a run is already in progress (one pair runs one pair of streams)");
    running_ = true;
    done_[0] = done_[1] = false;
    held_[0] = held_[1] = 0;
    turn_ = 0;
    switches_ = 0;
    error_ = nullptr;
    ids_[0] = std::this_thread::get_id();
    ids_[1] = std::thread::id();
  }
  std::thread helper;
  try {
    helper = std::thread([&] {
      std::exception_ptr error;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return turn_ == 1; });
      }
      try {
        second();
      } catch (...) {
        error = std::current_exception();
      }
      finish(1, error);
    });
  } catch (...) {  // no thread: nothing ran
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids_[1] = helper.get_id();
  }
  std::exception_ptr error;
  try {
    first();
  } catch (...) {
    error = std::current_exception();
  }
  finish(0, error);
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_[1]; });
  }
  helper.join();
  std::exception_ptr thrown;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    thrown = error_;
  }
  if (thrown) std::rethrow_exception(thrown);
}

void StreamPair::finish(int me, std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mu_);
  done_[me] = true;
  if (error && !error_) error_ = error;
  if (!done_[1 - me]) turn_ = 1 - me;
  cv_.notify_all();
}

int StreamPair::stream_of_caller() const {
  if (!running_) return -1;
  const auto id = std::this_thread::get_id();
  return id == ids_[0] ? 0 : (id == ids_[1] ? 1 : -1);
}

void StreamPair::yield() {
  std::unique_lock<std::mutex> lock(mu_);
  const int me = stream_of_caller();
  if (me < 0 || done_[1 - me] || held_[me] > 0) return;
  turn_ = 1 - me;
  ++switches_;
  ++total_switches_;
  cv_.notify_all();
  cv_.wait(lock, [&] { return turn_ == me; });
}

StreamPair::Hold::Hold(StreamPair* pair) : pair_(pair) {
  if (!pair_) return;
  std::lock_guard<std::mutex> lock(pair_->mu_);
  stream_ = pair_->stream_of_caller();
  if (stream_ >= 0) ++pair_->held_[stream_];
}

StreamPair::Hold::~Hold() {
  if (!pair_ || stream_ < 0) return;
  std::lock_guard<std::mutex> lock(pair_->mu_);
  if (pair_->running_) --pair_->held_[stream_];
}

int64_t StreamPair::switches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return switches_;
}

int64_t StreamPair::total_switches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_switches_;
}

bool StreamPair::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

}  // namespace lf

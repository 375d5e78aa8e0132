// Background loader thread: sampler -> dataset.get -> bounded queue.
#include "loongforge/data/loader.h"

#include "loongforge/core/error.h"

namespace lf::data {

BackgroundLoader::BackgroundLoader(std::shared_ptr<const SampleDataset> dataset,
                                   PretrainingSampler sampler, LoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options),
      delivered_(sampler_.state()) {
  LF_CHECK(dataset_ != nullptr, "loader needs a dataset");
  LF_CHECK(options_.prefetch >= 1, "loader prefetch ", options_.prefetch, " must be >= 1");
  LF_CHECK(sampler_.total_samples() <= dataset_->size(), "loader: sampler covers ",
           sampler_.total_samples(), " samples but the dataset has ", dataset_->size());
  thread_ = std::thread([this] { run(); });
}

BackgroundLoader::~BackgroundLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundLoader::run() {
  try {
    const int64_t len = dataset_->sample_length();
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || static_cast<int>(ready_.size()) < options_.prefetch; });
        if (stop_) return;
      }
      auto indices = sampler_.next_micro_batch();
      if (!indices) break;
      Batch b;
      b.micro_batch_size = static_cast<int64_t>(indices->size());
      b.sample_length = len;
      b.tokens.resize(static_cast<size_t>(b.micro_batch_size * len));
      for (int64_t r = 0; r < b.micro_batch_size; ++r) dataset_->get((*indices)[r], &b.tokens[r * len]);
      b.sample_indices = std::move(*indices);
      b.state_after = sampler_.state();
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_.push_back(std::move(b));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

std::optional<Batch> BackgroundLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty() || done_; });
  if (ready_.empty()) {
    if (error_) std::rethrow_exception(error_);
    return std::nullopt;
  }
  Batch b = std::move(ready_.front());
  ready_.pop_front();
  delivered_ = b.state_after;
  lock.unlock();
  cv_.notify_all();
  return b;
}

PretrainingSampler::State BackgroundLoader::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return delivered_;
}

}  // namespace lf::data

// Background loader: workers take the sampler's next micro-batch under the lock, assemble it
// outside it, and file it by sequence number; next() hands them out in order.
#include "loongforge/data/loader.h"

#include <algorithm>

#include "loongforge/core/error.h"

namespace lf::data {

BackgroundLoader::BackgroundLoader(std::shared_ptr<const SampleDataset> dataset,
                                   PretrainingSampler sampler, LoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options),
      delivered_(sampler_.state()) {
  LF_CHECK(dataset_ != nullptr, "loader needs a dataset");
  LF_CHECK(options_.workers >= 0, "loader workers ", options_.workers, " must be >= 0",
           lf::hint("--num-workers takes 0 (load on the training thread) or more"));
  LF_CHECK(options_.prefetch >= 1, "loader prefetch ", options_.prefetch, " must be >= 1");
  LF_CHECK(sampler_.total_samples() <= dataset_->size(), "loader: sampler covers ",
           sampler_.total_samples(), " samples but the dataset has ", dataset_->size());
  options_.prefetch = std::max(options_.prefetch, options_.workers);
  for (int w = 0; w < options_.workers; ++w) threads_.emplace_back([this] { run(); });
}

BackgroundLoader::~BackgroundLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

TokenBatch BackgroundLoader::assemble(std::vector<int64_t> indices, PretrainingSampler::State after) const {
  const int64_t len = dataset_->sample_length();
  TokenBatch b;
  b.micro_batch_size = static_cast<int64_t>(indices.size());
  b.sample_length = len;
  b.tokens.resize(static_cast<size_t>(b.micro_batch_size * len));
  for (int64_t r = 0; r < b.micro_batch_size; ++r) dataset_->get(indices[static_cast<size_t>(r)], &b.tokens[r * len]);
  b.sample_indices = std::move(indices);
  b.state_after = after;
  return b;
}

void BackgroundLoader::run() {
  try {
    for (;;) {
      std::vector<int64_t> indices;
      PretrainingSampler::State after;
      int64_t seq = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || exhausted_ || error_ || next_seq_ - next_deliver_ < options_.prefetch; });
        if (stop_ || exhausted_ || error_) return;
        auto next = sampler_.next_micro_batch();
        if (!next) {
          exhausted_ = true;
          cv_.notify_all();
          return;
        }
        indices = std::move(*next);
        after = sampler_.state();
        seq = next_seq_++;
      }
      TokenBatch b = assemble(std::move(indices), after);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_.emplace(seq, std::move(b));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

std::optional<TokenBatch> BackgroundLoader::next() {
  if (threads_.empty()) {  // no workers: assemble here
    std::unique_lock<std::mutex> lock(mu_);
    auto indices = sampler_.next_micro_batch();
    if (!indices) return std::nullopt;
    TokenBatch b = assemble(std::move(*indices), sampler_.state());
    delivered_ = b.state_after;
    return b;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ready_.count(next_deliver_) || error_ || (exhausted_ && next_deliver_ == next_seq_); });
  if (!ready_.count(next_deliver_)) {
    if (error_) std::rethrow_exception(error_);
    return std::nullopt;
  }
  auto node = ready_.extract(next_deliver_++);
  TokenBatch b = std::move(node.mapped());
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

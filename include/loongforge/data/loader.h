// BackgroundLoader: worker threads that assemble this rank's next micro-batches (sampler order)
// into token buffers while training runs, keeping up to `prefetch` ready and delivering them in
// order whatever thread finished first; with no workers, next() assembles on the caller's thread
// (--num-workers 0). Plain C++ buffers; the trainer turns them into tensors. Not a sampler
// (sampler.h) nor a dataset (gpt_dataset.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "loongforge/data/gpt_dataset.h"
#include "loongforge/data/sampler.h"

namespace lf::data {

struct TokenBatch {
  // tokens: [micro_batch_size, sample_length] row-major; inputs are [:, :-1], labels [:, 1:].
  std::vector<int64_t> tokens;
  int64_t micro_batch_size = 0;
  int64_t sample_length = 0;
  std::vector<int64_t> sample_indices;  // dataset indices of the rows
  // Sampler state after this micro-batch: what a checkpoint taken after consuming it saves.
  PretrainingSampler::State state_after;
};

struct LoaderOptions {
  int prefetch = 4;  // micro-batches kept ready (at least workers)
  int workers = 1;   // threads assembling micro-batches; 0: next() assembles them itself
};

class BackgroundLoader {
 public:
  BackgroundLoader(std::shared_ptr<const SampleDataset> dataset, PretrainingSampler sampler,
                   LoaderOptions options = {});
  ~BackgroundLoader();  // stops and joins the thread
  BackgroundLoader(const BackgroundLoader&) = delete;
  BackgroundLoader& operator=(const BackgroundLoader&) = delete;

  // The next micro-batch, waiting for it if needed; nullopt at the end of the data. An error in
  // the loader thread is rethrown here.
  std::optional<TokenBatch> next();
  // The position after the last batch next() returned (not after what is prefetched).
  PretrainingSampler::State state() const;

 private:
  void run();
  TokenBatch assemble(std::vector<int64_t> indices, PretrainingSampler::State after) const;

  std::shared_ptr<const SampleDataset> dataset_;
  PretrainingSampler sampler_;  // guarded by mu_
  LoaderOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, TokenBatch> ready_;  // by sequence number
  int64_t next_seq_ = 0, next_deliver_ = 0;
  bool exhausted_ = false, stop_ = false;
  std::exception_ptr error_;
  PretrainingSampler::State delivered_;
  std::vector<std::thread> threads_;
};

}  // namespace lf::data

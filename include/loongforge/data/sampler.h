// PretrainingSampler: which sample indices data-parallel rank r reads, as Megatron's
// MegatronPretrainingSampler: consecutive indices from consumed_samples, each micro-batch step
// taking micro_batch_size * dp_size of them and giving rank r the r-th slice. Its state is the
// global consumed-sample count, which a checkpoint saves. Not a shuffler: the dataset's shuffle
// index already permutes samples.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace lf::data {

// The sampler's position: what a checkpoint saves and a resume restores.
struct SamplerState {
  int64_t consumed_samples = 0;  // over all DP ranks
  bool operator==(const SamplerState&) const = default;
};

class PretrainingSampler {
 public:
  using State = SamplerState;

  // total_samples: the dataset size; drop_last: stop at the last full micro-batch step (false:
  // the final partial step is split as far as it goes, so some ranks may get fewer samples).
  PretrainingSampler(int64_t total_samples, int64_t micro_batch_size, int dp_rank, int dp_size,
                     State state = {}, bool drop_last = true);

  // This rank's indices for its next micro-batch, or nullopt when the data is used up.
  std::optional<std::vector<int64_t>> next_micro_batch();
  // The num_micro = global_batch_size / (micro_batch_size * dp_size) micro-batches of the next
  // step (all or none), or an empty vector when the data cannot fill a whole global batch.
  std::vector<std::vector<int64_t>> next_global_batch(int64_t global_batch_size);

  State state() const { return state_; }
  void restore(State state);
  int64_t micro_batch_size() const { return micro_batch_size_; }
  int dp_rank() const { return dp_rank_; }
  int dp_size() const { return dp_size_; }
  int64_t total_samples() const { return total_samples_; }

 private:
  int64_t total_samples_, micro_batch_size_;
  int dp_rank_, dp_size_;
  State state_;
  bool drop_last_;
};

}  // namespace lf::data

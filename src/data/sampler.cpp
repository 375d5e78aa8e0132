// Megatron's pretraining sampler: rank r's slice of each micro-batch step.
#include "loongforge/data/sampler.h"

#include <algorithm>

#include "loongforge/core/error.h"

namespace lf::data {

PretrainingSampler::PretrainingSampler(int64_t total_samples, int64_t micro_batch_size,
                                       int dp_rank, int dp_size, State state, bool drop_last)
    : total_samples_(total_samples), micro_batch_size_(micro_batch_size), dp_rank_(dp_rank),
      dp_size_(dp_size), drop_last_(drop_last) {
  LF_CHECK(total_samples > 0, "sampler: no samples (dataset size ", total_samples, ")");
  LF_CHECK(micro_batch_size > 0, "sampler: micro_batch_size ", micro_batch_size, " must be > 0");
  LF_CHECK(dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size, "sampler: data-parallel rank ",
           dp_rank, " of ", dp_size, " is not valid");
  restore(state);
}

void PretrainingSampler::restore(State state) {
  LF_CHECK(state.consumed_samples >= 0 && state.consumed_samples <= total_samples_,
           "sampler: consumed_samples ", state.consumed_samples, " outside [0, ", total_samples_,
           "]", lf::hint("the checkpoint was taken with a different dataset size"));
  state_ = state;
}

std::optional<std::vector<int64_t>> PretrainingSampler::next_micro_batch() {
  const int64_t step = micro_batch_size_ * dp_size_;
  int64_t begin = state_.consumed_samples;
  int64_t avail = total_samples_ - begin;
  if (avail <= 0 || (drop_last_ && avail < step)) return std::nullopt;
  int64_t take = std::min(avail, step);
  int64_t lo = begin + std::min<int64_t>(take, dp_rank_ * micro_batch_size_);
  int64_t hi = begin + std::min<int64_t>(take, (dp_rank_ + 1) * micro_batch_size_);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(hi - lo));
  for (int64_t i = lo; i < hi; ++i) out.push_back(i);
  state_.consumed_samples += take;
  return out;
}

std::vector<std::vector<int64_t>> PretrainingSampler::next_global_batch(int64_t global_batch_size) {
  const int64_t step = micro_batch_size_ * dp_size_;
  LF_CHECK(global_batch_size > 0 && global_batch_size % step == 0, "global batch size ",
           global_batch_size, " is not a multiple of micro_batch_size ", micro_batch_size_,
           " x data-parallel size ", dp_size_,
           lf::hint("set --global-batch-size to a multiple of micro-batch-size * dp"));
  if (total_samples_ - state_.consumed_samples < global_batch_size) return {};
  std::vector<std::vector<int64_t>> out;
  for (int64_t k = 0; k < global_batch_size / step; ++k) out.push_back(*next_micro_batch());
  return out;
}

}  // namespace lf::data

// GradBuffer: the data-parallel gradient machinery of Megatron's DistributedDataParallel and
// ParamAndGradBuffer for one parameter group (a model has one per component whose gradients are
// reduced over a different data-parallel group: the dense model, a heterogeneous encoder, later
// the experts). One contiguous fp32 main-gradient buffer for the group's parameters (laid out in
// reverse registration order, so the first bucket holds the gradients that backward produces
// first), split into buckets. Post-accumulate-grad hooks add each parameter's gradient into its
// slot and drop the parameter's own .grad; on the last micro-batch a bucket whose parameters have
// all reported is reduced asynchronously over the data-parallel group while backward goes on
// (all-reduce, or reduce-scatter under ZeRO-1). It does not own the optimizer state
// (train/optimizer.h) nor the parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "loongforge/backend/communicator.h"
#include "loongforge/parallel/sharding.h"

namespace lf::parallel {

struct GradBufferOptions {
  // Elements per bucket (a bucket closes once it holds at least this many; <= 0: one bucket).
  int64_t bucket_size = 40'000'000;
  // Launch a bucket's reduction from the hooks as soon as it is complete on the last micro-batch;
  // false: finish_grad_sync() launches them all after backward.
  bool overlap_grad_reduce = false;
  // ZeRO-1: reduce-scatter each bucket (padded to a multiple of dp) so that every DP rank holds
  // the reduced gradient of its contiguous shard only.
  bool distributed_optimizer = false;
  // true: reduced_grad holds the DP average (each bucket divided by dp before its sum-reduction,
  // Megatron's gradient_scaling_factor); false: the sum, for losses already normalised over the
  // whole global batch (the trainer's per-token / per-sample normalisers).
  bool average = true;
};

// Where each parameter's gradient lives in the flat buffer.
struct GradSlot {
  int64_t offset = 0;  // into the flat buffer
  int64_t numel = 0;
  int bucket = 0;
};

struct GradBucket {
  int64_t offset = 0;         // into the flat buffer
  int64_t numel = 0;          // padded to a multiple of dp under ZeRO-1
  std::vector<int> params;    // indices into parameters(), in buffer order
  at::ScalarType param_dtype = at::kFloat;  // a bucket never mixes parameter dtypes
  // This rank's part of the bucket: [owned_begin, owned_end) in flat-buffer offsets. The whole
  // bucket without ZeRO-1; the dp_rank-th of dp equal shards with it.
  int64_t owned_begin = 0, owned_end = 0;
  // Observability (tests, logs): how many parameter hooks had fired in this backward when the
  // bucket's reduction was launched (-1: launched by finish_grad_sync after backward).
  int64_t launched_after_hooks = -1;
};

// The part of one parameter inside this rank's owned range of one bucket.
struct OwnedPiece {
  int param = 0;
  int bucket = 0;
  int64_t param_offset = 0;    // into the flattened parameter
  int64_t reduced_offset = 0;  // into reduced_grad(bucket) (and the optimizer's shard tensors)
  int64_t numel = 0;
};

class GradBuffer {
 public:
  // dp: the data-parallel group (null or size 1: no reduction). tp: the tensor-parallel group,
  // over which sequence_parallel parameters' gradients are summed (null or size 1: none).
  GradBuffer(std::vector<Parameter> params, lf::backend::Communicator* dp,
             lf::backend::Communicator* tp, GradBufferOptions options);
  ~GradBuffer();  // removes the hooks
  GradBuffer(const GradBuffer&) = delete;
  GradBuffer& operator=(const GradBuffer&) = delete;

  // Call before each micro-batch's backward. Hooks always accumulate into the main gradients;
  // only on the last micro-batch do complete buckets start their reduction.
  void begin_micro_batch(bool is_last);
  // Launches the buckets not launched yet (in bucket order), waits for all, then sums the
  // sequence-parallel gradients over TP. Afterwards reduced_grad(b) holds the DP average (or sum:
  // options.average). Averaging divides each bucket by dp *before* its sum-reduction (Megatron's
  // gradient_scaling_factor), so the collective is a plain sum on every engine.
  void finish_grad_sync();
  // Resets the main gradients and the bucket state for the next step. The buffer is not filled:
  // each slot is marked stale and the first gradient of the next step is copied into it.
  void zero_grad();
  // Zeroes the slots that got no gradient since zero_grad (finish_grad_sync does it too): call
  // before reading main_grad(i) ahead of finish_grad_sync.
  void zero_unreported();

  const std::vector<Parameter>& parameters() const { return params_; }
  const std::vector<GradSlot>& slots() const { return slots_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  const GradBufferOptions& options() const { return options_; }
  lf::backend::Communicator* dp() const { return dp_; }
  int dp_size() const;
  int dp_rank() const;
  // The flat fp32 main-gradient buffer [total] (hooks accumulate here). Reading it (or a slot,
  // below) first zeroes the slots that got no gradient since zero_grad.
  const at::Tensor& main_grad() const;
  // The gradient of parameter i, shaped like it (a view into the buffer; before the reduction
  // this is the local accumulation, after it valid only inside this rank's owned range).
  at::Tensor main_grad(int i) const;
  // After finish_grad_sync: the reduced gradient of bucket b's owned range (owned_end -
  // owned_begin elements): a view of the buffer, or under ZeRO-1 the reduce-scatter output.
  const at::Tensor& reduced_grad(int b) const { return reduced_[static_cast<size_t>(b)]; }
  // Every parameter's part in this rank's owned ranges, in buffer order (padding excluded).
  const std::vector<OwnedPiece>& owned_pieces() const { return pieces_; }
  // Total parameter hooks fired in the current backward (for overlap checks).
  int64_t hooks_fired() const { return hooks_fired_; }

  // Called by the post-accumulate-grad hook of parameter i.
  void on_grad_ready(int i);

  // Gradient-accumulation fusion (Megatron's, for a layer that computes a weight gradient in its
  // forward): the slot of `param` to write its gradient into directly, and whether the slot
  // already holds gradient this step (then add, else write: the slot is marked as written from
  // here on). Undefined when `param` is not in this buffer or its bucket's reduction has started.
  // The parameter's hook still fires in that backward (with no gradient, or a tied embedding's)
  // and counts it for its bucket as usual.
  struct DirectSlot {
    int index = -1;
    at::Tensor slot;
    bool accumulate = false;
  };
  DirectSlot direct_slot(const at::Tensor& param);

 private:
  void launch(int b);
  void launch_ready_in_order();
  void zero_stale();  // zero_unreported without the lock
  at::Tensor slot_view(int i) const;  // parameter i's slot, stale or not

  std::vector<Parameter> params_;
  lf::backend::Communicator* dp_;
  lf::backend::Communicator* tp_;
  GradBufferOptions options_;
  std::vector<GradSlot> slots_;
  std::vector<GradBucket> buckets_;
  at::Tensor buffer_;                 // [total] fp32
  std::vector<at::Tensor> reduced_;   // per bucket, see reduced_grad()
  std::vector<OwnedPiece> pieces_;
  std::vector<std::shared_ptr<lf::backend::Work>> work_;
  std::vector<int> pending_;          // per bucket: parameters yet to report on the last micro-batch
  std::vector<bool> launched_;
  mutable std::vector<bool> stale_;   // per parameter: its slot holds a previous step's gradient
  int next_launch_ = 0;
  bool last_micro_batch_ = true;
  int64_t hooks_fired_ = 0;
  bool has_sequence_parallel_ = false;
  std::mutex mutex_;  // hooks may run on an autograd device thread
};

}  // namespace lf::parallel

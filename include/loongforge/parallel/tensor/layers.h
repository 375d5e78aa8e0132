// Tensor-parallel layers as functions over this rank's weight shard (Megatron's ColumnParallel /
// RowParallel linear and VocabParallelEmbedding), with optional sequence parallelism, plus the
// helpers that cut a full tensor into the shard a rank owns. They hold no parameters: the model
// owns its (sharded) tensors and passes them in. Not the collectives (mappings.h).
//
// Shapes: activations are [s, b, h]; with sequence_parallel the tensors outside TP regions are
// [s / tp, b, h] (this rank's contiguous chunk of the sequence).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "loongforge/backend/communicator.h"
#include "loongforge/backend/functional.h"

namespace lf::ops {
struct Fp8Recipe;
}

namespace lf::parallel {

using lf::backend::Communicator;

// The TP group and whether activations outside TP regions are sequence-sharded. tp == nullptr
// means no tensor parallelism: every function below is then the plain single-device op.
struct TensorParallel {
  Communicator* tp = nullptr;
  bool sequence_parallel = false;
  // MoE experts whole on one rank each (expert TP 1), spread over this expert-parallel group
  // (possibly of size 1); null: every rank holds every expert, split over tp like the dense MLP.
  Communicator* ep = nullptr;
  // Expert TP = TP under expert parallelism: every expert is also split over tp like the dense MLP
  // (rank ep_rank * tp + tp_rank holds its ep part's tp shard); the MoE layer enters the TP region
  // (the whole sequence on every TP rank) and the ep group holds the ranks of the same tp rank.
  bool ep_split_over_tp = false;
  bool ep_allgather = true;  // the token dispatcher: all-gather (else all-to-all)
  int ep_overlap_chunks = 0;  // all-to-all: > 0 overlaps the dispatch of that many token chunks with the experts (CCT)
  bool ep_delay_wgrad = false;  // overlapped: the expert weights' gradients after every chunk's input gradient
  // FP8 tensorwise scaling under context parallelism: the ranks whose amaxes make one tensor's,
  // tp x cp (Megatron's amax reduction group with context parallelism); null: tp.
  Communicator* fp8_amax = nullptr;
  int size() const;
  int rank() const;
  // The group an FP8 GEMM's tensorwise amax is reduced over (null: none).
  Communicator* amax_group() const { return fp8_amax ? fp8_amax : size() > 1 ? tp : nullptr; }
};

// Y = X W^T (+ b) with W split along its output dim (rows): weight_shard [out / tp, in],
// bias_shard [out / tp] or undefined.
//   x: [s, b, in] (replicated), or [s / tp, b, in] with SP  ->  [s, b, out / tp]
// gather_output: all-gather the result along the last dim -> [s, b, out] (not allowed with SP).
// slots: gradient-accumulation fusion for the weight shard (lf::ops::linear), or null.
// fp8: the GEMMs in FP8 under that recipe (lf::ops::fp8_linear; tensorwise amax reduced over TP),
// or null. It must outlive the backward.
at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight_shard,
                                  const at::Tensor& bias_shard, const TensorParallel& tp,
                                  bool gather_output = false, const lf::ops::WeightGradSlots* slots = nullptr,
                                  const lf::ops::Fp8Recipe* fp8 = nullptr);

// Y = X W^T (+ b) with W split along its input dim (columns): weight_shard [out, in / tp],
// bias [out] replicated (added once, after the reduction) or undefined.
//   x: [s, b, in / tp]  ->  [s, b, out] (all-reduced), or [s / tp, b, out] with SP
//   (reduce-scattered along the sequence).
at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight_shard,
                               const at::Tensor& bias, const TensorParallel& tp,
                               const lf::ops::WeightGradSlots* slots = nullptr,
                               const lf::ops::Fp8Recipe* fp8 = nullptr);

// row_parallel_linear(lf::ops::activation(be, act, pre), ...) where the activation's output is
// not kept for backward (lf::ops::activated_linear): pre [s, b, (2) in / tp] is this rank's shard
// of the MLP's first linear. With fp8, the activation's output is computed and quantized instead.
at::Tensor row_parallel_activated_linear(const lf::backend::DeviceBackend& be, lf::ops::Activation act,
                                         const at::Tensor& pre, const at::Tensor& weight_shard, const at::Tensor& bias,
                                         const TensorParallel& tp, const lf::ops::WeightGradSlots* slots = nullptr,
                                         const lf::ops::Fp8Recipe* fp8 = nullptr);

// Embedding over a vocabulary split into tp contiguous row ranges: weight_shard [v / tp, h] holds
// rows [rank * v / tp, (rank + 1) * v / tp). Ids outside this rank's range look up zeros, then the
// ranks' partial results are summed.
//   tokens: [s, b] int64 global ids  ->  [s, b, h], or [s / tp, b, h] with SP
// slots: gradient-accumulation fusion for the table shard (lf::ops::embedding), or null.
at::Tensor vocab_parallel_embedding(const at::Tensor& tokens, const at::Tensor& weight_shard,
                                    const TensorParallel& tp, const lf::ops::WeightGradSlots* slots = nullptr);

// Sharding of full tensors (rank `rank` of `size`), as copies:
// the rank-th of `size` equal contiguous chunks along dim.
at::Tensor shard_along(const at::Tensor& full, int64_t dim, int rank, int size);
// A tensor that stacks `parts` equal blocks along dim 0 (fc1's [gate; up]): each block is
// sharded on its own and the rank's pieces are stacked again: [gate_r; up_r].
at::Tensor shard_stacked(const at::Tensor& full, int64_t parts, int rank, int size);
// Inverse of shard_stacked given every rank's shard in rank order.
at::Tensor unshard_stacked(const std::vector<at::Tensor>& shards, int64_t parts);

}  // namespace lf::parallel

// Column/row-parallel linear and vocab-parallel embedding (parallel/tensor/layers.h): plain ATen
// math on the shard, with the mappings placed exactly where Megatron places them.
#include "loongforge/parallel/tensor/layers.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "loongforge/backend/fp8.h"
#include "loongforge/core/error.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::parallel {

int TensorParallel::size() const { return tp ? tp->size() : 1; }
int TensorParallel::rank() const { return tp ? tp->rank() : 0; }

namespace {
// This rank's GEMM: in FP8 under `fp8` (the amax of each operand reduced over TP, whose ranks
// hold shards of one tensor, and CP, whose ranks hold other tokens), else lf::ops::linear.
at::Tensor shard_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const TensorParallel& tp,
                        const lf::ops::WeightGradSlots* slots, const lf::ops::Fp8Recipe* fp8) {
  if (fp8) return lf::ops::fp8_linear(x, w, b, *fp8, slots, tp.amax_group());
  return lf::ops::linear(x, w, b, slots);
}
}  // namespace

at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight_shard,
                                  const at::Tensor& bias_shard, const TensorParallel& tp,
                                  bool gather_output, const lf::ops::WeightGradSlots* slots,
                                  const lf::ops::Fp8Recipe* fp8) {
  if (tp.size() == 1) return shard_linear(x, weight_shard, bias_shard, tp, slots, fp8);
  LF_CHECK(!(gather_output && tp.sequence_parallel),
           "column_parallel_linear: gather_output with sequence parallelism is not supported");
  // Entering the TP region: every rank needs the full input. Without SP it is replicated (its
  // gradient must be summed over TP); with SP each rank holds a sequence chunk (gather it; the
  // gradient is reduce-scattered).
  at::Tensor full = tp.sequence_parallel ? gather_from_sequence_parallel(x, *tp.tp)
                                         : copy_to_tp(x, *tp.tp);
  at::Tensor y = shard_linear(full, weight_shard, bias_shard, tp, slots, fp8);  // [s, b, out / tp]
  return gather_output ? gather_from_tp(y, *tp.tp) : y;
}

namespace {
// Leaving the TP region: the ranks' partial sums [s, b, out] are all-reduced (or reduce-scattered
// along the sequence with SP), then the replicated bias is added once.
at::Tensor reduce_row_parallel(const at::Tensor& partial, const at::Tensor& bias, const TensorParallel& tp) {
  at::Tensor y = tp.sequence_parallel ? reduce_scatter_to_sequence_parallel(partial, *tp.tp)
                                      : reduce_from_tp(partial, *tp.tp);
  return bias.defined() ? y + bias : y;
}
}  // namespace

at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight_shard,
                               const at::Tensor& bias, const TensorParallel& tp,
                               const lf::ops::WeightGradSlots* slots, const lf::ops::Fp8Recipe* fp8) {
  if (tp.size() == 1) return shard_linear(x, weight_shard, bias, tp, slots, fp8);
  return reduce_row_parallel(shard_linear(x, weight_shard, {}, tp, slots, fp8), bias, tp);
}

at::Tensor row_parallel_activated_linear(const lf::backend::DeviceBackend& be, lf::ops::Activation act,
                                         const at::Tensor& pre, const at::Tensor& weight_shard, const at::Tensor& bias,
                                         const TensorParallel& tp, const lf::ops::WeightGradSlots* slots,
                                         const lf::ops::Fp8Recipe* fp8) {
  // FP8: the activation's output is quantized for the GEMM (the FP8 linear keeps that copy).
  if (fp8) return row_parallel_linear(lf::ops::activation(be, act, pre), weight_shard, bias, tp, slots, fp8);
  if (tp.size() == 1) return lf::ops::activated_linear(be, act, pre, weight_shard, bias, slots);
  return reduce_row_parallel(lf::ops::activated_linear(be, act, pre, weight_shard, {}, slots), bias, tp);
}

at::Tensor vocab_parallel_embedding(const at::Tensor& tokens, const at::Tensor& weight_shard,
                                    const TensorParallel& tp, const lf::ops::WeightGradSlots* slots) {
  if (tp.size() == 1) return lf::ops::embedding(weight_shard, tokens, slots);
  const int64_t rows = weight_shard.size(0), start = tp.rank() * rows;
  // Ids of other ranks look up row 0 and are zeroed; the sum over ranks then has exactly one
  // non-zero term per token.
  at::Tensor outside = (tokens < start).logical_or(tokens >= start + rows);
  at::Tensor local = (tokens - start).masked_fill(outside, 0);
  at::Tensor partial = lf::ops::embedding(weight_shard, local, slots).masked_fill(outside.unsqueeze(-1), 0.0);
  return tp.sequence_parallel ? reduce_scatter_to_sequence_parallel(partial, *tp.tp)
                              : reduce_from_tp(partial, *tp.tp);
}

at::Tensor shard_along(const at::Tensor& full, int64_t dim, int rank, int size) {
  if (dim < 0) dim += full.dim();
  LF_CHECK(full.size(dim) % size == 0, "cannot shard dim ", dim, " of size ", full.size(dim),
           " (tensor ", full.sizes(), ") over ", size, " ranks",
           lf::hint("the size must be a multiple of the tensor-parallel size"));
  const int64_t n = full.size(dim) / size;
  return full.narrow(dim, rank * n, n).contiguous();
}

at::Tensor shard_stacked(const at::Tensor& full, int64_t parts, int rank, int size) {
  LF_CHECK(full.size(0) % parts == 0, "a tensor of ", full.size(0), " rows is not ", parts,
           " stacked blocks");
  std::vector<at::Tensor> pieces;
  for (const auto& block : full.chunk(parts, 0)) pieces.push_back(shard_along(block, 0, rank, size));
  return at::cat(pieces, 0);
}

at::Tensor unshard_stacked(const std::vector<at::Tensor>& shards, int64_t parts) {
  std::vector<std::vector<at::Tensor>> blocks(parts);
  for (const auto& s : shards) {
    auto chunks = s.chunk(parts, 0);
    for (int64_t p = 0; p < parts; ++p) blocks[p].push_back(chunks[p]);
  }
  std::vector<at::Tensor> out;
  for (auto& b : blocks) out.push_back(at::cat(b, 0));
  return at::cat(out, 0);
}

}  // namespace lf::parallel

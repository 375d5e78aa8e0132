// The collectives of tensor and sequence parallelism that autograd must see, each an autograd
// Function whose backward is the dual of its forward (Megatron's mappings). Not the layers that
// use them (parallel/tensor/layers.h). The communicator is the TP group's and must outlive every
// graph built with it; at tp = 1 each mapping returns its input unchanged.
//
// Conventions: "sequence" is dim 0 ([s, b, h] activations); "last dim" is the hidden / vocab dim.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "loongforge/backend/communicator.h"

namespace lf::parallel {

using lf::backend::Communicator;

// Entering a TP region with a replicated input: fwd identity, bwd all-reduce (sum).
at::Tensor copy_to_tp(const at::Tensor& x, Communicator& tp);
// Inside a TP region, before a replicated consumer whose gradient every rank computes whole (its
// own output gradient already summed over TP): fwd identity, bwd that gradient on rank 0 and zeros
// on the others, so that the region entry's sum counts it once.
at::Tensor once_over_tp(const at::Tensor& x, Communicator& tp);
// Leaving a TP region with partial sums: fwd all-reduce (sum), bwd identity.
at::Tensor reduce_from_tp(const at::Tensor& x, Communicator& tp);
// x: [..., k] -> this rank's slice [..., k / tp]: fwd split last dim, bwd all-gather last dim.
at::Tensor scatter_to_tp(const at::Tensor& x, Communicator& tp);
// x: [..., k / tp] -> [..., k]: fwd all-gather last dim, bwd split last dim.
at::Tensor gather_from_tp(const at::Tensor& x, Communicator& tp);
// x: [s, ...] -> [s / tp, ...] (this rank's sequence chunk): fwd split dim 0, bwd all-gather.
at::Tensor scatter_to_sequence_parallel(const at::Tensor& x, Communicator& tp);
// x: [s / tp, ...] -> [s, ...]: fwd all-gather dim 0; bwd reduce-scatter (the consumer is a
// TP region whose ranks each produce a partial gradient of the full sequence).
at::Tensor gather_from_sequence_parallel(const at::Tensor& x, Communicator& tp);
// x: [s, ...] partial sums -> [s / tp, ...] summed: fwd reduce-scatter dim 0, bwd all-gather.
at::Tensor reduce_scatter_to_sequence_parallel(const at::Tensor& x, Communicator& tp);

// Between components of different layouts (heterogeneous parallelism): each rank of `group`
// computed its share of a batch's rows; every rank needs all of them and computes the same
// loss from them. x: [n / g, ...] -> [n, ...]: fwd all-gather dim 0, bwd this rank's slice of
// the gradient (replicated consumers: no sum).
at::Tensor gather_from_shares(const at::Tensor& x, Communicator& group);
// The same with shares of different row counts (a rank's media differ in size): x: [n_r, ...] ->
// [sum n_r, ...] in rank order; padded to the largest share for the all-gather, the padding cut.
at::Tensor gather_rows_from_shares(const at::Tensor& x, Communicator& group);
// Rows to the members of `group` (an uneven all-to-all along dim 0): in_splits[i] rows of x go to
// member i, out_splits[i] rows come from member i, in member order. Backward sends the gradient
// rows back the same way (splits swapped). Used by MoE dispatch and the vision tower's image
// balancing (--use-vit-dp-balance).
at::Tensor all_to_all_rows(const at::Tensor& x, Communicator& group, const std::vector<int64_t>& out_splits,
                           const std::vector<int64_t>& in_splits);

// Plain (non-autograd) helpers the mappings are made of; tensors need not be contiguous.
namespace comm {
at::Tensor all_reduce(const at::Tensor& x, Communicator& tp);
at::Tensor all_gather(const at::Tensor& x, Communicator& tp, int64_t dim);
at::Tensor reduce_scatter(const at::Tensor& x, Communicator& tp, int64_t dim);
// This rank's chunk of x along dim (a copy); the size must divide by tp.
at::Tensor split(const at::Tensor& x, Communicator& tp, int64_t dim);
// all_to_all_rows without autograd.
at::Tensor all_to_all_rows(const at::Tensor& x, Communicator& group, const std::vector<int64_t>& out_splits,
                           const std::vector<int64_t>& in_splits);
}  // namespace comm

}  // namespace lf::parallel

// The sharding facts of model parameters, in one place: how a full (single-device) tensor is cut
// over a tensor-parallel group (Sharding), and a model parameter as every layer sees it
// (Parameter: name, this rank's shard, its Sharding, its owner's TP coordinates, optimizer and
// reduction flags). The TP layers, the gradient buffers, checkpoints (save, load, offline
// reshard), parameter dumps and HF export all read these; nothing re-derives a split from a name.
// Not the collectives (parallel/tensor/mappings.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/backend/communicator.h"

namespace lf::parallel {

// How the full tensor is split over a TP group of `size` ranks. Recorded for every parameter at
// every TP size (TP 1 included), so any tool can re-split a tensor saved at one size for another.
struct Sharding {
  int64_t dim = -1;     // split along this dim; -1: replicated (every rank holds the whole tensor)
  int64_t blocks = 1;   // the full tensor stacks this many equal blocks along dim, each split on
                        // its own (fc1's [gate; up]: 2): rank r holds [block0_r; block1_r; ...]
  bool vocab = false;   // dim 0 is a vocabulary padded to a multiple that depends on TP: rows past
                        // the real vocabulary are zero, and loaders adapt their count
  // Two-level split (MoE experts over expert-parallel x tensor-parallel ranks): the full tensor is
  // first cut into `outer` equal parts along dim 0 (each an expert-parallel rank's experts), then
  // each part is split along `dim` (>= 1) over size / outer ranks as above. Rank r holds part
  // r / (size / outer), piece r % (size / outer): the tensor-parallel rank runs fastest.
  int64_t outer = 1;

  static Sharding replicated() { return {}; }
  static Sharding along(int64_t dim, int64_t blocks = 1) { return {dim, blocks, false}; }
  static Sharding vocabulary() { return {0, 1, true}; }
  // `inner` split within each of `parts` parts along dim 0.
  static Sharding within_parts(int64_t parts, Sharding inner) {
    inner.outer = parts;
    return inner;
  }
  bool is_replicated() const { return dim < 0; }

  // Throws naming `what`, the shape and the split when `full_shape` does not cut into size ranks.
  void check(const std::vector<int64_t>& full_shape, int size, const std::string& what) const;
  std::vector<int64_t> shard_shape(std::vector<int64_t> full_shape, int size) const;
  std::vector<int64_t> full_shape(std::vector<int64_t> shard_shape, int size) const;
  // The first element of rank's part within each block, per dim (0 except on dim).
  std::vector<int64_t> offsets(const std::vector<int64_t>& full_shape, int rank, int size) const;
  // Rank's shard of `full` (a contiguous copy; the whole tensor when replicated or size 1).
  at::Tensor shard(const at::Tensor& full, int rank, int size) const;
  // The full tensor from every rank's shard, in rank order.
  at::Tensor unshard(const std::vector<at::Tensor>& shards) const;
  // Collective over `tp`: the full tensor on every rank from each rank's shard.
  at::Tensor gather(const at::Tensor& shard, lf::backend::Communicator& tp) const;

 private:
  Sharding within_part() const;  // the split of each outer part
  std::vector<int64_t> part_shape(std::vector<int64_t> full) const;
};

// A model parameter. The model owns the tensors; everything downstream (gradient buffers,
// optimizer, checkpoints, dumps, exports) works from this record.
struct Parameter {
  std::string name;     // Megatron-style, e.g. decoder.layers.0.self_attention.linear_qkv.weight
  at::Tensor tensor;    // this rank's shard: a leaf (requires_grad unless its component is frozen)
  Sharding sharding;
  int tp_size = 1, tp_rank = 0;  // the owning component's TP group
  bool no_weight_decay = false;  // norms and biases
  // Replicated over TP but applied to different data on each TP rank (sequence-parallel norms,
  // per-head QK norms): the gradient is summed over the TP group before the optimizer.
  bool sequence_parallel = false;
  // Pipeline parallelism with tied embeddings: the embedding on the first stage and its copy on
  // the last (the output layer) have their gradients summed over the embedding group.
  bool pipeline_tied = false;
  // The last stage's copy (same name, same values): the gradient norm, dumps and checkpoints
  // skip it (the first stage's owner counts).
  bool tied_copy = false;
  // Model state, not a weight the optimizer trains (MoE's expert bias, updated by the model's own
  // rule between steps): no gradient; saved, loaded and resharded like a frozen weight.
  bool state = false;
  // An expert weight of an expert-parallel MoE layer: tp_size / tp_rank are the expert-parallel
  // group's (the tensor holds this rank's experts); gradients are reduced over expert-DP, and the
  // parameter belongs to the model's "experts" group.
  bool expert = false;

  // This rank holds a part, not the whole tensor.
  bool is_split() const { return sharding.dim >= 0 && tp_size > 1; }
  std::vector<int64_t> full_shape() const { return sharding.full_shape(tensor.sizes().vec(), tp_size); }
};

}  // namespace lf::parallel

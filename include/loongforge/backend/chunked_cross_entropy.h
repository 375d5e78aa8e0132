// The output layer + cross entropy over chunks of tokens, for backends whose row math is a few
// kernels (the CUDA module): the driver owns the chunking, the GEMMs (ATen, in x's dtype), the
// vocabulary-parallel reductions (VocabShard::all_reduce), the loss and where the weight gradient
// goes (GradInto); the backend supplies the per-row softmax pieces and the weight-gradient GEMM.
// Never more than chunk rows of logits exist at once (the reference holds [n, v] fp32).
#pragma once

#include <ATen/core/Tensor.h>

#include "loongforge/backend/op_table.h"

namespace lf::backend {

// The row math on one chunk of logits z [c, valid] in x's dtype, contiguous. Tensors are on z's
// device; m, sums, wt fp32; safe int64 (the target's local column, clamped); mine bool (the
// target is in this rank's columns).
class CrossEntropyRowOps {
 public:
  virtual ~CrossEntropyRowOps() = default;
  // -> [c] fp32: each row's max over its columns.
  virtual at::Tensor row_max(const at::Tensor& z) const = 0;
  // -> [2, c] fp32: row 0 z[safe] - m where mine (else 0), row 1 sum_j exp(z_j - m).
  virtual at::Tensor exp_sums(const at::Tensor& z, const at::Tensor& m, const at::Tensor& safe,
                              const at::Tensor& mine) const = 0;
  // z := dL/dz = wt (exp(z - m) / sums[1] - [j == safe and mine]), rounded to z's dtype once.
  virtual void grad_in_place(at::Tensor& z, const at::Tensor& m, const at::Tensor& sums, const at::Tensor& safe,
                             const at::Tensor& mine, const at::Tensor& wt) const = 0;
  // dw (fp32 [valid, h]) := (write ? 0 : dw) + alpha dz^T x, the product accumulated in fp32.
  virtual void add_weight_grad(at::Tensor& dw, const at::Tensor& dz, const at::Tensor& x, bool write,
                               double alpha) const = 0;
};

// Where a linear cross entropy computed chunk by chunk puts its weight gradient (GradInto's
// contract): the destination into.dw (scaled by into.scale; written over, or added to with
// accumulate), or a fresh fp32 [v, h] accumulator returned in w's dtype, or nothing (skip).
// Constructing it zeroes the padding rows (v - valid; unless added to) and, with no token, the
// real rows too; each chunk then adds alpha x its product into `real`, the first chunk writing
// instead where write_first() says so.
struct WeightGradTarget {
  WeightGradTarget(const GradInto& into, const at::Tensor& w, int64_t valid, int64_t n);
  at::Tensor dw;    // fp32 [v, h]; undefined with skip
  at::Tensor real;  // dw's first valid rows
  bool skip = false, direct = false, add_first = false;
  double alpha = 1.0;  // into.scale with a destination
  bool write_first() const { return !add_first; }
  // The op's result dw: the fresh accumulator in w's dtype (undefined with a destination or skip).
  at::Tensor result(at::ScalarType w_dtype) const;
};

// OpTable::linear_cross_entropy's contract, chunk rows at a time (chunk >= 1). The caller has
// checked the arguments (check_linear_cross_entropy_args, check_grad_into). A shard with no real
// vocabulary row goes to empty_shard_linear_cross_entropy.
LinearCrossEntropyFwd chunked_linear_cross_entropy(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                                                   const at::Tensor& weight, int64_t ignore_index,
                                                   const VocabShard& shard, int64_t chunk, const GradInto& into,
                                                   const CrossEntropyRowOps& ops);

// A vocabulary shard of padding rows only (shard.valid == 0; a small vocabulary over many TP
// ranks): no logits, but the same two reductions per chunk of `chunk` rows as the other ranks
// make (max -inf, sums 0), the loss from the reduced sums, dx 0, and dw 0 (written to a
// destination unless added to; none for a frozen weight).
LinearCrossEntropyFwd empty_shard_linear_cross_entropy(const at::Tensor& x, const at::Tensor& w,
                                                       const at::Tensor& target, const at::Tensor& weight,
                                                       int64_t ignore_index, const VocabShard& shard, int64_t chunk,
                                                       const GradInto& into);

}  // namespace lf::backend

// The experts' grouped GEMM in FP8 as separate passes, for a caller that schedules the backward's
// input and weight gradients itself: the overlapped MoE all-to-all (models/blocks/moe.cpp) computes
// each chunk's input gradient first and, with --delay-wgrad-compute, every chunk's weight gradient
// after the last send. The numerics are fp8_grouped_linear's (backend/fp8.h), which is built on it:
// row group g of x times w[g]^T, each group an FP8 GEMM with its own scales; tensorwise amaxes
// reduced over amax_group (the TP group when the experts are split over TP); delayed scaling's
// scales from the run's tables, the amaxes recorded when `record` (training, not evaluation).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace lf::backend {
class Communicator;
}

namespace lf::ops {

struct Fp8Recipe;

class Fp8GroupedGemm {
  struct State;
  struct GradState;

 public:
  // The forward: x [m, in] in groups of counts (rows per group, summing to m), w [G, out, in];
  // keep: keep the quantized operands for backward(). recipe and amax_group must outlive it.
  Fp8GroupedGemm(const at::Tensor& x, const at::Tensor& w, const std::vector<int64_t>& counts,
                 const Fp8Recipe& recipe, lf::backend::Communicator* amax_group, bool keep, bool record);
  // The forward's result [m, out] in x's dtype, handed over once (the object does not keep it: an
  // autograd node holding this object must not hold its own output).
  at::Tensor take_output();
  // The output gradient dy [m, out] quantized once for backward's GEMMs: for the input gradient
  // (for_dx), the weight gradient (for_dw) or both. Tensorwise and delayed: one FP8 copy per group
  // serves both (one amax reduction, one delayed record); blockwise and MX: one copy per GEMM's
  // tiles. The overlapped MoE keeps it, not dy, from a chunk's input gradient to its delayed
  // weight gradient (--delay-wgrad-compute) where one copy serves both (one_grad_copy()). A Grad
  // serves only the object that made it.
  class Grad {
    friend class Fp8GroupedGemm;
    std::shared_ptr<const GradState> s_;
  };
  Grad quantize_grad(const at::Tensor& dy, bool for_dx, bool for_dw) const;
  // Whether one quantized copy of dy serves both GEMMs (tensorwise, delayed). Only then does a
  // caller that delays the weight gradient keep a Grad instead of dy: blockwise and MX would hold
  // both tile layouts, and quantize the weight gradient's before the input gradient is sent.
  bool one_grad_copy() const;
  // From a quantized output gradient: x's gradient [m, in] in x's dtype (want_dx) and w's
  // [G, out, in] fp32 (want_dw; zero for an empty group), each undefined when not wanted; a
  // gradient asked of a Grad not quantized for it is refused. Callable more than once.
  std::pair<at::Tensor, at::Tensor> backward(const Grad& q, bool want_dx, bool want_dw) const;
  // backward(quantize_grad(dy, want_dx, want_dw), want_dx, want_dw).
  std::pair<at::Tensor, at::Tensor> backward(const at::Tensor& dy, bool want_dx, bool want_dw) const;

 private:
  std::shared_ptr<const State> s_;
  at::Tensor y_;
};

}  // namespace lf::ops

// The GEMMs of the op wrappers' linear layers (functional.cpp's LinearFn) and of the CPU backend's
// fused output layer + cross entropy (backends/cpu/cpu_train_ops.cpp): ATen's, except that on
// the CPU an fp32 product of at least kOneDnnMinMacs multiply-adds over plain row- or
// column-major operands goes to oneDNN's matmul (the `mkldnn_matmul` libtorch_cpu exports)
// instead of ATen's BLAS (MKL in the x86 wheel). Measured on the bench's shapes (1 thread, AMD
// EPYC Zen 4): oneDNN 1.06-1.15x MKL from [388, 256] x [256, 256] up (MKL's operand packing and
// C scaling were ~13% of pi05's bench step); at the small shapes (up to ~4M multiply-adds) MKL
// was the faster (oneDNN 0.56-0.98x), hence the threshold. Results agree to fp32 rounding (a
// different summation order). oneDNN's matmul records no autograd graph: with grad mode on and an
// operand that requires grad, every call here stays on ATen (autograd Functions call these with
// grad mode off).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace lf::ops::gemm {

inline constexpr int64_t kOneDnnMinMacs = int64_t{1} << 24;

// Whether a [m, k] x [k, n] product takes oneDNN: CPU fp32, m k n >= kOneDnnMinMacs, each operand
// row- or column-major (unit stride in one dim; no broadcast rows), the output contiguous, and no
// autograd graph to record (grad mode off, or no operand requiring grad).
bool takes_onednn(const at::Tensor& a, const at::Tensor& b);

// a [m, k] x b [k, n] -> [m, n]
at::Tensor mm(const at::Tensor& a, const at::Tensor& b);
// out [m, n] (contiguous) = a b, or += a b with accumulate
void mm_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate);
// x [..., in] w [out, in]^T + b -> [..., out], as at::linear
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b);

}  // namespace lf::ops::gemm

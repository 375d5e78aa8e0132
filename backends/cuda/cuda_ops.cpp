// CudaOps: routes RMSNorm forward/backward, RoPE and SwiGLU forward/backward to the kernels in
// kernels/ when the tensors are CUDA fp32/bf16/fp16 (contiguous copies are made as needed), and the MoE
// experts' grouped GEMM (bf16, 16-byte aligned rows) to torch's grouped GEMM (at::_grouped_mm:
// one CUTLASS launch for every group on sm_90, its per-group fallback elsewhere); everything else,
// fp64 included, runs the reference math through ATen's CUDA kernels. The op harness holds both
// paths to the CPU reference. The optimizer's, MoE (un)permutation's and the DSA indexer's kernels
// are called from cuda_train_ops.cpp.
#include "cuda_ops.h"

#include <ATen/Functions.h>
#include <ATen/ops/_grouped_mm.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "cuda_kernel_call.h"
#include "loongforge/core/error.h"

namespace lf::backend::cuda {
namespace {

// The grouped GEMM's library path: bf16 CUDA tensors whose rows are 16-byte aligned (the
// kernel's TMA loads), and at least one row.
bool grouped_mm_applies(const at::Tensor& x, const at::Tensor& w) {
  return x.is_cuda() && x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 && x.size(0) > 0 &&
         x.size(1) % 8 == 0 && w.size(1) % 8 == 0;
}

// Group end offsets [G] int32 on x's device (at::_grouped_mm's `offs`).
at::Tensor group_ends(const at::Tensor& counts, const at::Tensor& x) {
  return counts.cumsum(0).to(at::kInt).to(x.device());
}

// RoPE through the kernel, or an undefined tensor where it does not apply (the caller takes the
// reference). cos/sin go to fp32, the reference's compute type for fp32, bf16 and fp16 x.
at::Tensor rope_kernel(const at::Tensor& x0, const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                       bool transpose) {
  const auto dt = kernel_dtype(x0.scalar_type());
  if (!x0.is_cuda() || !dt) return {};
  const c10::cuda::CUDAGuard guard(x0.device());
  const at::Tensor x = x0.contiguous();
  const at::Tensor c = cos.to(x.device(), at::kFloat).contiguous(), s = sin.to(x.device(), at::kFloat).contiguous();
  const int64_t d = x.size(3), r = c.size(1);
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0) return y;
  check_launch(cuda_kernels::rope(x.data_ptr(), c.data_ptr<float>(), s.data_ptr<float>(), y.data_ptr(),
                                  x.numel() / d, x.size(1) * x.size(2), d, r, interleaved, transpose, *dt,
                                  stream_of(x)),
               transpose ? "rope (backward)" : "rope");
  return y;
}

}  // namespace

at::Tensor CudaOps::grouped_gemm_fwd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) const {
  check_grouped_gemm_args(x, w, counts);
  if (!grouped_mm_applies(x, w)) return ReferenceOps::grouped_gemm_fwd(x, w, counts);
  const c10::cuda::CUDAGuard guard(x.device());
  // y_g = x_g w_g^T: mat2 [G, k_in, n_out] as a transposed view (the layout the kernel reads).
  return at::_grouped_mm(x.contiguous(), w.transpose(1, 2), group_ends(counts, x)).contiguous();
}

GroupedGemmBwd CudaOps::grouped_gemm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                         const at::Tensor& counts, GemmGrads want) const {
  check_grouped_gemm_args(x, w, counts);
  if (!grouped_mm_applies(x, w) || dy.scalar_type() != at::kBFloat16)
    return ReferenceOps::grouped_gemm_bwd(dy, x, w, counts, want);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor ends = group_ends(counts, x), d = dy.contiguous();
  GroupedGemmBwd r;
  if (want.dx) r.dx = at::_grouped_mm(d, w.contiguous(), ends).contiguous();  // dx_g = dy_g w_g
  if (want.dw) {
    // dw_g = dy_g^T x_g: the groups split the contraction (2-D x 2-D with offsets).
    r.dw = at::_grouped_mm(d.t(), x.contiguous(), ends).contiguous();
    // A group without rows contracts nothing: the kernel may leave its block unwritten.
    const at::Tensor empty = counts.eq(0).nonzero().squeeze(1);
    if (empty.numel() > 0) r.dw.index_fill_(0, empty.to(r.dw.device()), 0);
  }
  return r;
}

RmsNormFwd CudaOps::rms_norm_fwd(const at::Tensor& x0, const at::Tensor& w0, double eps) const {
  check_rms_norm_args(x0, w0);
  auto dt = kernel_dtype(x0.scalar_type());
  if (!x0.is_cuda() || !dt || w0.scalar_type() != x0.scalar_type() || w0.device() != x0.device())
    return ReferenceOps::rms_norm_fwd(x0, w0, eps);
  c10::cuda::CUDAGuard guard(x0.device());
  auto x = x0.contiguous(), w = w0.contiguous();
  const int64_t h = x.size(-1), rows = h == 0 ? 0 : x.numel() / h;
  RmsNormFwd r{at::empty_like(x), at::empty(x.sizes().slice(0, x.dim() - 1),
                                            x.options().dtype(at::kFloat))};
  check_launch(cuda_kernels::rms_norm_fwd(x.data_ptr(), w.data_ptr(), r.y.data_ptr(),
                                          r.rstd.data_ptr<float>(), rows, h,
                                          static_cast<float>(eps), *dt, stream_of(x)),
               "rms_norm_fwd");
  return r;
}

RmsNormBwd CudaOps::rms_norm_bwd(const at::Tensor& dy0, const at::Tensor& x0, const at::Tensor& w0,
                                 const at::Tensor& rstd0) const {
  check_rms_norm_args(x0, w0);
  const auto dt = kernel_dtype(x0.scalar_type());
  const int64_t h = x0.size(-1), rows = h == 0 ? 0 : x0.numel() / h;
  if (!x0.is_cuda() || !dt || w0.scalar_type() != x0.scalar_type() || dy0.scalar_type() != x0.scalar_type() ||
      w0.device() != x0.device() || dy0.device() != x0.device() || rstd0.device() != x0.device() || rows == 0)
    return ReferenceOps::rms_norm_bwd(dy0, x0, w0, rstd0);
  LF_CHECK(dy0.sizes() == x0.sizes() && rstd0.numel() == rows, "rms_norm_bwd: dy ", dy0.sizes(), " and rstd ",
           rstd0.sizes(), " must match x ", x0.sizes());
  const c10::cuda::CUDAGuard guard(x0.device());
  const at::Tensor x = x0.contiguous(), w = w0.contiguous(), dy = dy0.contiguous();
  const at::Tensor rstd = rstd0.to(at::kFloat).contiguous();
  // A few row blocks per SM: enough blocks to fill the GPU, few [h] partial rows to sum.
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t row_blocks = std::min<int64_t>(rows, 4 * sms);
  at::Tensor partial = at::empty({row_blocks, h}, x.options().dtype(at::kFloat));
  RmsNormBwd r;
  r.dx = at::empty_like(x);
  check_launch(cuda_kernels::rms_norm_bwd(dy.data_ptr(), x.data_ptr(), w.data_ptr(), rstd.data_ptr<float>(),
                                          r.dx.data_ptr(), partial.data_ptr<float>(), rows, h, row_blocks, *dt,
                                          stream_of(x)),
               "rms_norm_bwd");
  r.dw = partial.sum(0).to(w.scalar_type());
  return r;
}

at::Tensor CudaOps::rope_fwd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             bool interleaved) const {
  check_rope_args(x, cos, sin);
  at::Tensor y = rope_kernel(x, cos, sin, interleaved, /*transpose=*/false);
  return y.defined() ? y : ReferenceOps::rope_fwd(x, cos, sin, interleaved);
}

at::Tensor CudaOps::rope_bwd(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin,
                             bool interleaved) const {
  check_rope_args(dy, cos, sin);
  at::Tensor dx = rope_kernel(dy, cos, sin, interleaved, /*transpose=*/true);
  return dx.defined() ? dx : ReferenceOps::rope_bwd(dy, cos, sin, interleaved);
}

at::Tensor CudaOps::swiglu_fwd(const at::Tensor& gu0) const {
  check_swiglu_args(gu0);
  auto dt = kernel_dtype(gu0.scalar_type());
  if (!gu0.is_cuda() || !dt) return ReferenceOps::swiglu_fwd(gu0);
  c10::cuda::CUDAGuard guard(gu0.device());
  auto gu = gu0.contiguous();
  const int64_t f = gu.size(-1) / 2, rows = f == 0 ? 0 : gu.numel() / (2 * f);
  auto shape = gu.sizes().vec();
  shape.back() = f;
  auto y = at::empty(shape, gu.options());
  check_launch(cuda_kernels::swiglu_fwd(gu.data_ptr(), y.data_ptr(), rows, f, *dt, stream_of(gu)),
               "swiglu_fwd");
  return y;
}

at::Tensor CudaOps::swiglu_bwd(const at::Tensor& dy0, const at::Tensor& gu0) const {
  check_swiglu_args(gu0);
  auto dt = kernel_dtype(gu0.scalar_type());
  if (!gu0.is_cuda() || !dt) return ReferenceOps::swiglu_bwd(dy0, gu0);
  c10::cuda::CUDAGuard guard(gu0.device());
  auto gu = gu0.contiguous();
  auto dy = dy0.to(gu.scalar_type()).contiguous();
  const int64_t f = gu.size(-1) / 2, rows = f == 0 ? 0 : gu.numel() / (2 * f);
  auto dgu = at::empty_like(gu);
  check_launch(cuda_kernels::swiglu_bwd(dy.data_ptr(), gu.data_ptr(), dgu.data_ptr(), rows, f,
                                        *dt, stream_of(gu)),
               "swiglu_bwd");
  return dgu;
}

}  // namespace lf::backend::cuda

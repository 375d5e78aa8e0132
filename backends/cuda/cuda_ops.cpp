// CudaOps: routes rms_norm forward and swiglu forward/backward to the kernels in kernels/ when
// the tensors are CUDA fp32/bf16/fp16 (contiguous copies are made as needed), and the MoE
// experts' grouped GEMM (bf16, 16-byte aligned rows) to torch's grouped GEMM (at::_grouped_mm:
// one CUTLASS launch for every group on sm_90, its per-group fallback elsewhere); everything else,
// fp64 included, runs the reference math through ATen's CUDA kernels. The op harness holds both
// paths to the CPU reference.
#include "cuda_ops.h"

#include <ATen/Functions.h>
#include <ATen/ops/_grouped_mm.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "kernels/kernels.h"
#include "loongforge/core/error.h"

namespace lf::backend::cuda {
namespace {

std::optional<cuda_kernels::DType> kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return cuda_kernels::DType::f32;
    case at::kBFloat16: return cuda_kernels::DType::bf16;
    case at::kHalf: return cuda_kernels::DType::f16;
    default: return std::nullopt;
  }
}

void check_launch(cudaError_t err, const char* kernel) {
  LF_CHECK(err == cudaSuccess, "CUDA kernel ", kernel, " failed to launch: ",
           cudaGetErrorString(err),
           lf::hint("the module is built for sm_80 and sm_90 (LOONGFORGE_CUDA_ARCHS); check the GPU"));
}

cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

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
  if (!x0.is_cuda() || !dt || w0.scalar_type() != x0.scalar_type())
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

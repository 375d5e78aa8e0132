// GEMMs of the linear layers: ATen's, large fp32 CPU products on oneDNN (loongforge/backend/gemm.h).
#include "loongforge/backend/gemm.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>

// libtorch_cpu exports ATen's oneDNN matmul (ATen/native/mkldnn/Matmul.cpp; its header is not in
// the wheel): result = beta result + alpha mat1 mat2 for 2-D fp32 / bf16 / fp16 operands, strided.
namespace at::native {
TORCH_API void mkldnn_matmul(const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& result, float beta,
                             float alpha);
}  // namespace at::native

namespace lf::ops::gemm {
namespace {

// Unit stride in one dim and a leading dim at least the other's size.
bool plain(const at::Tensor& t) {
  return (t.stride(1) == 1 && t.stride(0) >= std::max<int64_t>(1, t.size(1))) ||
         (t.stride(0) == 1 && t.stride(1) >= std::max<int64_t>(1, t.size(0)));
}

// oneDNN's matmul is no dispatched op: a scope of its own, so that profiles count it as a GEMM.
void onednn(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out, float beta) {
  RECORD_FUNCTION("lf::gemm_onednn", std::vector<c10::IValue>());
  at::native::mkldnn_matmul(a, b, out, beta, 1.0f);
}

}  // namespace

bool takes_onednn(const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2 || !a.device().is_cpu() || !b.device().is_cpu()) return false;
  if (a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat) return false;
  if (a.size(0) * a.size(1) * b.size(1) < kOneDnnMinMacs) return false;
  if (at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad())) return false;  // no graph
  return plain(a) && plain(b);
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  if (!takes_onednn(a, b)) return a.mm(b);
  auto out = at::empty({a.size(0), b.size(1)}, a.options());
  onednn(a, b, out, 0.0f);
  return out;
}

void mm_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  if (takes_onednn(a, b) && out.is_contiguous() && out.scalar_type() == at::kFloat) {
    onednn(a, b, out, accumulate ? 1.0f : 0.0f);
  } else if (accumulate) {
    out.addmm_(a, b);
  } else {
    at::mm_out(out, a, b);
  }
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
  if (x.dim() < 1 || w.dim() != 2) return at::linear(x, w, b);
  const auto x2 = x.reshape({-1, x.size(-1)});
  const auto wt = w.t();
  if (!takes_onednn(x2, wt) || (b && (b->dim() != 1 || b->scalar_type() != at::kFloat)))
    return at::linear(x, w, b);
  auto shape = x.sizes().vec();
  shape.back() = w.size(0);
  auto out = at::empty({x2.size(0), w.size(0)}, x.options());
  if (b) out.copy_(b->expand(out.sizes()));
  onednn(x2, wt, out, b ? 1.0f : 0.0f);
  return out.view(shape);
}

}  // namespace lf::ops::gemm

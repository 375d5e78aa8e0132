// Conversions between at::Tensor and the XPU plugin ABI's lf_xpu_tensor view, shared by the
// loader (engine side) and the reference plugin (plugin side). A view borrows memory: the
// tensor it came from must outlive it. Not part of the C ABI (plugins need not use it).
#pragma once

#include <ATen/core/Tensor.h>

#include "loongforge/backend/xpu_plugin_abi.h"
#include "loongforge/core/error.h"

namespace lf::backend::xpu {

inline int32_t dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return LF_XPU_FLOAT32;
    case at::kDouble: return LF_XPU_FLOAT64;
    case at::kBFloat16: return LF_XPU_BFLOAT16;
    case at::kHalf: return LF_XPU_FLOAT16;
    case at::kLong: return LF_XPU_INT64;
    case at::kInt: return LF_XPU_INT32;
    case at::kByte: return LF_XPU_UINT8;
    case at::kBool: return LF_XPU_BOOL;
    case at::kChar: return LF_XPU_INT8;
    default: LF_FAIL("the XPU plugin ABI has no code for dtype ", t);
  }
}

inline at::ScalarType scalar_type(int32_t code) {
  switch (code) {
    case LF_XPU_FLOAT32: return at::kFloat;
    case LF_XPU_FLOAT64: return at::kDouble;
    case LF_XPU_BFLOAT16: return at::kBFloat16;
    case LF_XPU_FLOAT16: return at::kHalf;
    case LF_XPU_INT64: return at::kLong;
    case LF_XPU_INT32: return at::kInt;
    case LF_XPU_UINT8: return at::kByte;
    case LF_XPU_BOOL: return at::kBool;
    case LF_XPU_INT8: return at::kChar;
    default: LF_FAIL("unknown XPU plugin dtype code ", code);
  }
}

inline lf_xpu_tensor to_view(const at::Tensor& t) {
  LF_CHECK(t.dim() <= LF_XPU_MAX_DIMS, "XPU plugin views hold at most ", LF_XPU_MAX_DIMS,
           " dims; got a tensor of ", t.dim());
  lf_xpu_tensor v{};
  v.data = t.data_ptr();
  v.dtype = dtype_code(t.scalar_type());
  v.ndim = static_cast<int32_t>(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) {
    v.shape[i] = t.size(i);
    v.strides[i] = t.stride(i);
  }
  v.device_index = t.device().has_index() ? t.device().index() : 0;
  return v;
}

inline c10::IntArrayRef shape_of(const lf_xpu_tensor& v) {
  return c10::IntArrayRef(v.shape, static_cast<size_t>(v.ndim));
}

}  // namespace lf::backend::xpu

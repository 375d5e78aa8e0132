// lf::ops::add_converted (backend/mixed_add.h).
#include "loongforge/backend/mixed_add.h"

#include <ATen/Functions.h>

#include <algorithm>

#include "loongforge/core/error.h"

namespace lf::ops {

void add_converted(const at::Tensor& dst, const at::Tensor& src, int64_t block) {
  if (src.scalar_type() == dst.scalar_type() || !src.device().is_cpu() || src.numel() <= block) {
    dst.add_(src);
    return;
  }
  LF_CHECK(dst.is_contiguous() && dst.sizes() == src.sizes() && block > 0, "add_converted: a contiguous ",
           dst.sizes(), " destination and a source of its shape (", src.sizes(), "), block ", block);
  const at::Tensor d = dst.view({-1});
  const at::Tensor s = src.reshape({-1});
  const int64_t n = s.numel();
  at::Tensor tmp = at::empty({block}, dst.options());
  for (int64_t a = 0; a < n; a += block) {
    const int64_t c = std::min(block, n - a);
    at::Tensor t = tmp.narrow(0, 0, c);
    t.copy_(s.narrow(0, a, c));
    d.narrow(0, a, c).add_(t);
  }
}

}  // namespace lf::ops

#include "pi05_tensors.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "loongforge/backend/functional.h"

namespace lf::models::pi05_tensors {
namespace {
constexpr double kMaskValue = -2.3819763e38;  // openpi's
}  // namespace

at::Tensor additive_mask(const at::Tensor& allowed) {
  return at::where(allowed.unsqueeze(1), 0.0, kMaskValue).to(at::kFloat);
}

at::Tensor gated_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate) {
  return x.scalar_type() == at::kFloat ? at::addcmul(x, y, gate) : x + y * gate;
}

std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions, int64_t d, double theta,
                                              at::ScalarType dtype) {
  auto inv = 1.0 / at::pow(theta, at::arange(0, d, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
                                      static_cast<double>(d));
  auto freqs = positions.to(at::kFloat).unsqueeze(-1) * inv.to(positions.device()).view({1, 1, -1});  // [b, s, d/2]
  auto cos = freqs.cos(), sin = freqs.sin();
  return {at::cat({cos, cos}, -1).to(dtype), at::cat({sin, sin}, -1).to(dtype)};
}

// Lower precision: x cos + swap_halves(x) signed_sin with signed_sin = cat(-sin, sin) (exact), one
// flip in the graph where rotate_half's two slices and a concatenation would each cost a full-size
// gradient.
at::Tensor rope_per_token(const lf::backend::DeviceBackend& be, const at::Tensor& x, const at::Tensor& cos,
                          const at::Tensor& sin) {
  const int64_t b = x.size(0), s = x.size(1), d = x.size(3);
  if (x.scalar_type() == at::kFloat)
    return lf::ops::rope(be, x.reshape({b * s, 1, x.size(2), d}), cos.reshape({b * s, d}), sin.reshape({b * s, d}))
        .view(x.sizes());
  auto halves = sin.unflatten(-1, {2, d / 2});
  auto signed_sin = at::cat({-halves.select(-2, 0), halves.select(-2, 1)}, -1).unsqueeze(2);
  auto swapped = x.unflatten(-1, {2, d / 2}).flip(-2).flatten(-2);  // cat(x2, x1)
  return gated_add(x * cos.unsqueeze(2), swapped, signed_sin);
}

at::Tensor PrefixRows::pack(const at::Tensor& x) const {
  return x.flatten(0, 1).index_select(0, rows).unsqueeze(0);
}

at::Tensor PrefixRows::join(const at::Tensor& prefix, const at::Tensor& suffix) const {
  auto src = ns > 0 ? at::cat({prefix.squeeze(0), suffix.flatten(0, 1)}, 0) : prefix.squeeze(0);
  auto shape = src.sizes().vec();
  shape[0] = b * (np + ns);
  auto out = at::zeros(shape, src.options()).index_copy(0, ns > 0 ? joint : rows, src);
  shape[0] = np + ns;
  shape.insert(shape.begin(), b);
  return out.view(shape);
}

std::pair<at::Tensor, at::Tensor> PrefixRows::split(const at::Tensor& x) const {
  auto flat = x.flatten(0, 1).index_select(0, ns > 0 ? joint : rows);
  if (ns == 0) return {flat.unsqueeze(0), {}};
  auto parts = flat.split_with_sizes({count(), b * ns}, 0);
  auto shape = x.sizes().vec();
  shape[1] = ns;
  return {parts[0].unsqueeze(0), parts[1].view(shape)};
}

std::optional<PrefixRows> prefix_rows(const at::Tensor& pad, int64_t ns) {
  if (pad.all().item<bool>()) return std::nullopt;
  PrefixRows r;
  r.b = pad.size(0), r.np = pad.size(1), r.ns = ns;
  r.rows = pad.reshape({-1}).nonzero().squeeze(1);
  if (ns > 0) {
    // A valid token's joint row: sample (np + ns) + j = its prefix row + sample ns.
    auto sample = at::floor_divide(r.rows, r.np);
    auto suffix = (at::arange(r.b, r.rows.options()).unsqueeze(1) * (r.np + ns) + r.np +
                   at::arange(ns, r.rows.options()).unsqueeze(0)).reshape({-1});
    r.joint = at::cat({r.rows + sample * ns, suffix});
  }
  return r;
}

}  // namespace lf::models::pi05_tensors

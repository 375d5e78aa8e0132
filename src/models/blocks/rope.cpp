#include "loongforge/models/blocks/rope.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>
#include <numeric>

#include "loongforge/core/error.h"

namespace lf::models {
namespace {
const auto kF64 = at::TensorOptions().dtype(at::kDouble);

// angles [n, d/2] -> (cos, sin) [n, d] in halves layout.
std::pair<at::Tensor, at::Tensor> tables_of(const at::Tensor& angles, const at::TensorOptions& options) {
  auto emb = at::cat({angles, angles}, -1);
  return {at::cos(emb).to(options), at::sin(emb).to(options)};
}

// The 1D tables of a spec: its layout and YaRN's attention factor.
std::pair<at::Tensor, at::Tensor> spec_tables(const RopeSpec& spec, const at::Tensor& angles,
                                              const at::TensorOptions& options) {
  auto emb = spec.interleaved ? angles.repeat_interleave(2, -1) : at::cat({angles, angles}, -1);
  const double a = rope_attention_factor(spec);
  return {(at::cos(emb) * a).to(options), (at::sin(emb) * a).to(options)};
}
}  // namespace

double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

double rope_attention_factor(const RopeSpec& spec) {
  if (!spec.yarn) return 1.0;
  if (spec.mscale != 0 && spec.mscale_all_dim != 0)
    return yarn_mscale(spec.yarn_factor, spec.mscale) / yarn_mscale(spec.yarn_factor, spec.mscale_all_dim);
  return yarn_mscale(spec.yarn_factor);
}

at::Tensor rope_inv_freq(const RopeSpec& spec) {
  // inv_freq[i] = base^(-2i/d); angle[p, i] = p * inv_freq[i]; both halves share the angles.
  const int64_t d = spec.head_dim;
  LF_CHECK(d > 0 && d % 2 == 0, "RoPE needs an even head dimension, got ", d);
  auto inv_freq = at::pow(spec.base, -at::arange(0, d, 2, kF64) / static_cast<double>(d));
  LF_CHECK(!(spec.llama3_scaling && spec.yarn), "RoPE: Llama 3.1 scaling and YaRN are exclusive");
  if (spec.yarn) {
    // transformers' _compute_yarn_parameters (truncate: true), in fp64 here.
    const double old = static_cast<double>(spec.original_max_position), base = spec.base, dd = static_cast<double>(d);
    auto correction_dim = [&](double rotations) {
      return dd * std::log(old / (rotations * 2 * M_PI)) / (2 * std::log(base));
    };
    double low = std::floor(correction_dim(spec.beta_fast)), high = std::ceil(correction_dim(spec.beta_slow));
    low = std::max(low, 0.0);
    high = std::min(high, dd - 1);
    if (low == high) high += 0.001;
    auto ramp = ((at::arange(d / 2, kF64) - low) / (high - low)).clamp(0, 1);
    auto extrapolation = 1 - ramp;  // 1: keep the frequency, 0: interpolate (divide by the factor)
    inv_freq = inv_freq / spec.yarn_factor * (1 - extrapolation) + inv_freq * extrapolation;
  }
  if (spec.llama3_scaling) {
    // Llama 3.1: long wavelengths slowed down by `factor`, short ones kept, a linear blend in
    // between (in wavelength-to-context ratio).
    const double old = static_cast<double>(spec.original_max_position);
    const double low_wavelen = old / spec.low_freq_factor, high_wavelen = old / spec.high_freq_factor;
    auto wavelen = 2 * M_PI / inv_freq;
    auto scaled = at::where(wavelen > low_wavelen, inv_freq / spec.factor, inv_freq);
    auto smooth = (old / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor);
    auto blended = (1 - smooth) * scaled / spec.factor + smooth * scaled;
    auto medium = at::logical_and(wavelen >= high_wavelen, wavelen <= low_wavelen);
    inv_freq = at::where(medium, blended, scaled);
  }
  return inv_freq;
}

std::pair<at::Tensor, at::Tensor> rope_tables(const RopeSpec& spec, int64_t start, int64_t seq,
                                              const at::TensorOptions& options) {
  auto angles = at::outer(at::arange(start, start + seq, kF64), rope_inv_freq(spec));  // [s, d/2]
  return spec_tables(spec, angles, options);
}

std::pair<at::Tensor, at::Tensor> rope_tables_at(const RopeSpec& spec, const at::Tensor& positions,
                                                 const at::TensorOptions& options) {
  LF_CHECK(positions.dim() == 1, "RoPE positions must be [n], got ", positions.sizes());
  auto angles = at::outer(positions.to(at::kCPU, at::kDouble), rope_inv_freq(spec));
  return spec_tables(spec, angles, options);
}

std::pair<at::Tensor, at::Tensor> mrope_tables(const RopeSpec& spec, const at::Tensor& positions,
                                               const std::vector<int64_t>& sections,
                                               const at::TensorOptions& options, bool interleaved) {
  const int64_t half = spec.head_dim / 2;
  LF_CHECK(positions.dim() == 2 && positions.size(0) == static_cast<int64_t>(sections.size()),
           "M-RoPE positions must be [", sections.size(), ", n] (one row per section), got ", positions.sizes());
  LF_CHECK(std::accumulate(sections.begin(), sections.end(), int64_t{0}) == half, "M-RoPE sections must sum to ",
           "head_dim / 2 = ", half, lf::hint("Qwen2-VL uses mrope_section [16, 24, 24] for head_dim 128"));
  auto inv_freq = rope_inv_freq(spec);                                   // [d/2]
  auto all = positions.to(at::kCPU, at::kDouble).unsqueeze(-1) * inv_freq;  // [A, n, d/2]
  if (interleaved) {
    LF_CHECK(sections.size() == 3, "interleaved M-RoPE takes 3 sections (temporal, height, width), got ",
             sections.size());
    std::vector<int64_t> axis(static_cast<size_t>(half), 0);
    for (int64_t i = 0; i < half; ++i)
      if (i % 3 == 1 && i < 3 * sections[1]) axis[static_cast<size_t>(i)] = 1;
      else if (i % 3 == 2 && i < 3 * sections[2]) axis[static_cast<size_t>(i)] = 2;
    auto pick = at::tensor(axis, at::kLong).view({1, 1, half}).expand({1, all.size(1), half});
    return spec_tables(spec, all.gather(0, pick).squeeze(0), options);
  }
  std::vector<at::Tensor> parts;
  int64_t at_ = 0;
  for (size_t a = 0; a < sections.size(); ++a) {
    parts.push_back(all[static_cast<int64_t>(a)].narrow(-1, at_, sections[a]));
    at_ += sections[a];
  }
  return spec_tables(spec, at::cat(parts, -1), options);
}

std::pair<at::Tensor, at::Tensor> rope_nd_tables(double base, const std::vector<int64_t>& axis_dims,
                                                 const at::Tensor& positions, const at::TensorOptions& options) {
  LF_CHECK(positions.dim() == 2 && positions.size(0) == static_cast<int64_t>(axis_dims.size()),
           "N-D RoPE positions must be [", axis_dims.size(), ", n] (one row per axis), got ", positions.sizes());
  auto pos = positions.to(at::kCPU, at::kDouble);
  std::vector<at::Tensor> parts;
  for (size_t a = 0; a < axis_dims.size(); ++a) {
    const int64_t d = axis_dims[a];
    LF_CHECK(d > 0 && d % 2 == 0, "N-D RoPE: axis ", a, " has ", d, " dims; each axis needs an even share");
    auto inv = at::pow(base, -at::arange(0, d, 2, kF64) / static_cast<double>(d));
    parts.push_back(at::outer(pos[static_cast<int64_t>(a)], inv));
  }
  return tables_of(at::cat(parts, -1), options);
}

}  // namespace lf::models

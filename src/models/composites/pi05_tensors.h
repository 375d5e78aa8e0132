// pi05's tensor helpers (src/models/composites/pi05.cpp): openpi's additive attention mask, the
// gated residual, RoPE with a position per token, and the packing of the prefix's valid tokens.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace lf::backend {
class DeviceBackend;
}

namespace lf::models::pi05_tensors {

// allowed [b, s, t] bool -> the additive mask [b, 1, s, t] of every layer's attention (openpi's
// finite mask value: a query with no visible key, a padding token's, gets a uniform distribution
// rather than NaN, and masked keys weigh exactly 0).
at::Tensor additive_mask(const at::Tensor& allowed);

// x + y * gate: one addcmul in fp32; in bf16 two ops, each rounded as openpi's x + y * gate is.
at::Tensor gated_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate);

// HF's rotate_half RoPE with per-sample positions: positions [b, s] int64 -> the tables cos and sin
// [b, s, d] (contiguous; each the halves' angles twice, as HF's cat(freqs, freqs)).
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions, int64_t d, double theta,
                                              at::ScalarType dtype);
// x [b, s, n, d] with tables [b, s, d]. fp32: the backend's fused RoPE, every token its own
// position. Lower precision as openpi rounds it: x cos + rotate_half(x) sin.
at::Tensor rope_per_token(const lf::backend::DeviceBackend& be, const at::Tensor& x, const at::Tensor& cos,
                          const at::Tensor& sin);

// The prefix's valid tokens as rows. A padded prefix token (a prompt shorter than its padded
// length, a missing camera's image tokens) is a key no query sees, so nothing a valid token
// computes depends on it; where the prefix's own outputs are not read (training without the
// prefix LM loss, the sampling cache) the prefix stream runs on its valid tokens alone, packed as
// [1, T, ...] rows for the GEMMs, norms and MLPs, and enters each attention scattered into its
// padded layout with zeros at the padding (masked for every query). LeRobot's pi05 computes the
// padding (its prompts are padded to tokenizer_max_length).
struct PrefixRows {
  int64_t b = 0, np = 0, ns = 0;
  at::Tensor rows;   // [T]: the valid tokens' indices in the flattened [b np] prefix
  at::Tensor joint;  // [T + b ns]: the same tokens' rows in the flattened [b (np + ns)] layout, then the suffix's

  int64_t count() const { return rows.size(0); }
  // [b, np, ...] -> [1, T, ...]
  at::Tensor pack(const at::Tensor& x) const;
  // The packed prefix [1, T, ...] and the suffix [b, ns, ...] (ns > 0) -> [b, np + ns, ...], zeros
  // at the padding.
  at::Tensor join(const at::Tensor& prefix, const at::Tensor& suffix) const;
  // [b, np + ns, ...] -> the packed prefix [1, T, ...] and the suffix [b, ns, ...] (undefined
  // when ns = 0).
  std::pair<at::Tensor, at::Tensor> split(const at::Tensor& x) const;
};

// The rows of pad's valid tokens ([b, np] bool) with a suffix of ns tokens after the prefix, or
// nothing when there is no padding.
std::optional<PrefixRows> prefix_rows(const at::Tensor& pad, int64_t ns);

}  // namespace lf::models::pi05_tensors

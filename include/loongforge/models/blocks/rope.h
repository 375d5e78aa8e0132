// Rotary position embeddings: the cos/sin tables of 1D RoPE (optionally Llama 3.1-scaled), of
// multi-section M-RoPE (Qwen2-VL: temporal/height/width positions share one frequency set, each
// section of it taking its own axis) and of N-D RoPE (ViT 2D, video DiT 3D: each axis its own
// frequency set over its own share of the rotation pairs), all in Megatron's non-interleaved halves
// layout ([d/2 angles | the same d/2 angles]). Applying them is the backend's rope op. Not the
// attention block (blocks/attention.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace lf::models {

// inv_freq[i] = base^(-2i/d), optionally rescaled as in Llama 3.1 (frequencies with wavelengths
// above original_max / low_freq_factor divided by factor, those below original_max /
// high_freq_factor kept, a smooth blend between).
//
// YaRN (DeepSeek-V2/V3, Qwen long context): frequencies above the band set by beta_fast/beta_slow
// rotations over original_max_position are kept, those below divided by yarn_factor, a linear
// ramp between; the tables are multiplied by the attention factor mscale(factor, mscale) /
// mscale(factor, mscale_all_dim) (mscale(f, m) = 0.1 m ln f + 1 for f > 1), as transformers'
// _compute_yarn_parameters.
struct RopeSpec {
  int64_t head_dim = 0;
  double base = 10000;
  bool llama3_scaling = false;
  double factor = 8, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position = 8192;
  bool yarn = false;
  double yarn_factor = 1, beta_fast = 32, beta_slow = 1, mscale = 1, mscale_all_dim = 0;
  // Tables for the interleaved rotation (pairs x[2i], x[2i+1]: each angle repeated twice) instead
  // of the halves layout.
  bool interleaved = false;
};

// YaRN's magnitude correction 0.1 m ln(f) + 1 (1 for f <= 1).
double yarn_mscale(double factor, double m = 1.0);
// The factor YaRN multiplies the cos/sin tables by (1 without YaRN).
double rope_attention_factor(const RopeSpec& spec);

// inv_freq [d/2] fp64 (Llama 3.1 or YaRN rescaled when the spec says so).
at::Tensor rope_inv_freq(const RopeSpec& spec);

// cos, sin: [s, head_dim] for positions start..start+s-1.
std::pair<at::Tensor, at::Tensor> rope_tables(const RopeSpec& spec, int64_t start, int64_t seq,
                                              const at::TensorOptions& options);
inline std::pair<at::Tensor, at::Tensor> rope_tables(int64_t seq, int64_t head_dim, double base,
                                                     const at::TensorOptions& options) {
  return rope_tables(RopeSpec{head_dim, base}, 0, seq, options);
}
// cos, sin: [n, head_dim] for arbitrary positions [n] (int64): packed documents whose positions
// restart (--reset-position-ids).
std::pair<at::Tensor, at::Tensor> rope_tables_at(const RopeSpec& spec, const at::Tensor& positions,
                                                 const at::TensorOptions& options);

// M-RoPE (Qwen2-VL): positions [3, n] (temporal, height, width); `sections` [3] split the d/2
// frequencies (their sum is d/2): frequency i takes the position of the axis whose section
// holds it. With the three rows equal this is 1D RoPE (text tokens). interleaved (Qwen3-VL's
// apply_interleaved_mrope): frequency i takes the height row when i % 3 == 1 and i < 3 sections[1],
// the width row when i % 3 == 2 and i < 3 sections[2], else the temporal row. The tables follow the
// spec like rope_tables (the pairs layout of spec.interleaved, YaRN's frequencies and attention
// factor), so M-RoPE also applies to DeepSeek's decoupled RoPE dims.
std::pair<at::Tensor, at::Tensor> mrope_tables(const RopeSpec& spec, const at::Tensor& positions,
                                               const std::vector<int64_t>& sections,
                                               const at::TensorOptions& options, bool interleaved = false);

// N-D RoPE: positions [A, n]; axis a owns axis_dims[a] / 2 consecutive of the d/2 rotation pairs
// (axis_dims even, their sum head_dim), with its own frequencies base^(-2i/axis_dims[a]). In the
// halves layout pair j rotates dims (j, j + d/2), so the backend's rope op applies these tables
// unchanged. A = 1 is 1D RoPE.
std::pair<at::Tensor, at::Tensor> rope_nd_tables(double base, const std::vector<int64_t>& axis_dims,
                                                 const at::Tensor& positions, const at::TensorOptions& options);

}  // namespace lf::models

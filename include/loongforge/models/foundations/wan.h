// The `wan` foundation: the Wan 2.1 / 2.2 video diffusion transformer (diffusers'
// WanTransformer3DModel, the same function and the same parameter names): a 3D patch embedding,
// the sinusoidal timestep embedding with its shared 6-way modulation and each block's learned
// modulation table (adaLN), self-attention with RMSNorm over all heads' queries / keys and a 3D
// RoPE (the head dimension split over frames, rows and columns), cross-attention to projected text
// embeddings (and to image embeddings for I2V), a GELU-tanh MLP, the modulated output norm, the
// projection and the unpatchify. Timesteps per sample [b] or per token [b, tokens] (Wan 2.2
// TI2V). Tensor-parallel by heads and MLP columns (parallel/tensor); the flow-matching
// objective around it is the flow_matching composite (composites/flow_matching.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/core/config/node.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/models/blocks/param_builder.h"
#include "loongforge/models/blocks/transformer_layer.h"
#include "loongforge/parallel/context/context_parallel.h"
#include "loongforge/parallel/tensor/random.h"

namespace lf::models {

// Field names follow diffusers' config.json of WanTransformer3DModel (docs/models.md "Wan").
struct WanConfig {
  std::vector<int64_t> patch_size = {1, 2, 2};  // (t, h, w)
  int64_t num_attention_heads = 0;
  int64_t attention_head_dim = 0;
  int64_t in_channels = 16;
  int64_t out_channels = 0;  // 0: in_channels
  int64_t text_dim = 4096;
  int64_t freq_dim = 256;
  int64_t ffn_dim = 0;
  int64_t num_layers = 0;
  bool cross_attn_norm = true;
  double eps = 1e-6;
  int64_t image_dim = 0;           // I2V: CLIP image features' width; 0: text only
  int64_t added_kv_proj_dim = 0;   // I2V: width of the image keys/values' input; 0: none
  int64_t pos_embed_seq_len = 0;   // FLF2V: learned positions of the image tokens; 0: none
  int64_t rope_max_seq_len = 1024;
  double rope_theta = 10000;
  double init_method_std = 0.02;

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("patch_size", patch_size, "3D patch (frames, height, width) of the patch embedding");
    v("num_attention_heads", num_attention_heads, "Attention heads", Required{}, Min{1});
    v("attention_head_dim", attention_head_dim, "Channels per head", Required{}, Min{2});
    v("in_channels", in_channels, "Latent channels in", Min{1});
    v("out_channels", out_channels, "Latent channels predicted; 0: in_channels", Min{0});
    v("text_dim", text_dim, "Width of the text encoder's embeddings", Min{1});
    v("freq_dim", freq_dim, "Width of the sinusoidal timestep embedding", Min{2});
    v("ffn_dim", ffn_dim, "MLP hidden size", Required{}, Min{1});
    v("num_layers", num_layers, "Transformer blocks", Required{}, Min{1});
    v("cross_attn_norm", cross_attn_norm, "LayerNorm (affine) before the cross-attention");
    v("eps", eps, "Epsilon of the norms", Min{0});
    v("image_dim", image_dim, "I2V: width of the image encoder's features (0: text-only)", Min{0});
    v("added_kv_proj_dim", added_kv_proj_dim, "I2V: input width of the image key/value projections (0: none)", Min{0});
    v("pos_embed_seq_len", pos_embed_seq_len, "FLF2V: learned positions of the image tokens (0: none)", Min{0});
    v("rope_max_seq_len", rope_max_seq_len, "Longest frame / row / column count of the 3D RoPE", Min{1});
    v("rope_theta", rope_theta, "RoPE base", Min{1});
    v("init_method_std", init_method_std, "Std of the normal initialisation of the linear layers", Min{0});
  }
  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t out_dim() const { return out_channels > 0 ? out_channels : in_channels; }
  int64_t patch_volume() const { return patch_size[0] * patch_size[1] * patch_size[2]; }
  // The 3D RoPE's split of the head dimension: h and w get 2 (d / 6) each, t the rest.
  int64_t rope_t_dim() const { return attention_head_dim - 2 * rope_hw_dim(); }
  int64_t rope_hw_dim() const { return 2 * (attention_head_dim / 6); }
  int64_t num_parameters() const;
  void validate(const lf::config::Node& tree, const std::string& prefix, lf::config::ErrorList& errors) const;
};

// The prediction in token space: [s_r, b, patch volume x out_channels] for the tokens at
// `positions` [s_r] (int64, CPU; raster (frame, row, column) order of the patch grid), each token's
// channels in (t, h, w, channel) patch order. Every token without context parallelism; this CP
// rank's tokens (parallel/context: chunks r and 2 CP - 1 - r) with it.
struct WanTokens {
  at::Tensor tokens, positions;
};

// One forward's inputs, as diffusers' WanTransformer3DModel takes them.
struct WanInputs {
  at::Tensor latents;    // hidden_states [b, c, f, h, w]
  at::Tensor timestep;   // [b] or [b, tokens] (per token: Wan 2.2 TI2V), float
  at::Tensor text;       // encoder_hidden_states [b, l, text_dim]
  at::Tensor image;      // encoder_hidden_states_image [b, li, image_dim] (I2V) or undefined
};

class WanDit {
 public:
  // Registers diffusers' parameter names (patch_embedding.weight, condition_embedder.*,
  // blocks.<i>.*, proj_out.*, scale_shift_table) in `b`, q/k/v, norm_q/norm_k and the MLP's first
  // layer split over TP by heads / columns, to_out and the MLP's second layer by rows (the TP group's
// sequence_parallel: the blocks run on sequence chunks). seed /
  // tp_rank: the random streams (recompute replays them).
  WanDit(const WanConfig& c, const lf::backend::DeviceBackend& backend, ParamBuilder& b, uint64_t seed, int tp_rank);
  // The prediction [b, out_channels, f, h, w] (the parameters' dtype; fp32 norms and modulation).
  // Without context parallelism.
  at::Tensor forward(const WanInputs& in) const;
  // The prediction of this rank's tokens (the loss needs no more). Sequence parallelism: each TP
  // rank runs the blocks on 1 / TP of them, gathered at the end; context parallelism: attention by
  // Ulysses all-to-all over the CP group (set_context_parallel).
  WanTokens forward_tokens(const WanInputs& in) const;
  // Patchify `x` [b, c, f, h, w] into the layout of WanTokens::tokens (every token).
  at::Tensor patchify_like_output(const at::Tensor& x) const;
  // Spreads the video tokens over `group` (null or size 1: off).
  void set_context_parallel(lf::backend::Communicator* group);
  const lf::parallel::ContextParallel& context_parallel() const { return cp_; }

  void set_training(bool t) { training_ = t; }
  void set_recompute(const RecomputeOptions& r) { recompute_ = r; }
  // Gradient-accumulation fusion (null: none): the linear layers' weight gradients go straight
  // into the slots this names (lf::ops::linear).
  void set_weight_grad_slots(const lf::ops::WeightGradSlots* slots) { slots_ = slots; }
  // FP8 for the blocks' linear layers (null: none): self-attention q/k/v and cross-attention q and
  // context k/v (the policy's qkv kind), both attentions' out (proj), the FFN's two (fc1, fc2), each
  // at its own GEMM's rows; the embedders, the modulation and the head stay in the training dtype,
  // as do the policy's first/last blocks. False when it keeps every block; counts beyond the
  // blocks throw. The policy must outlive training.
  bool set_fp8(const lf::ops::Fp8Policy* fp8);
  lf::parallel::RngTracker& rng() const { return rng_; }
  const WanConfig& config() const { return c_; }

 private:
  struct Attention {
    at::Tensor q, q_bias, k, k_bias, v, v_bias, norm_q, norm_k, out, out_bias;
    at::Tensor add_k, add_k_bias, add_v, add_v_bias, norm_added_k;  // I2V (cross-attention)
  };
  struct Block {
    at::Tensor table;  // scale_shift_table [1, 6, inner]
    Attention self, cross;
    at::Tensor norm2_w, norm2_b;  // cross_attn_norm
    at::Tensor ffn_in, ffn_in_bias, ffn_out, ffn_out_bias;
    bool fp8 = false;  // set_fp8: this block's linear layers follow the policy
  };
  Attention make_attention(ParamBuilder& b, const std::string& prefix, bool cross) const;
  // RMSNorm over all heads' channels (each TP rank holds its heads: the sum of squares is
  // all-reduced).
  at::Tensor head_rms_norm(const at::Tensor& x, const at::Tensor& w) const;
  // lf::ops::linear with this model's weight-gradient slots.
  at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
  // x [s, b, h] -> the branch output [s, b, h]. rope: cos/sin [s, d/2] (self-attention); context
  // [t, b, h] (cross); image [ti, b, h] (I2V).
  // fp8: the block's policy (null: training dtype).
  at::Tensor self_attention(const Attention& a, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const lf::ops::Fp8Policy* fp8) const;
  at::Tensor cross_attention(const Attention& a, const at::Tensor& x, const at::Tensor& text,
                             const at::Tensor& image, const lf::ops::Fp8Policy* fp8) const;
  // One block: x [s, b, h]; mod: the six modulation terms, each [1|s, b, h] fp32.
  at::Tensor block_forward(const Block& blk, const at::Tensor& x, const at::Tensor& mod, const at::Tensor& text,
                           const at::Tensor& image, const at::Tensor& cos, const at::Tensor& sin) const;

  WanConfig c_;
  const lf::backend::DeviceBackend& backend_;
  lf::parallel::TensorParallel tp_;
  at::Tensor patch_w_, patch_b_;
  at::Tensor time1_, time1_b_, time2_, time2_b_, time_proj_, time_proj_b_;
  at::Tensor text1_, text1_b_, text2_, text2_b_;
  at::Tensor img_norm1_w_, img_norm1_b_, img_ff1_, img_ff1_b_, img_ff2_, img_ff2_b_, img_norm2_w_, img_norm2_b_, img_pos_;
  std::vector<Block> blocks_;
  at::Tensor proj_out_, proj_out_b_, table_out_;
  lf::parallel::ContextParallel cp_;
  bool training_ = true;
  RecomputeOptions recompute_;
  const lf::ops::WeightGradSlots* slots_ = nullptr;
  const lf::ops::Fp8Policy* fp8_ = nullptr;
  mutable lf::parallel::RngTracker rng_;
};

// Diffusers' sinusoidal timestep embedding (flip_sin_to_cos, no frequency shift): t [n] ->
// [n, dim] fp32, cos then sin.
at::Tensor wan_timestep_embedding(const at::Tensor& t, int64_t dim);

}  // namespace lf::models

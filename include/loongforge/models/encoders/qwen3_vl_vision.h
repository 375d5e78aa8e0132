// The `qwen3_vl_vision` component: Qwen3-VL's vision tower, math equal to transformers'
// Qwen3VLVisionModel: the patch embedding (a Conv3d with bias, as one GEMM) of the processor's
// flattened [C T P P] patches plus a learned square position table resampled bilinearly to each
// image's grid, 2D (h, w) RoPE, LayerNorm blocks with full attention per frame (no windows) and a
// GELU MLP, the 2x2 patch merger, and the DeepStack mergers: blocks listed in
// deepstack_visual_indexes also hand their output, merged by a merger of their own, to the
// language model (qwen3_vl composite). Tensor-parallel over its own context's TP group (heads,
// MLP and mergers' hidden width split), as the Qwen2.5 tower.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/models/blocks/mlp.h"
#include "loongforge/models/blocks/norms.h"
#include "loongforge/models/recompute.h"

namespace lf::models {

class Registry;

// Field names and meanings of transformers' Qwen3VLVisionConfig (rope_parameters.rope_theta as
// rope_theta).
struct Qwen3VisionConfig {
  int64_t depth = 0;              // vision blocks
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // the blocks' MLP hidden width
  int64_t num_heads = 0;
  int64_t in_channels = 3;
  int64_t patch_size = 16;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  int64_t out_hidden_size = 0;  // the mergers' output width (0: the foundation's hidden size)
  int64_t num_position_embeddings = 2304;  // a square table: side sqrt(n)
  std::vector<int64_t> deepstack_visual_indexes = {8, 16, 24};
  std::string hidden_act = "gelu_pytorch_tanh";
  double rope_theta = 10000;
  double initializer_range = 0.02;

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("depth", depth, "Vision transformer blocks", Required{}, Min{1});
    v("hidden_size", hidden_size, "Width of the vision blocks", Required{}, Min{1});
    v("intermediate_size", intermediate_size, "Hidden width of the blocks' MLP", Required{}, Min{1});
    v("num_heads", num_heads, "Attention heads", Required{}, Min{1});
    v("in_channels", in_channels, "Image channels", Min{1});
    v("patch_size", patch_size, "Spatial patch side in pixels", Min{1});
    v("spatial_merge_size", spatial_merge_size, "The mergers group merge x merge patches into one output", Min{1});
    v("temporal_patch_size", temporal_patch_size, "Frames per patch", Min{1});
    v("out_hidden_size", out_hidden_size, "Output width of the mergers (0: the foundation's hidden size)", Min{0});
    v("num_position_embeddings", num_position_embeddings,
      "Rows of the learned position table (a square number: a side x side grid resampled to each image)", Min{1});
    v("deepstack_visual_indexes", deepstack_visual_indexes,
      "Blocks whose outputs (each through its own merger) are added to the language model's hidden states after "
      "its layers 0, 1, ...",
      Min{0});
    v("hidden_act", hidden_act, "Activation of the blocks' MLP (gelu_pytorch_tanh: tanh GELU; gelu: erf GELU)",
      OneOf{{"gelu_pytorch_tanh", "gelu"}});
    v("rope_theta", rope_theta, "Base of the 2D rotary embedding", Min{1});
    v("initializer_range", initializer_range, "Std of the normal initialisation", Min{0});
  }
  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t merged_size() const { return hidden_size * spatial_merge_size * spatial_merge_size; }
  // With out_hidden_size resolved (> 0).
  int64_t num_parameters() const;
};

// The tower's outputs: the merger's [num_patches / merge^2, out_hidden_size] rows and, per entry of
// deepstack_visual_indexes (in that order), its merger's rows of the same shape.
struct Qwen3VisionOutput {
  at::Tensor merged;
  std::vector<at::Tensor> deepstack;
};

class Qwen3VisionEncoder {
 public:
  Qwen3VisionEncoder() = default;
  // Registers, in this order: <name>.patch_embed.weight [hidden, C T P P], .bias [hidden];
  // <name>.pos_embed.weight [num_position_embeddings, hidden]; per block N <name>.blocks.N.{norm1.*
  // (LayerNorm), attention.linear_qkv.weight [heads (3) d, hidden] + .bias (per head its q, k, v
  // rows, split over TP by heads), attention.linear_proj.*, norm2.*, mlp.linear_fc1.*,
  // mlp.linear_fc2.*}; <name>.merger.{norm.* [hidden], linear_fc1.*, linear_fc2.*}; per DeepStack
  // entry K <name>.deepstack_merger.K.{norm.* [merge^2 hidden], linear_fc1.*, linear_fc2.*}.
  // config.out_hidden_size must be resolved (> 0).
  Qwen3VisionEncoder(const Qwen3VisionConfig& config, const lf::backend::DeviceBackend& backend, ParamBuilder& b,
                     const std::string& name);

  // pixel_values: [num_patches, C T P P] (the processor's rows), grid_thw: [num_media, 3] int64
  // (t, h, w in patches; several images and videos) -> the merged rows in the input's order and
  // the DeepStack rows, replicated over this encoder's TP group. Attention runs frame by frame.
  Qwen3VisionOutput forward(const at::Tensor& pixel_values, const at::Tensor& grid_thw) const;

  // Loads transformers' vision tensors (names `prefix` + patch_embed.proj.*, pos_embed.weight,
  // blocks.N.*, merger.*, deepstack_merger_list.K.*) into this rank's shards. Every tensor under
  // the prefix must be used and every parameter found, with HF's shapes.
  void load_hf_state(const std::map<std::string, at::Tensor>& tensors, const std::string& prefix = "model.visual.");

  const Qwen3VisionConfig& config() const { return c_; }
  // The job's full recomputation applied to the blocks (models/recompute.h run_blocks).
  void set_recompute(const RecomputeOptions& r) { recompute_ = r; }
  const RecomputeOptions& recompute() const { return recompute_; }
  const std::vector<lf::parallel::Parameter>& parameters() const { return params_; }

 private:
  struct Block {
    Norm norm1, norm2;
    at::Tensor qkv, qkv_bias, proj, proj_bias, fc1, fc1_bias, fc2, fc2_bias;
  };
  struct Merger {
    Norm norm;
    bool postshuffle = false;  // the norm over the merged row (DeepStack) instead of each patch
    Mlp mlp;
  };
  at::Tensor attention(const Block& blk, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const std::vector<int64_t>& frames) const;
  at::Tensor mlp(const Block& blk, const at::Tensor& x) const;
  at::Tensor merge(const Merger& m, const at::Tensor& x) const;
  Merger make_merger(ParamBuilder& b, const std::string& prefix, bool postshuffle) const;

  Qwen3VisionConfig c_;
  RecomputeOptions recompute_;
  std::string name_;
  const lf::backend::DeviceBackend* backend_ = nullptr;
  lf::parallel::TensorParallel tp_;
  at::Tensor patch_embed_, patch_bias_, pos_embed_;
  std::vector<Block> blocks_;
  Merger merger_;
  std::vector<Merger> deepstack_;
  std::vector<lf::parallel::Parameter> params_;
};

// Bilinear resampling (align_corners) of the side x side position table to every patch of the
// grids, as transformers' get_vision_interpolation_indices_and_weights (merge-block token order):
// indices [n, 4] int64 into the flattened table and weights [n, 4] fp32.
std::pair<at::Tensor, at::Tensor> qwen3_vision_position_taps(const at::Tensor& grid_thw, int64_t side,
                                                             int64_t spatial_merge_size);

// transformers' vision tensors (names after `prefix`) -> the full tensors under this encoder's
// parameter names (relative to its name), in our layouts (conv kernel flattened, qkv rows
// regrouped per head). Throws naming the tensor when one is missing, stray or misshapen.
std::map<std::string, at::Tensor> qwen3_vision_from_hf(const Qwen3VisionConfig& config,
                                                       const std::map<std::string, at::Tensor>& tensors,
                                                       const std::string& prefix = "model.visual.");

void register_qwen3_vision(Registry& r);

}  // namespace lf::models

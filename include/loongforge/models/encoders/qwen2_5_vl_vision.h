// The `qwen2_5_vl_vision` component: Qwen2.5-VL's vision tower with its patch merger (the
// projector), math equal to transformers' Qwen2_5_VisionTransformerPretrainedModel: patch
// embedding of the processor's flattened [C T P P] patches, 2D (h, w) RoPE, window attention with
// full-attention layers, SwiGLU blocks, the 2x2 merger. Tensor-parallel over its own context's TP
// group (heads and MLP hidden split). Not the vlm composite, M-RoPE or media decoding.
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

// Field names and meanings of transformers' Qwen2_5_VLVisionConfig.
struct Qwen25VisionConfig {
  int64_t depth = 0;              // vision blocks
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // SwiGLU hidden width
  int64_t num_heads = 0;
  int64_t in_channels = 3;
  int64_t patch_size = 14;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  int64_t window_size = 112;  // pixels: windows of window_size / patch_size / spatial_merge_size merged units
  std::vector<int64_t> fullatt_block_indexes = {7, 15, 23, 31};
  int64_t out_hidden_size = 0;  // the merger's output width (0: the foundation's hidden size)
  std::string hidden_act = "silu";
  double rope_theta = 10000;
  double initializer_range = 0.02;  // std of the normal initialisation

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("depth", depth, "Vision transformer blocks", Required{}, Min{1});
    v("hidden_size", hidden_size, "Width of the vision blocks", Required{}, Min{1});
    v("intermediate_size", intermediate_size, "Hidden width of the blocks' SwiGLU MLP", Required{}, Min{1});
    v("num_heads", num_heads, "Attention heads", Required{}, Min{1});
    v("in_channels", in_channels, "Image channels", Min{1});
    v("patch_size", patch_size, "Spatial patch side in pixels", Min{1});
    v("spatial_merge_size", spatial_merge_size, "The merger groups merge x merge patches into one output", Min{1});
    v("temporal_patch_size", temporal_patch_size, "Frames per patch", Min{1});
    v("window_size", window_size, "Side of an attention window in pixels", Min{1});
    v("fullatt_block_indexes", fullatt_block_indexes, "Blocks attending over whole images (the others: windows)",
      Min{0});
    v("out_hidden_size", out_hidden_size, "Output width of the merger (0: the foundation's hidden size)", Min{0});
    v("hidden_act", hidden_act, "Activation of the blocks' gated MLP", OneOf{{"silu"}});
    v("rope_theta", rope_theta, "Base of the 2D rotary embedding", Min{1});
    v("initializer_range", initializer_range, "Std of the normal initialisation", Min{0});
  }
  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  // With out_hidden_size resolved (> 0).
  int64_t num_parameters() const;
};

class Qwen25VisionEncoder {
 public:
  Qwen25VisionEncoder() = default;
  // Registers, in this order: <name>.patch_embed.weight [hidden, C T P P]; per block N
  // <name>.blocks.N.{norm1.weight, attention.linear_qkv.weight [heads (3) d, hidden] (+ .bias;
  // per head its q, k, v rows: Megatron's layout, split over TP by heads), attention.linear_proj.*,
  // norm2.weight, mlp.linear_fc1.* ([gate; up]), mlp.linear_fc2.*}; <name>.merger.ln_q.weight,
  // <name>.merger.mlp.linear_fc1.*, <name>.merger.mlp.linear_fc2.*. config.out_hidden_size must
  // be resolved (> 0).
  Qwen25VisionEncoder(const Qwen25VisionConfig& config, const lf::backend::DeviceBackend& backend, ParamBuilder& b,
                      const std::string& name);

  // pixel_values: [num_patches, C T P P] (the rows transformers' Qwen2VLImageProcessor emits),
  // grid_thw: [num_media, 3] int64 (t, h, w in patches; several images and videos) ->
  // [num_patches / merge^2, out_hidden_size] in the input's order, replicated over this
  // encoder's TP group. Attention runs segment by segment (a frame, or a window of it): no mask.
  at::Tensor forward(const at::Tensor& pixel_values, const at::Tensor& grid_thw) const;

  // Loads transformers' vision tensors (names `prefix` + patch_embed.proj.weight, blocks.N.*,
  // merger.*: the `visual.` part of a Qwen2.5-VL checkpoint) into this rank's shards. Every
  // tensor under the prefix must be used and every parameter found, with HF's shapes.
  void load_hf_state(const std::map<std::string, at::Tensor>& tensors, const std::string& prefix = "visual.");

  const Qwen25VisionConfig& config() const { return c_; }
  // The job's full recomputation applied to the blocks (models/recompute.h run_blocks).
  void set_recompute(const RecomputeOptions& r) { recompute_ = r; }
  const RecomputeOptions& recompute() const { return recompute_; }
  // This encoder's parameter records (shards), in registration order.
  const std::vector<lf::parallel::Parameter>& parameters() const { return params_; }

 private:
  struct Block {
    Norm norm1, norm2;
    at::Tensor qkv, qkv_bias, proj, proj_bias;
    Mlp mlp;
  };
  // x: [s, 1, hidden] in window order -> the attention branch.
  at::Tensor attention(const Block& blk, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const std::vector<int64_t>& segments) const;

  Qwen25VisionConfig c_;
  RecomputeOptions recompute_;
  std::string name_;
  const lf::backend::DeviceBackend* backend_ = nullptr;
  lf::parallel::TensorParallel tp_;
  at::Tensor patch_embed_;
  std::vector<Block> blocks_;
  Norm ln_q_;
  Mlp merger_;
  std::vector<lf::parallel::Parameter> params_;
};

// transformers' tensors of the vision tower (names after `prefix`: patch_embed.proj.weight
// [hidden, C, T, P, P], blocks.N.attn.qkv [3 hidden, hidden] ...) -> the full tensors under this
// encoder's parameter names (relative to its name: "patch_embed.weight", "blocks.0.norm1.weight"
// ...), in our layouts (conv kernel flattened, qkv rows regrouped per head, gate and up stacked).
// Throws naming the tensor when one is missing or has a shape the config contradicts.
std::map<std::string, at::Tensor> qwen25_vision_from_hf(const Qwen25VisionConfig& config,
                                                        const std::map<std::string, at::Tensor>& tensors,
                                                        const std::string& prefix = "visual.");

void register_qwen25_vision(Registry& r);

}  // namespace lf::models

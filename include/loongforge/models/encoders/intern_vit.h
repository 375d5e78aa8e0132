// InternViT (InternVL 2.5 / 3 / 3.5's vision tower, transformers' InternVLVisionModel) with
// InternVL's pixel-shuffle MLP projector (InternVLMultiModalProjector), as one component of kind
// vision_encoder: a tile of image_size x image_size pixels -> a CLS token and its patches, learned
// absolute positions, pre-norm blocks with layer scale (lambda_1, lambda_2) and optional q/k
// RMSNorm, then (CLS dropped) the patch grid pixel-shuffled by downsample_ratio (2 x 2 patches ->
// one row of 4 hidden) and projected by LayerNorm -> Linear -> GELU -> Linear to the language
// model's width. Tiles come as the Qwen-VL towers' inputs do: patch rows [tiles x g^2, C P P]
// (channel-major, each tile's patches row by row; a Conv2d with kernel = stride is one linear map
// over them) with a grid [tiles, 3] of (1, g, g), g = image_size / patch_size, so that the VLM
// composites' exchanges (models/composites/vision_modes.h) carry them unchanged. At TP 1.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/models/blocks/norms.h"
#include "loongforge/models/recompute.h"
#include "loongforge/parallel/sharding.h"

namespace lf::models {

class ParamBuilder;
class Registry;

// Field names of transformers' InternVLVisionConfig, plus the projector's fields of InternVLConfig
// (downsample_ratio, projector_hidden_act, vision_feature_layer, vision_feature_select_strategy):
// here the projector belongs to the tower, as Qwen-VL's merger does.
struct InternVisionConfig {
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t intermediate_size = 0;
  int64_t num_channels = 3;
  int64_t image_size = 448;  // a tile's side in pixels
  int64_t patch_size = 14;
  bool attention_bias = false;
  bool use_qk_norm = false;
  std::string hidden_act = "gelu";
  std::string norm_type = "layer_norm";
  double layer_norm_eps = 1e-6;
  double layer_scale_init_value = 0.1;
  bool use_absolute_position_embeddings = true;
  bool use_mean_pooling = true;  // false: a final LayerNorm over the blocks' outputs
  double initializer_range = 0.02;
  double downsample_ratio = 0.5;
  std::string projector_hidden_act = "gelu";
  int64_t vision_feature_layer = -1;  // -1: the last (normed) output; else the output of that layer
  std::string vision_feature_select_strategy = "default";
  int64_t out_hidden_size = 0;  // the projector's output width (0: the foundation's hidden size)

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("hidden_size", hidden_size, "Width of the vision blocks", Required{}, Min{1});
    v("num_hidden_layers", num_hidden_layers, "Vision transformer blocks", Required{}, Min{1});
    v("num_attention_heads", num_attention_heads, "Attention heads", Required{}, Min{1});
    v("intermediate_size", intermediate_size, "Hidden width of the blocks' MLP", Required{}, Min{1});
    v("num_channels", num_channels, "Image channels", Min{1});
    v("image_size", image_size, "A tile's side in pixels (the position table's grid is image_size / patch_size)",
      Min{1});
    v("patch_size", patch_size, "Patch side in pixels", Min{1});
    v("attention_bias", attention_bias, "Biases on the q, k, v projections");
    v("use_qk_norm", use_qk_norm, "RMSNorm over the queries and keys (InternViT-6B)");
    v("hidden_act", hidden_act, "Activation of the blocks' MLP", OneOf{{"gelu"}});
    v("norm_type", norm_type, "The blocks' norms", OneOf{{"layer_norm", "rms_norm"}});
    v("layer_norm_eps", layer_norm_eps, "Epsilon of the blocks' norms", Min{0});
    v("layer_scale_init_value", layer_scale_init_value, "Initial value of the layer scales lambda_1, lambda_2");
    v("use_absolute_position_embeddings", use_absolute_position_embeddings, "A learned position table");
    v("use_mean_pooling", use_mean_pooling, "transformers' flag: false adds a final LayerNorm over the outputs");
    v("initializer_range", initializer_range, "Std of the normal initialisation", Min{0});
    v("downsample_ratio", downsample_ratio,
      "Pixel shuffle: each side scaled by this ratio (0.5: 2 x 2 patches become one row of 4 hidden)", Min{0});
    v("projector_hidden_act", projector_hidden_act, "Activation between the projector's linears", OneOf{{"gelu"}});
    v("vision_feature_layer", vision_feature_layer,
      "The features projected: -1 the last output (after the final norm, if any), k >= 0 the output of layer k "
      "(0: the embeddings), -n the n-th from the end");
    v("vision_feature_select_strategy", vision_feature_select_strategy, "default: the CLS token dropped",
      OneOf{{"default"}});
    v("out_hidden_size", out_hidden_size, "Output width of the projector (0: the foundation's hidden size)", Min{0});
  }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t grid() const { return image_size / patch_size; }  // patches per tile side
  int64_t patch_dim() const { return num_channels * patch_size * patch_size; }
  int64_t merge() const;  // 1 / downsample_ratio
  int64_t shuffled_size() const { return hidden_size * merge() * merge(); }
  // With out_hidden_size resolved (> 0).
  int64_t num_parameters() const;
};

class InternVisionEncoder {
 public:
  InternVisionEncoder() = default;
  // Registers, in this order: <name>.patch_embed.weight [hidden, C P P], .bias; <name>.cls_token
  // [hidden]; <name>.pos_embed.weight [g^2 + 1, hidden] (if absolute positions); per block N
  // <name>.blocks.N.{norm1.*, attention.linear_{q,k,v}.weight (+ .bias), attention.q_norm.weight,
  // attention.k_norm.weight (qk norm), attention.linear_proj.*, ls1, ls2 [hidden], norm2.*,
  // mlp.linear_fc1.*, mlp.linear_fc2.*}; <name>.final_norm.* (without mean pooling);
  // <name>.projector.{norm.*, linear_fc1.*, linear_fc2.*}. Replicated (TP 1).
  InternVisionEncoder(const InternVisionConfig& config, const lf::backend::DeviceBackend& backend, ParamBuilder& b,
                      const std::string& name);

  // rows [tiles g^2, C P P], grid [tiles, 3] int64 of (1, g, g) -> the projected rows
  // [tiles g^2 / merge^2, out_hidden_size], tile by tile in transformers' pixel-shuffle order.
  at::Tensor forward(const at::Tensor& rows, const at::Tensor& grid) const;
  // transformers' pixel_values [tiles, C, S, S] -> rows as forward takes them, and their grid.
  std::pair<at::Tensor, at::Tensor> rows_of_pixels(const at::Tensor& pixel_values) const;

  // transformers' tensors (names `vision_prefix` + embeddings.*, encoder.layer.N.*, layernorm.*;
  // `projector_prefix` + layer_norm.*, linear_1.*, linear_2.*) into the parameters. Every tensor
  // under the prefixes must be used and every parameter found, with HF's shapes.
  void load_hf_state(const std::map<std::string, at::Tensor>& tensors,
                     const std::string& vision_prefix = "model.vision_tower.",
                     const std::string& projector_prefix = "model.multi_modal_projector.");

  const InternVisionConfig& config() const { return c_; }
  // The job's full recomputation applied to the blocks (models/recompute.h run_blocks).
  void set_recompute(const RecomputeOptions& r) { recompute_ = r; }
  const RecomputeOptions& recompute() const { return recompute_; }
  const std::vector<lf::parallel::Parameter>& parameters() const { return params_; }

 private:
  struct Block {
    Norm norm1, norm2, q_norm, k_norm;
    at::Tensor q, q_bias, k, k_bias, v, v_bias, proj, proj_bias, ls1, ls2, fc1, fc1_bias, fc2, fc2_bias;
  };
  at::Tensor block(const Block& blk, const at::Tensor& x) const;

  InternVisionConfig c_;
  RecomputeOptions recompute_;
  std::string name_;
  const lf::backend::DeviceBackend* backend_ = nullptr;
  at::Tensor patch_embed_, patch_bias_, cls_, pos_embed_;
  std::vector<Block> blocks_;
  Norm final_norm_, projector_norm_;
  at::Tensor fc1_, fc1_bias_, fc2_, fc2_bias_;
  std::vector<lf::parallel::Parameter> params_;
};

// transformers' tensors -> the full tensors under this encoder's parameter names (relative to
// its name): the inverse of intern_vision_to_hf. Throws naming a missing, mis-shaped or stray tensor.
std::map<std::string, at::Tensor> intern_vision_from_hf(const InternVisionConfig& config,
                                                        const std::map<std::string, at::Tensor>& tensors,
                                                        const std::string& vision_prefix,
                                                        const std::string& projector_prefix);

// The parameter names (relative to the encoder) and full shapes, in registration order.
std::vector<std::pair<std::string, std::vector<int64_t>>> intern_vision_tensors(const InternVisionConfig& config);
// Our full tensors (relative names) -> transformers' (prefixed names and shapes): the inverse of
// intern_vision_from_hf, a rearrangement (bit for bit).
std::vector<std::pair<std::string, at::Tensor>> intern_vision_to_hf(const InternVisionConfig& config,
                                                                    const std::map<std::string, at::Tensor>& ours,
                                                                    const std::string& vision_prefix,
                                                                    const std::string& projector_prefix);

void register_intern_vision(Registry& r);

}  // namespace lf::models

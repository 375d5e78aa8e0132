// The `internvl` composite: InternVL 2.5 / 3 / 3.5 (transformers' InternVLForConditionalGeneration).
// The vision tower + pixel-shuffle projector (slot `vision_encoder`, encoders/intern_vit.h)
// encodes the batch's image tiles; its rows replace the embeddings of the image placeholder tokens
// (`image_token_id`, IMG_CONTEXT, in order: each tile (image_size / patch_size)^2 x
// downsample_ratio^2 of them) of a decoder foundation with 1D RoPE (qwen2, qwen3, llama ...); then
// the LM head and causal_lm's loss. Batch fields: causal_lm's plus `pixel_values` (the tiles' patch
// rows [tiles g^2, C P P], InternVisionEncoder::rows_of_pixels of transformers' [tiles, C, S, S])
// and `image_grid_thw` [tiles, 3] of (1, g, g). The tower's layouts are the Qwen-VL composites'
// (models/composites/vision_modes.h): TP 1 on the first stage, encoder hetero DP, ViT DP balance,
// full hetero DP.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/core/config/schema.h"
#include "loongforge/models/composites/vision_lm.h"
#include "loongforge/models/encoders/intern_vit.h"

namespace lf::models {

// Field names of transformers' InternVLConfig (the projector's fields are the tower's).
struct InternVlConfig {
  int64_t image_token_id = 151667;

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("image_token_id", image_token_id, "The image placeholder token (IMG_CONTEXT; one per projected row)", Min{0});
  }
};

class InternVl : public VisionLm {
 public:
  // vision: its out_hidden_size 0 becomes the foundation's hidden size; drawn from
  // component_seed(seed, "vision_encoder") at TP 1; vision_context as Qwen25Vl's.
  InternVl(const DecoderConfig& foundation, const InternVisionConfig& vision, const InternVlConfig& config,
           const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
           const lf::dist::ParallelContext* parallel, bool sequence_parallel, const PipelineStage& stage,
           bool foundation_trainable = true, std::unique_ptr<lf::dist::ParallelContext> vision_context = nullptr,
           bool vision_trainable = true);
  ~InternVl() override;

  const std::string& type() const override;
  std::vector<std::string> batch_fields() const override;
  bool supports_chunkpipe() const override { return false; }

  // Whole model: tokens [b, s], transformers' pixel_values [tiles, C, S, S] (undefined: text only)
  // -> full-vocabulary logits [s, b, vocab_size].
  at::Tensor logits(const at::Tensor& tokens, const at::Tensor& pixel_values) const;

  // An InternVLForConditionalGeneration state dict (transformers 5 names: model.vision_tower.*,
  // model.multi_modal_projector.*, model.language_model.*, lm_head.weight) -> this rank's shards.
  // Every tensor must be used.
  void load_hf_state(const std::map<std::string, at::Tensor>& tensors, const std::string& text_architecture);

  const InternVisionEncoder& vision_encoder() const { return *encoder_; }
  // The job's recomputation: the decoder's layers and the tower's blocks (its full recomputation).
  void set_recompute(const RecomputeOptions& r) override {
    CausalLm::set_recompute(r);
    if (encoder_) encoder_->set_recompute(r);
  }
  const InternVlConfig& own_config() const { return config_; }

 protected:
  std::vector<std::pair<std::string, std::string>> media_fields() const override {
    return {{"pixel_values", "image_grid_thw"}};
  }
  at::Tensor embed_inputs(const Batch& batch) const override;

 private:
  // [b, s] tokens + tile rows and grids -> [s, b, h] embeddings, placeholders replaced.
  at::Tensor embed_with_media(const at::Tensor& tokens, const at::Tensor& rows, const at::Tensor& grid) const;

  InternVlConfig config_;
  std::unique_ptr<InternVisionEncoder> encoder_;
};

void register_internvl(Registry& r);

}  // namespace lf::models

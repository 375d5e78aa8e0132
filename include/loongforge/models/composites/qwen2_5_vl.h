// The `qwen2_5_vl` composite: Qwen2.5-VL end to end. The vision tower + merger (slot
// `vision_encoder`, encoders/qwen2_5_vl_vision.h) encodes the batch's images; its outputs replace
// the embeddings of the image placeholder tokens (`image_token_id`, in order) of a decoder
// foundation whose RoPE is M-RoPE (its `mrope_section` set); the position ids are transformers'
// get_rope_index (qwen2_5_vl_position_ids below); then the LM head, the loss the causal LM's.
// Batch fields: those of causal_lm plus `pixel_values` [num_patches, C T P P] (the rows of
// transformers' Qwen2VLImageProcessor) and `image_grid_thw` [num_images, 3] (t, h, w in patches;
// the micro-batch's images in sample order); for videos `pixel_values_videos`, `video_grid_thw`
// (the video processor's) and optionally `second_per_grid_ts` [num_videos] float (seconds per
// temporal grid step, default 1). The encoder runs at TP 1 on the first pipeline
// stage, every rank of a foundation TP group encoding all of the micro-batch's images (its context:
// those ranks as the share axis cp, each contributing 1 / cp of the gradient; DP the foundation's);
// the foundation has any TP and PP.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/core/config/schema.h"
#include "loongforge/data/multimodal.h"
#include "loongforge/models/composites/vision_lm.h"
#include "loongforge/models/encoders/qwen2_5_vl_vision.h"

namespace lf::models {

// Field names of transformers' Qwen2_5_VLConfig.
struct Qwen25VlConfig {
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t tokens_per_second = 2;  // video: temporal positions per second of frames
  int64_t mock_image_patches = 0;  // --mock-data only: each sample's image is N x N patches (0: 2 merge)

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("image_token_id", image_token_id, "The image placeholder token (one per merged vision patch)", Min{0});
    v("video_token_id", video_token_id, "The video placeholder token", Min{0});
    v("tokens_per_second", tokens_per_second, "Video: temporal position steps per second", Min{1});
    v("mock_image_patches", mock_image_patches,
      "--mock-data only (not a transformers field): each sample starts with one random image of N x N patches, "
      "(N / spatial_merge_size)^2 placeholders; N a multiple of spatial_merge_size (0: 2 spatial_merge_size, "
      "4 placeholders)",
      Min{0});
  }
};

// The foundation as qwen2_5_vl runs it: an unset mrope_section takes Qwen2.5-VL's proportions of
// the rotary head_dim / 2 (a quarter temporal, the rest split between height and width: [16, 24, 24]
// at head_dim 128, [2, 3, 3] at 16; multi-latent attention: of its decoupled RoPE dims,
// qk_pos_emb_head_dim), so that swapping the backbone preset is one YAML line; unchanged when set.
DecoderConfig qwen2_5_vl_foundation(DecoderConfig foundation);

// transformers' Qwen2_5_VLModel.get_rope_index: input_ids [b, s] int64 -> position ids [3, b, s]
// (temporal, height, width). Text tokens count up on all three axes; a run of t h w / merge^2
// image (video) placeholders takes the next grid of image_grid_thw (video_grid_thw) and the
// positions start + (t', h', w') over its merged grid (t' = 0 for images, floor(frame x
// tokens_per_second x second_per_grid_ts[v]) for videos); the text after it continues at start +
// max(h, w) / merge. Grids are consumed in sample order. Throws naming the counts when the
// placeholders do not match the grids. documents (optional, [b, s] int64: packed conversations,
// --packing-sft-data): the positions restart at 0 where a document starts, each document's as if
// it were alone.
at::Tensor qwen2_5_vl_position_ids(const at::Tensor& input_ids, const at::Tensor& image_grid_thw,
                                   const at::Tensor& video_grid_thw, const std::vector<double>& second_per_grid_ts,
                                   const Qwen25VlConfig& ids, int64_t spatial_merge_size,
                                   const at::Tensor& documents = {});

// A batch's media: images and videos as transformers' processors emit them (undefined: none).
struct Qwen25VlMedia {
  at::Tensor pixel_values, image_grid_thw;         // [patches, C T P P], [images, 3]
  at::Tensor pixel_values_videos, video_grid_thw;  // [patches, C T P P], [videos, 3]
  std::vector<double> second_per_grid_ts;          // per video; empty: 1.0 each
};

class Qwen25Vl : public VisionLm {
 public:
  // vision: its out_hidden_size 0 becomes the foundation's hidden size. The encoder's parameters
  // are drawn from component_seed(seed, "vision_encoder") at TP 1; vision_context: the context
  // its gradients are reduced over (TP 1, cp = the ranks encoding the same images; may be null:
  // single device); held by the model.
  Qwen25Vl(const DecoderConfig& foundation, const Qwen25VisionConfig& vision, const Qwen25VlConfig& config,
           const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
           const lf::dist::ParallelContext* parallel, bool sequence_parallel, const PipelineStage& stage,
           bool foundation_trainable = true, std::unique_ptr<lf::dist::ParallelContext> vision_context = nullptr,
           bool vision_trainable = true);
  ~Qwen25Vl() override;

  const std::string& type() const override;
  std::vector<std::string> batch_fields() const override;
  bool supports_chunkpipe() const override { return false; }
  StageOutput stage_forward(const Batch& batch, const TensorMap& input, int64_t chunk, Pass pass) override;

  // Whole model: tokens [b, s], pixel_values [n, C T P P], image_grid_thw [images, 3] (both
  // undefined for text only) -> full-vocabulary logits [s, b, vocab_size].
  at::Tensor logits(const at::Tensor& tokens, const at::Tensor& pixel_values, const at::Tensor& image_grid_thw) const;
  // Images and videos: image placeholders take the images' embeddings, video placeholders the videos'.
  at::Tensor logits(const at::Tensor& tokens, const Qwen25VlMedia& media) const;
  // The M-RoPE position ids [3, b, s] of tokens with these images (and videos).
  at::Tensor position_ids(const at::Tensor& tokens, const at::Tensor& image_grid_thw) const;
  at::Tensor position_ids(const at::Tensor& tokens, const Qwen25VlMedia& media, const at::Tensor& documents = {}) const;
  // The media fields of a batch (pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw,
  // second_per_grid_ts), checked for shape.
  static Qwen25VlMedia media_of(const Batch& batch);
  // Stored media (a multimodal store's records, resized) -> the processors' fields: each medium
  // normalised and cut into rows, images and videos apart, in order.
  static Qwen25VlMedia media_of_records(const std::vector<lf::data::MediaRecord>& records,
                                        const lf::media::QwenVisionPreprocess& preprocess);
  // The inverse of media_of: the defined fields into `batch` (not sequence-aligned).
  static void set_media_fields(const Qwen25VlMedia& media, Batch& batch);

  // A Qwen2_5_VLForConditionalGeneration state dict (transformers 5 names: model.visual.*,
  // model.language_model.*, lm_head.weight; transformers 4's visual.* and model.* too) -> this
  // rank's shards. Every tensor must be used.
  void load_hf_state(const std::map<std::string, at::Tensor>& tensors);

  // The first pipeline stage only (every stage with --enable-full-hetero-dp).
  const Qwen25VisionEncoder& vision_encoder() const { return *encoder_; }
  // The job's recomputation: the decoder's layers and the tower's blocks (its full recomputation).
  void set_recompute(const RecomputeOptions& r) override {
    CausalLm::set_recompute(r);
    if (encoder_) encoder_->set_recompute(r);
  }
  const Qwen25VlConfig& own_config() const { return config_; }  // image / video ids, tokens_per_second

 protected:
  std::vector<std::pair<std::string, std::string>> media_fields() const override {
    return {{"pixel_values", "image_grid_thw"}, {"pixel_values_videos", "video_grid_thw"}};
  }
  at::Tensor embed_inputs(const Batch& batch) const override;

 private:
  // [b, s] tokens + the media -> [s, b, h] embeddings, placeholders replaced (not scattered).
  at::Tensor embed_with_media(const at::Tensor& tokens, const Qwen25VlMedia& media) const;
  static at::Tensor splice(const at::Tensor& x, const std::vector<at::Tensor>& masks, const std::vector<int64_t>& counts,
                           const at::Tensor& encoded);

  Qwen25VlConfig config_;
  std::unique_ptr<Qwen25VisionEncoder> encoder_;
};

void register_qwen2_5_vl(Registry& r);

}  // namespace lf::models

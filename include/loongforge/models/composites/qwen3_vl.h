// The `qwen3_vl` composite: Qwen3-VL end to end. The vision tower (slot `vision_encoder`,
// encoders/qwen3_vl_vision.h) encodes the batch's images and videos; its merged rows replace the
// embeddings of the placeholder tokens (`image_token_id`, `video_token_id`, in order) of a qwen3
// decoder foundation (per-head QK norm) whose RoPE is interleaved M-RoPE (`mrope_section` with
// `mrope_interleaved`); its DeepStack rows are added to the hidden states at the same positions
// after the decoder's layers 0, 1, ... (DecoderInputs::injections); the position ids are
// transformers' Qwen3VLModel.get_rope_index (qwen3_vl_position_ids below); then the LM head, the
// loss the causal LM's. Batch fields: those of causal_lm plus `pixel_values` / `image_grid_thw`
// and `pixel_values_videos` / `video_grid_thw` (the micro-batch's media in sample order). The
// encoder runs at TP 1 on the first pipeline stage, which must also hold the DeepStack layers;
// every rank of a foundation TP group encodes all of the micro-batch's media (as qwen2_5_vl).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/core/config/schema.h"
#include "loongforge/models/composites/vision_lm.h"
#include "loongforge/models/encoders/qwen3_vl_vision.h"

namespace lf::models {

// Field names of transformers' Qwen3VLConfig.
struct Qwen3VlConfig {
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("image_token_id", image_token_id, "The image placeholder token (one per merged vision patch)", Min{0});
    v("video_token_id", video_token_id, "The video placeholder token (one per merged patch of a frame)", Min{0});
  }
};

// transformers' Qwen3VLModel.get_rope_index: input_ids [b, s] int64 -> position ids [3, b, s]
// (temporal, height, width). Text tokens count up on all three axes; a run of t h w / merge^2
// image placeholders takes the next grid of image_grid_thw and the positions start + (t', h', w')
// over its merged grid; a video of t frames is t grids of (1, h, w), each frame its own run of
// h w / merge^2 video placeholders (the processor puts a timestamp between frames) at start +
// (0, h', w'). The text after a run continues at start + max(h, w) / merge. Grids are consumed in
// sample order. Throws naming the counts when the placeholders do not match the grids.
at::Tensor qwen3_vl_position_ids(const at::Tensor& input_ids, const at::Tensor& image_grid_thw,
                                 const at::Tensor& video_grid_thw, const Qwen3VlConfig& ids,
                                 int64_t spatial_merge_size);

class Qwen3Vl : public VisionLm {
 public:
  // vision: its out_hidden_size 0 becomes the foundation's hidden size; its DeepStack entries
  // feed the foundation's first layers (at most num_layers, all on the first pipeline stage's
  // first model chunk). The encoder's parameters are drawn from component_seed(seed,
  // "vision_encoder") at TP 1; vision_context as Qwen25Vl's.
  Qwen3Vl(const DecoderConfig& foundation, const Qwen3VisionConfig& vision, const Qwen3VlConfig& config,
          const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
          const lf::dist::ParallelContext* parallel, bool sequence_parallel, const PipelineStage& stage,
          bool foundation_trainable = true, std::unique_ptr<lf::dist::ParallelContext> vision_context = nullptr,
          bool vision_trainable = true);
  ~Qwen3Vl() override;

  const std::string& type() const override;
  std::vector<std::string> batch_fields() const override;
  bool supports_chunkpipe() const override { return false; }
  StageOutput stage_forward(const Batch& batch, const TensorMap& input, int64_t chunk, Pass pass) override;

  // Whole model: tokens [b, s] and the media (undefined when absent) -> full-vocabulary logits
  // [s, b, vocab_size].
  at::Tensor logits(const at::Tensor& tokens, const at::Tensor& pixel_values, const at::Tensor& image_grid_thw,
                    const at::Tensor& pixel_values_videos = {}, const at::Tensor& video_grid_thw = {}) const;
  // Whole model: the last decoder layer's output before the final norm, [b, s, hidden] (GR00T reads
  // the backbone's features there).
  at::Tensor hidden_states(const at::Tensor& tokens, const at::Tensor& pixel_values, const at::Tensor& image_grid_thw,
                           const at::Tensor& pixel_values_videos = {}, const at::Tensor& video_grid_thw = {}) const;
  // The interleaved M-RoPE position ids [3, b, s] of tokens with these media.
  at::Tensor position_ids(const at::Tensor& tokens, const at::Tensor& image_grid_thw,
                          const at::Tensor& video_grid_thw = {}) const;

  // A Qwen3VLForConditionalGeneration state dict (transformers 5 names: model.visual.*,
  // model.language_model.*, lm_head.weight) -> this rank's shards. Every tensor must be used.
  void load_hf_state(const std::map<std::string, at::Tensor>& tensors);

  // The first pipeline stage only (every stage with --enable-full-hetero-dp).
  const Qwen3VisionEncoder& vision_encoder() const { return *encoder_; }
  // The job's recomputation: the decoder's layers and the tower's blocks (its full recomputation).
  void set_recompute(const RecomputeOptions& r) override {
    CausalLm::set_recompute(r);
    if (encoder_) encoder_->set_recompute(r);
  }
  const Qwen3VlConfig& own_config() const { return config_; }  // image / video ids

 protected:
  std::vector<std::pair<std::string, std::string>> media_fields() const override {
    return {{"pixel_values", "image_grid_thw"}, {"pixel_values_videos", "video_grid_thw"}};
  }
  // Not used: stage_forward embeds (the DeepStack rows go to the layers, not the embeddings).
  at::Tensor embed_inputs(const Batch& batch) const override;

 private:
  struct Embedded {
    at::Tensor hidden;                        // [s, b, h], placeholders replaced
    std::vector<HiddenInjection> injections;  // DeepStack: after layers 0, 1, ...
  };
  Embedded embed_with_media(const at::Tensor& tokens, const at::Tensor& pixel_values,
                            const at::Tensor& image_grid_thw, const at::Tensor& pixel_values_videos,
                            const at::Tensor& video_grid_thw) const;

  Qwen3VlConfig config_;
  std::unique_ptr<Qwen3VisionEncoder> encoder_;
};

void register_qwen3_vl(Registry& r);

}  // namespace lf::models

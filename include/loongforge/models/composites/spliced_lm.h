// The `spliced_lm` composite: an encoder (slot `image_encoder`, e.g. mlp_encoder) whose outputs
// replace the embeddings of placeholder tokens (`image_token_id`) in a decoder foundation's
// sequence, then the LM head; the loss is the causal LM's on the text. The skeleton of a VLM
// (vision encoder + projector + LLM). The encoder has its own parallel layout (heterogeneous
// parallelism): with TP t_e below the foundation's t_f, each foundation TP group holds t_f / t_e
// encoder replicas that encode their share of the micro-batch's features, then gather them
// (parallel::gather_from_shares) so every foundation rank splices all of them. The encoder
// lives on the first pipeline stage. Batch fields: those of causal_lm plus `features`
// [b, features_per_sample, input_size] (float).
#pragma once

#include <memory>

#include "loongforge/core/config/schema.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/encoders/mlp_encoder.h"

namespace lf::models {

struct SplicedLmConfig {
  int64_t image_token_id = 0;       // the placeholder token an encoder output replaces
  int64_t features_per_sample = 0;  // encoder outputs (placeholders) per sample

  template <class V>
  void visit(V& v) {
    v("image_token_id", image_token_id, "The placeholder token whose embedding an encoder output replaces",
      lf::config::Required{}, lf::config::Min{0});
    v("features_per_sample", features_per_sample,
      "Feature vectors (placeholder tokens) per sample; --mock-data writes this many", lf::config::Required{},
      lf::config::Min{1});
  }
};

class SplicedLm : public CausalLm {
 public:
  // encoder_context: the encoder's context (its TP group, its share group as cp, its gradient
  // group dp x cp); null on pipeline stages without the encoder.
  SplicedLm(const DecoderConfig& foundation, const MlpEncoderConfig& encoder, const SplicedLmConfig& config,
            const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
            const lf::dist::ParallelContext* parallel, bool sequence_parallel, const PipelineStage& stage,
            bool foundation_trainable, std::unique_ptr<lf::dist::ParallelContext> encoder_context,
            bool encoder_trainable);
  ~SplicedLm() override;

  const std::string& type() const override;
  std::vector<ParameterGroup> parameter_groups() const override;
  std::vector<std::string> batch_fields() const override;
  bool supports_chunkpipe() const override { return false; }
  const std::vector<Parameter>& encoder_parameters() const { return encoder_params_; }

 protected:
  at::Tensor embed_inputs(const Batch& batch) const override;

 private:
  SplicedLmConfig config_;
  std::unique_ptr<lf::dist::ParallelContext> encoder_context_;
  bool encoder_trainable_;
  std::unique_ptr<MlpEncoder> encoder_;
  std::vector<Parameter> encoder_params_;
};

void register_spliced_lm(Registry& r);

}  // namespace lf::models

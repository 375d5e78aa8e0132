#include "loongforge/models/composites/internvl.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <set>

#include "causal_lm_plan.h"
#include "vlm_plan.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/hf_adapter.h"

namespace lf::models {
namespace {
const std::string kType = "internvl";
const std::string kVisionPrefix = "model.vision_tower.", kProjectorPrefix = "model.multi_modal_projector.",
                  kLmPrefix = "model.language_model.";
}  // namespace

InternVl::InternVl(const DecoderConfig& foundation, const InternVisionConfig& vision, const InternVlConfig& config,
                   const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
                   const lf::dist::ParallelContext* parallel, bool sequence_parallel, const PipelineStage& stage,
                   bool foundation_trainable, std::unique_ptr<lf::dist::ParallelContext> vision_context,
                   bool vision_trainable)
    : VisionLm(foundation, backend, seed, dtype, parallel, sequence_parallel, stage,
               foundation_trainable, std::move(vision_context), vision_trainable),
      config_(config) {
  LF_CHECK(config.image_token_id < foundation.vocab_size, "model.image_token_id ", config.image_token_id,
           " is outside the vocabulary of ", foundation.vocab_size, " tokens");
  // The tower lives on the first pipeline stage (every stage with --enable-full-hetero-dp).
  if (!holds_tower(stage)) return;
  ParamBuilder b = tower_builder(seed, dtype);
  InternVisionConfig v = vision;
  if (v.out_hidden_size == 0) v.out_hidden_size = foundation.hidden_size;
  LF_CHECK(v.out_hidden_size == foundation.hidden_size, "model.vision_encoder.out_hidden_size ", v.out_hidden_size,
           " differs from the foundation's hidden_size ", foundation.hidden_size,
           lf::hint("the projector's outputs replace token embeddings: set out_hidden_size 0 (the foundation's width)"));
  encoder_ = std::make_unique<InternVisionEncoder>(v, backend, b, "vision_encoder");
  attach_tower(
      b.take(), [this](const at::Tensor& rows, const at::Tensor& g) { return encoder_->forward(rows, g); },
      v.out_hidden_size, v.patch_dim(), v.merge());
}

InternVl::~InternVl() = default;

const std::string& InternVl::type() const { return kType; }

std::vector<std::string> InternVl::batch_fields() const {
  auto f = CausalLm::batch_fields();
  f.push_back("pixel_values");
  f.push_back("image_grid_thw");
  return f;
}

at::Tensor InternVl::embed_with_media(const at::Tensor& tokens, const at::Tensor& rows, const at::Tensor& grid) const {
  LF_CHECK(encoder_ != nullptr, "internvl: images are encoded on the first pipeline stage; this one holds ",
           describe_stage());
  at::Tensor x = foundation().embed(tokens, 0, /*scatter=*/false);  // [s, b, h]
  const at::Tensor mask = tokens.eq(config_.image_token_id);        // [b, s]
  const int64_t count = mask.sum().item<int64_t>();
  if (!rows.defined()) {
    LF_CHECK(count == 0, "the tokens hold ", count, " image placeholders (model.image_token_id ",
             config_.image_token_id, ") but the batch has no pixel_values / image_grid_thw");
  } else {
    LF_CHECK(grid.defined(), "internvl: pixel_values come with image_grid_thw [tiles, 3]");
    const auto& c = encoder_->config();
    const int64_t per_tile = (c.grid() / c.merge()) * (c.grid() / c.merge()), tiles = grid.size(0);
    LF_CHECK(count == tiles * per_tile, "the tokens hold ", count, " image placeholders (model.image_token_id ",
             config_.image_token_id, ") but the ", tiles, " tile(s) make ", tiles * per_tile, " embeddings (",
             per_tile, " each)", lf::hint("each tile needs (image_size / patch_size x downsample_ratio)^2 = " +
                                          std::to_string(per_tile) + " placeholder tokens"));
  }
  const at::Tensor encoded = encode_media(tokens, rows, rows.defined() ? grid.to(at::kCPU, at::kLong) : at::Tensor());
  if (!rows.defined()) {
    // --use-vit-dp-balance: no media here, but the exchange's backward must run on this rank too.
    if (encoded.defined() && encoded.requires_grad()) x = x + encoded.sum().to(x.scalar_type()) * 0.0;
    return x;
  }
  at::Tensor xb = x.transpose(0, 1).masked_scatter(mask.to(x.device()).unsqueeze(-1), encoded.to(x.scalar_type()));
  return xb.transpose(0, 1).contiguous();
}

at::Tensor InternVl::embed_inputs(const Batch& batch) const {
  const at::Tensor* rows = batch.find("pixel_values");
  const at::Tensor* grid = batch.find("image_grid_thw");
  return foundation().scatter_sequence(context_share(
      embed_with_media(batch.at("tokens"), rows ? *rows : at::Tensor(), grid ? *grid : at::Tensor())));
}

at::Tensor InternVl::logits(const at::Tensor& tokens, const at::Tensor& pixel_values) const {
  check_whole_model("InternVl::logits");
  at::Tensor rows, grid;
  if (pixel_values.defined()) std::tie(rows, grid) = encoder_->rows_of_pixels(pixel_values);
  at::Tensor x = foundation().scatter_sequence(embed_with_media(tokens, rows, grid));
  DecoderInputs in;
  in.seq = tokens.size(1);
  x = foundation().run_layers(x, in);
  return lm_head().full_logits(lm_head().local_logits(foundation().final_norm(x)));
}

void InternVl::load_hf_state(const std::map<std::string, at::Tensor>& tensors, const std::string& text_architecture) {
  std::map<std::string, at::Tensor> vision;
  for (const auto& [name, t] : tensors) {
    const bool tower = name.rfind(kVisionPrefix, 0) == 0 || name.rfind(kProjectorPrefix, 0) == 0;
    LF_CHECK(tower || name.rfind(kLmPrefix, 0) == 0 || name.rfind("lm_head.", 0) == 0, "HF tensor '", name,
             "' is neither the vision tower's (", kVisionPrefix, "*, ", kProjectorPrefix, "*) nor the language model's (",
             kLmPrefix, "*, lm_head.*)", lf::hint("is this an InternVLForConditionalGeneration state dict?"));
    if (tower) vision.emplace(name, t);
  }
  if (encoder_) encoder_->load_hf_state(vision, kVisionPrefix, kProjectorPrefix);
  const auto mapping = hf::mapping_for_architecture(text_architecture);
  std::vector<std::string> used;
  const auto full = hf::decoder_from_hf_tensors(config(), mapping, tensors, kLmPrefix, tp_size(), &used);
  const std::set<std::string> read(used.begin(), used.end());
  for (const auto& [name, t] : tensors)
    LF_CHECK(vision.count(name) || read.count(name), "HF tensor '", name, "' has no place in this model's language model (",
             config().num_layers, " layers, ", text_architecture, " mapping)",
             lf::hint("the checkpoint and model.foundation disagree (e.g. num_layers)"));
  load_full_parameters({full.begin(), full.end()});
}

// --- plan -------------------------------------------------------------------------------------

namespace {

class InternVlPlan : public VlmPlan<InternVisionConfig, InternVlConfig> {
 public:
  InternVlPlan(std::shared_ptr<const ModelConfig> config, const PlanArgs& args, lf::config::ErrorList& errors)
      : VlmPlan(config, args, errors, "internvl") {
    if (!foundation_.mrope_section.empty())
      errors.add("model.foundation.mrope_section", origin(args, "model.foundation.mrope_section"),
                 "internvl's language model takes 1D positions; mrope_section is set", "drop mrope_section");
    if (vision_.merge() == 0 || vision_.grid() % std::max<int64_t>(vision_.merge(), 1) != 0)
      errors.add("model.vision_encoder.downsample_ratio", origin(args, "model.vision_encoder.downsample_ratio"),
                 "downsample_ratio must be 1 / k for a k dividing image_size / patch_size = " +
                     std::to_string(vision_.grid()),
                 "InternVL uses 0.5");
  }

  DataNeeds data_needs() const override {
    DataNeeds d = CausalLmPlan::data_needs();
    d.mock_only_why = "internvl's image tiles come from --mock-data: InternVL's dynamic tiling (448-pixel tiles and "
                      "a thumbnail) is not built into loongforge-data";
    d.vision_tower = true;
    return d;
  }

  std::unique_ptr<Model> build(const BuildArgs& args) const override { return build_vlm<InternVl>(args); }

 protected:
  int64_t mock_side() const override { return vision_.grid(); }  // one tile per sample
};

std::unique_ptr<ModelPlan> plan_internvl(std::shared_ptr<const ModelConfig> c, const PlanArgs& a,
                                         lf::config::ErrorList& e) {
  return std::make_unique<InternVlPlan>(std::move(c), a, e);
}

}  // namespace

void register_internvl(Registry& r) {
  CompositeType t;
  t.name = kType;
  t.description = "InternVL: an InternViT tower's pixel-shuffled, projected patches spliced into a decoder at the "
                  "image placeholders";
  t.slots = {{"vision_encoder", "vision_encoder", "intern_vit", true}, {"foundation", "foundation", "decoder", true}};
  t.load_own = schema_loader<InternVlConfig>();
  t.plan = plan_internvl;
  r.add(std::move(t));
}

}  // namespace lf::models

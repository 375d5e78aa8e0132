// The groot composite's plan (--dry-run, mock data) and registration. The model is groot.cpp.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <sstream>

#include "loongforge/core/config/config_error.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/composites/groot.h"
#include "loongforge/models/registry.h"
#include "policy_plan.h"

namespace lf::models {
namespace {

const std::string kType = "groot";

class GrootPlan : public ModelPlan {
 public:
  GrootPlan(std::shared_ptr<const ModelConfig> config, const PlanArgs& args, lf::config::ErrorList& errors)
      : config_(std::move(config)), layout_(*args.layout), own_(config_->own_fields<GrootOwnConfig>()) {
    backbone_.foundation = config_->fields<DecoderConfig>("foundation");
    backbone_.vision = config_->fields<Qwen3VisionConfig>("vision_encoder");
    backbone_.ids = own_.ids;
    if (backbone_.vision.out_hidden_size == 0) backbone_.vision.out_hidden_size = backbone_.foundation.hidden_size;
    const auto& job = *args.job;
    auto origin = [&](const std::string& path) {
      const auto* n = args.resolved->find_path(path);
      return n ? n->origin() : lf::config::Origin::from_default();
    };
    auto refuse = [&](const std::string& key, const std::string& what, const std::string& hint) {
      errors.add(key, origin(key), what, hint);
    };
    freeze_.vision_encoder = config_->component("vision_encoder").settings.freeze;
    freeze_.foundation = config_->component("foundation").settings.freeze;
    if (layout_.size(lf::dist::Axis::tp) > 1)
      refuse("parallel.tensor_model_parallel_size", "groot runs at tensor-parallel size 1 (its widths are small)",
             "set --tensor-model-parallel-size 1 and scale with --data-parallel ranks");
    refuse_policy_layouts("groot", job, layout_, set_by_user(origin), refuse);
    if (job.parallel.sequence_parallel)
      refuse("parallel.sequence_parallel", "groot does not run under sequence parallelism", "drop --sequence-parallel");
    own_.head.validate(backbone_.foundation.hidden_size, backbone_.foundation.num_layers, "model.", errors);
    if (backbone_.vision.out_hidden_size != backbone_.foundation.hidden_size)
      refuse("model.vision_encoder.out_hidden_size",
             "the tower's merged patches replace token embeddings: out_hidden_size " +
                 std::to_string(backbone_.vision.out_hidden_size) + " differs from the foundation's hidden_size " +
                 std::to_string(backbone_.foundation.hidden_size),
             "leave out_hidden_size at 0");
    if (static_cast<int64_t>(backbone_.vision.deepstack_visual_indexes.size()) > own_.head.select_layer)
      refuse("model.vision_encoder.deepstack_visual_indexes",
             "DeepStack feeds the first " + std::to_string(backbone_.vision.deepstack_visual_indexes.size()) +
                 " decoder layers, but select_layer keeps " + std::to_string(own_.head.select_layer),
             "");
    for (const auto& [key, id] : {std::pair<const char*, int64_t>{"model.image_token_id", own_.ids.image_token_id},
                                  {"model.video_token_id", own_.ids.video_token_id}})
      if (id >= backbone_.foundation.vocab_size)
        refuse(key, std::string(key) + " " + std::to_string(id) + " is outside the vocabulary of " +
                        std::to_string(backbone_.foundation.vocab_size) + " tokens",
               "");
    const int64_t unit = backbone_.vision.patch_size * backbone_.vision.spatial_merge_size;
    if (own_.head.image_size % unit != 0)
      refuse("model.image_size",
             "the image side " + std::to_string(own_.head.image_size) +
                 " is not a multiple of patch_size x spatial_merge_size = " + std::to_string(unit),
             "");
  }
  const ModelConfig& config() const override { return *config_; }
  std::string describe() const override {
    std::ostringstream os;
    const auto& h = own_.head;
    auto frozen = [](bool f) { return f ? " | frozen" : ""; };
    os << "model: groot, " << num_parameters() << " parameters | tp 1, dp " << layout_.size(lf::dist::Axis::dp)
       << " (every component)\n"
       << "  vision_encoder qwen3_vl_vision, " << backbone_.vision.num_parameters() << " parameters"
       << frozen(freeze_.vision_encoder) << "\n"
       << "  foundation     decoder, " << backbone_params() << " parameters, " << h.select_layer << " of "
       << backbone_.foundation.num_layers << " layers (select_layer)" << frozen(freeze_.foundation) << "\n"
       << "  action_head    " << (h.use_alternate_vl_dit ? "AlternateVLDiT" : "DiT") << ", " << head_params()
       << " parameters, " << h.dit_num_layers << " blocks of width " << h.dit_dim() << ", " << h.max_num_embodiments
       << " embodiments\n"
       << "  objective      flow matching, t = (1 - Beta(" << h.noise_beta_alpha << ", " << h.noise_beta_beta << ")) x "
       << h.noise_s << ", horizon " << h.action_horizon << " x " << h.max_action_dim << ", "
       << h.num_inference_timesteps << " Euler steps\n";
    return os.str();
  }
  std::string summary() const override {
    return "groot: " + std::to_string(num_parameters()) + " parameters, backbone " +
           std::to_string(own_.head.select_layer) + " layers, DiT " + std::to_string(own_.head.dit_num_layers) +
           " blocks";
  }
  int64_t num_parameters() const override {
    return backbone_.vision.num_parameters() + backbone_params() + head_params();
  }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.token_data = false;
    d.vocab_size = backbone_.foundation.vocab_size;
    // A VLA store (the reach demo's): its images become Qwen3-VL patches, its prompt the text
    // (Groot::vla_inputs).
    d.vla = true;
    d.image_size = own_.head.image_size;
    d.chunk = own_.head.action_horizon;
    d.action_dim = own_.head.action_dim;
    d.max_action_dim = own_.head.max_action_dim;
    d.image_size_key = "model.image_size";
    d.chunk_key = "model.action_horizon";
    d.policy = "groot";
    return d;
  }
  void add_mock_fields(Batch& batch, uint64_t seed) const override {
    // Per sample, a function of the seed and the sample index: text, one image's placeholders and
    // patch rows, a state, an embodiment, and smooth actions that depend on the image, the state
    // and the embodiment (so there is something to learn).
    const auto& h = own_.head;
    const auto& v = backbone_.vision;
    const int64_t side = h.image_size / v.patch_size, merged = (side / v.spatial_merge_size) * (side / v.spatial_merge_size);
    const int64_t text_vocab = std::min(own_.ids.image_token_id, own_.ids.video_token_id);
    LF_CHECK(text_vocab > 0, "groot --mock-data draws text below the placeholder ids; model.image_token_id is 0");
    std::vector<at::Tensor> ids, pixels, states, actions, masks;
    std::vector<int64_t> embodiments;
    for (int64_t index : batch.sample_indices) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + static_cast<uint64_t>(index) + 211);
      auto text = at::randint(0, text_vocab, {h.mock_tokens}, gen, at::kLong);
      const int64_t half = h.mock_tokens / 2;
      ids.push_back(at::cat({text.narrow(0, 0, half), at::full({merged}, own_.ids.image_token_id, at::kLong),
                             text.narrow(0, half, h.mock_tokens - half)}));
      auto px = at::normal(0.0, 1.0, {side * side, v.patch_dim()}, gen, at::kFloat);
      pixels.push_back(px);
      auto state = at::normal(0.0, 1.0, {h.state_history_length, h.max_state_dim}, gen, at::kFloat);
      states.push_back(state);
      const int64_t e = index % std::min<int64_t>(2, h.max_num_embodiments);
      embodiments.push_back(e);
      auto steps = at::linspace(0.0, 1.0, h.action_horizon, at::kFloat).unsqueeze(1);
      auto freq = at::arange(1, h.max_action_dim + 1, at::kFloat).unsqueeze(0);
      auto phase = px.mean() + state.mean() + static_cast<double>(e);
      auto a = at::zeros({h.action_horizon, h.max_action_dim}, at::kFloat);
      a.narrow(1, 0, h.action_dim).copy_(at::sin(steps * freq.narrow(1, 0, h.action_dim) + phase));
      actions.push_back(a);
      auto mask = at::zeros({h.action_horizon, h.max_action_dim}, at::kFloat);
      mask.narrow(1, 0, h.action_dim).fill_(1);
      masks.push_back(mask);
    }
    LF_CHECK(!ids.empty(), "groot: a batch without sample indices");
    const int64_t b = static_cast<int64_t>(ids.size());
    batch.set("input_ids", at::stack(ids), 1);
    batch.set("pixel_values", at::cat(pixels));
    batch.set("image_grid_thw", at::tensor({int64_t{1}, side, side}, at::kLong).repeat({b, 1}));
    batch.set("state", at::stack(states));
    batch.set("actions", at::stack(actions));
    batch.set("action_mask", at::stack(masks));
    batch.set("embodiment_id", at::tensor(embodiments, at::kLong));
  }
  std::unique_ptr<Model> build(const BuildArgs& args) const override {
    return std::make_unique<Groot>(backbone_, own_.head, *args.backend, args.seed, args.dtype, args.context, freeze_);
  }

 private:
  int64_t backbone_params() const {
    DecoderConfig cut = backbone_.foundation;
    cut.num_layers = own_.head.select_layer;
    int64_t n = 0;
    for (const auto& p : causal_lm_parameter_specs(cut)) n += p.tensor.numel();
    return n;
  }
  int64_t head_params() const {
    int64_t n = 0;
    for (const auto& r : groot_head_records(own_.head, backbone_.foundation.hidden_size)) {
      int64_t k = 1;
      for (int64_t d : r.shape) k *= d;
      n += k;
    }
    return n;
  }

  std::shared_ptr<const ModelConfig> config_;
  lf::dist::ParallelLayout layout_;
  GrootOwnConfig own_;
  GrootBackbone backbone_;
  GrootFreeze freeze_;
};

std::unique_ptr<ModelPlan> plan_groot(std::shared_ptr<const ModelConfig> c, const PlanArgs& a,
                                      lf::config::ErrorList& e) {
  return std::make_unique<GrootPlan>(std::move(c), a, e);
}

}  // namespace

void register_groot(Registry& r) {
  CompositeType t;
  t.name = kType;
  t.description = "A GR00T N1.7-style vision-language-action policy: a Qwen3-VL backbone cut at select_layer and a "
                  "DiT action head (cross-attention to the backbone features alternating with self-attention, AdaLN "
                  "on the time, per-embodiment state/action encoders), trained by flow matching on action chunks";
  t.slots = {{"vision_encoder", "vision_encoder", "qwen3_vl_vision", true},
             {"foundation", "foundation", "decoder", true}};
  t.load_own = schema_loader<GrootOwnConfig>();
  t.plan = plan_groot;
  r.add(std::move(t));
}

}  // namespace lf::models

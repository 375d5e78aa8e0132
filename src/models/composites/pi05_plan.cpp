// The pi05 composite's configuration checks, parameter counts, plan (--dry-run, mock data) and
// registration. The model is pi05.cpp.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <sstream>

#include "loongforge/core/config/config_error.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/composites/pi05.h"
#include "loongforge/models/registry.h"
#include "policy_plan.h"

namespace lf::models {
namespace {

lf::config::Origin origin_of(const lf::config::Node& tree, const char* key) {
  const auto* n = tree.find(key);
  return n ? n->origin() : lf::config::Origin::from_default();
}

}  // namespace

int64_t SiglipConfig::num_parameters() const {
  const int64_t h = hidden_size, f = intermediate_size;
  const int64_t layer = 4 * (h * h + h) + 2 * h * f + f + h + 4 * h;
  return 3 * patch_size * patch_size * h + h + tokens_per_image() * h + num_hidden_layers * layer + 2 * h;
}

void SiglipConfig::validate(const lf::config::Node& tree, const std::string& prefix,
                            lf::config::ErrorList& errors) const {
  if (hidden_size % num_attention_heads != 0)
    errors.add(prefix + ".num_attention_heads", origin_of(tree, "num_attention_heads"),
               "hidden_size " + std::to_string(hidden_size) + " is not divisible by num_attention_heads " +
                   std::to_string(num_attention_heads));
  if (image_size % patch_size != 0)
    errors.add(prefix + ".image_size", origin_of(tree, "image_size"),
               "image_size " + std::to_string(image_size) + " is not a multiple of patch_size " +
                   std::to_string(patch_size),
               "PaliGemma: image_size 224, patch_size 14");
  if (position_embedding_init == "sincos2d" && hidden_size % 4 != 0)
    errors.add(prefix + ".position_embedding_init", origin_of(tree, "position_embedding_init"),
               "sincos2d splits hidden_size into four equal parts (sin x, cos x, sin y, cos y); hidden_size " +
                   std::to_string(hidden_size) + " is not a multiple of 4",
               "use a hidden_size divisible by 4 or position_embedding_init: normal");
}

int64_t PiGemmaConfig::num_parameters(bool adaptive) const {
  const int64_t w = width, qd = num_heads * head_dim, kvd = num_kv_heads * head_dim;
  const int64_t norms = adaptive ? 2 * (3 * w * w + 3 * w) : 2 * w;
  const int64_t layer = w * qd * 2 + 2 * w * kvd + 3 * w * mlp_dim + norms;
  return vocab_size * w + depth * layer + (adaptive ? 3 * w * w + 3 * w : w);
}

void PiGemmaConfig::validate(const lf::config::Node& tree, const std::string& prefix,
                             lf::config::ErrorList& errors) const {
  if (num_heads % num_kv_heads != 0)
    errors.add(prefix + ".num_kv_heads", origin_of(tree, "num_kv_heads"),
               "num_heads " + std::to_string(num_heads) + " is not a multiple of num_kv_heads " +
                   std::to_string(num_kv_heads));
  if (head_dim % 2 != 0)
    errors.add(prefix + ".head_dim", origin_of(tree, "head_dim"), "RoPE needs an even head_dim");
}

void Pi05Config::validate(const lf::config::Node& tree, const std::string& prefix,
                          lf::config::ErrorList& errors) const {
  if (action_dim > max_action_dim)
    errors.add(prefix + ".action_dim", origin_of(tree, "action_dim"),
               "action_dim " + std::to_string(action_dim) + " exceeds max_action_dim " +
                   std::to_string(max_action_dim) + " (actions are zero-padded to max_action_dim)");
  if (min_period <= 0 || max_period <= 0)
    errors.add(prefix + ".min_period", origin_of(tree, "min_period"), "min_period and max_period must be positive");
}

namespace {

const std::string kType = "pi05";

class Pi05Plan : public ModelPlan {
 public:
  Pi05Plan(std::shared_ptr<const ModelConfig> config, const PlanArgs& args, lf::config::ErrorList& errors)
      : config_(std::move(config)), layout_(*args.layout), vision_(config_->fields<SiglipConfig>("vision_encoder")),
        vlm_(config_->fields<PiGemmaConfig>("foundation")), expert_(config_->fields<PiGemmaConfig>("action_expert")),
        own_(config_->own_fields<Pi05Config>()) {
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
    freeze_.action_expert = config_->component("action_expert").settings.freeze;
    const int tp = layout_.size(lf::dist::Axis::tp);
    for (const char* slot : {"vision_encoder", "action_expert"}) {
      const auto& s = config_->component(slot).settings;
      if (s.tensor_model_parallel_size && *s.tensor_model_parallel_size != tp)
        refuse(std::string("model.") + slot + ".tensor_model_parallel_size",
               std::string("pi05 runs its ") + slot + " on the job's tensor-parallel group (" + std::to_string(tp) +
                   "): the prefix and the expert share every attention",
               "drop the key");
    }
    refuse_policy_layouts("pi05", job, layout_, set_by_user(origin), refuse);
    if (job.parallel.sequence_parallel && tp > 1)
      refuse("parallel.sequence_parallel", "pi05 does not run under sequence parallelism", "drop --sequence-parallel");
    if (vlm_.num_heads != expert_.num_heads || vlm_.num_kv_heads != expert_.num_kv_heads ||
        vlm_.head_dim != expert_.head_dim)
      refuse("model.action_expert.num_heads",
             "the PaliGemma LM and the action expert share each layer's attention: num_heads, num_kv_heads and "
             "head_dim must be equal (" + std::to_string(vlm_.num_heads) + "/" + std::to_string(vlm_.num_kv_heads) +
                 "/" + std::to_string(vlm_.head_dim) + " vs " + std::to_string(expert_.num_heads) + "/" +
                 std::to_string(expert_.num_kv_heads) + "/" + std::to_string(expert_.head_dim) + ")",
             "pi0.5: 8 query heads, 1 key/value head, head_dim 256 in both");
    if (vlm_.depth != expert_.depth)
      refuse("model.action_expert.depth", "the action expert runs layer by layer beside the PaliGemma LM: depth " +
                                              std::to_string(expert_.depth) + " must equal the LM's " +
                                              std::to_string(vlm_.depth),
             "");
    if (vlm_.vocab_size <= 0)
      refuse("model.foundation.vocab_size", "the PaliGemma LM embeds the prompt: vocab_size must be positive", "");
    if (expert_.vocab_size != 0)
      refuse("model.action_expert.vocab_size", "the action expert has no token embedding: vocab_size must be 0", "");
    auto divides = [&](const std::string& key, int64_t value) {
      if (value % tp != 0)
        refuse(key, key + " " + std::to_string(value) + " is not divisible by parallel.tensor_model_parallel_size " +
                        std::to_string(tp),
               "");
    };
    divides("model.vision_encoder.num_attention_heads", vision_.num_attention_heads);
    divides("model.vision_encoder.intermediate_size", vision_.intermediate_size);
    divides("model.foundation.num_heads", vlm_.num_heads);
    divides("model.foundation.mlp_dim", vlm_.mlp_dim);
    divides("model.foundation.vocab_size", vlm_.vocab_size);
    divides("model.action_expert.mlp_dim", expert_.mlp_dim);
    if (vlm_.num_kv_heads % tp != 0 && tp % vlm_.num_kv_heads != 0)
      refuse("model.foundation.num_kv_heads",
             "num_kv_heads " + std::to_string(vlm_.num_kv_heads) + " neither divides nor is divided by the " +
                 std::to_string(tp) + " tensor-parallel ranks",
             "");
  }
  const ModelConfig& config() const override { return *config_; }
  std::string describe() const override {
    std::ostringstream os;
    const int tp = layout_.size(lf::dist::Axis::tp), dp = layout_.size(lf::dist::Axis::dp);
    auto frozen = [](bool f) { return f ? " | frozen" : ""; };
    os << "model: pi05, " << num_parameters() << " parameters | tp " << tp << ", dp " << dp << " (every component)\n"
       << "  vision_encoder siglip, " << vision_.num_parameters() + vision_.hidden_size * vlm_.width + vlm_.width
       << " parameters (with the projector), " << vision_.tokens_per_image() << " tokens per "
       << vision_.image_size << "x" << vision_.image_size << " image" << frozen(freeze_.vision_encoder) << "\n"
       << "  foundation     pi_gemma, " << vlm_.num_parameters(false) << " parameters, width " << vlm_.width
       << frozen(freeze_.foundation) << "\n"
       << "  action_expert  pi_gemma (adaRMSNorm), " << expert_.num_parameters(true) << " parameters, width "
       << expert_.width << frozen(freeze_.action_expert) << "\n"
       << "  objective      flow matching, t ~ Beta(" << own_.time_sampling_beta_alpha << ", "
       << own_.time_sampling_beta_beta << "), chunk " << own_.chunk_size << " x " << own_.action_dim << " of "
       << own_.max_action_dim << " action dims, " << own_.num_inference_steps << " Euler steps\n";
    return os.str();
  }
  std::string summary() const override {
    return "pi05: " + std::to_string(num_parameters()) + " parameters, " + std::to_string(vlm_.depth) +
           " layers, widths " + std::to_string(vlm_.width) + " / " + std::to_string(expert_.width);
  }
  int64_t num_parameters() const override {
    const int64_t we = expert_.width, a = own_.max_action_dim;
    return vision_.num_parameters() + vision_.hidden_size * vlm_.width + vlm_.width + vlm_.num_parameters(false) +
           expert_.num_parameters(true) + 2 * a * we + we + a + 2 * (we * we + we);
  }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.token_data = false;
    d.vocab_size = vlm_.vocab_size;
    d.vla = true;
    d.image_size = vision_.image_size;
    d.chunk = own_.chunk_size;
    d.action_dim = own_.action_dim;
    d.max_action_dim = own_.max_action_dim;
    d.policy = "pi05";
    d.prompt_length = own_.tokenizer_max_length;
    return d;
  }
  void add_mock_fields(Batch& batch, uint64_t seed) const override {
    // Per sample, a function of the seed and the sample index: images, a prompt with padding, and
    // smooth actions that depend on the first image and the prompt (so there is something to learn).
    std::vector<at::Tensor> images, image_masks, tokens, masks, actions;
    const int64_t cams = own_.mock_cameras, n = own_.mock_tokens, s = vision_.image_size;
    for (int64_t index : batch.sample_indices) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + static_cast<uint64_t>(index) + 101);
      auto img = at::rand({cams, 3, s, s}, gen, at::kFloat) * 2 - 1;
      images.push_back(img);
      auto cm = at::ones({cams}, at::kBool);
      if (cams > 1 && index % 4 == 3) cm[cams - 1] = false;  // a missing camera now and then
      image_masks.push_back(cm);
      tokens.push_back(at::randint(0, vlm_.vocab_size, {n}, gen, at::kLong));
      auto m = at::ones({n}, at::kBool);
      const int64_t pad = index % std::max<int64_t>(1, n / 2);
      if (pad > 0) m.narrow(0, n - pad, pad).fill_(false);
      masks.push_back(m);
      auto steps = at::linspace(0.0, 1.0, own_.chunk_size, at::kFloat).unsqueeze(1);
      auto dir = img.mean({0, 2, 3}).sum() + tokens.back().to(at::kFloat).mean() / vlm_.vocab_size;
      auto a = at::zeros({own_.chunk_size, own_.max_action_dim}, at::kFloat);
      auto freq = at::arange(1, own_.action_dim + 1, at::kFloat).unsqueeze(0);
      a.narrow(1, 0, own_.action_dim).copy_(at::sin(steps * freq + dir));
      actions.push_back(a);
    }
    LF_CHECK(!images.empty(), "pi05: a batch without sample indices");
    batch.set("images", at::stack(images));
    batch.set("image_masks", at::stack(image_masks));
    batch.set("prompt_tokens", at::stack(tokens));
    batch.set("prompt_masks", at::stack(masks));
    batch.set("actions", at::stack(actions));
  }
  std::unique_ptr<Model> build(const BuildArgs& args) const override {
    return std::make_unique<Pi05>(vision_, vlm_, expert_, own_, *args.backend, args.seed, args.dtype, args.context,
                                  freeze_);
  }

 private:
  std::shared_ptr<const ModelConfig> config_;
  lf::dist::ParallelLayout layout_;
  SiglipConfig vision_;
  PiGemmaConfig vlm_, expert_;
  Pi05Config own_;
  Pi05Freeze freeze_;
};

std::unique_ptr<ModelPlan> plan_pi05(std::shared_ptr<const ModelConfig> c, const PlanArgs& a,
                                     lf::config::ErrorList& e) {
  return std::make_unique<Pi05Plan>(std::move(c), a, e);
}

}  // namespace

void register_pi05(Registry& r) {
  r.add(ComponentType{"siglip", "encoder",
                      "PaliGemma's SigLIP vision tower (patch embedding, learned positions, pre-LN encoder, GELU-tanh "
                      "MLP) and its linear projector to the LM's width",
                      schema_loader<SiglipConfig>()});
  r.add(ComponentType{"pi_gemma", "foundation",
                      "A Gemma decoder as pi0 runs it ((1 + w) RMSNorm, GELU-tanh gated MLP, RoPE, multi-query "
                      "attention); adaRMSNorm on the flow-matching time as the action expert",
                      schema_loader<PiGemmaConfig>()});
  CompositeType t;
  t.name = kType;
  t.description = "A Pi0.5-style vision-language-action policy: SigLIP + PaliGemma prefix and a Gemma action expert "
                  "sharing each layer's attention, trained by flow matching on action chunks";
  t.slots = {{"vision_encoder", "encoder", "siglip", true},
             {"foundation", "foundation", "pi_gemma", true},
             {"action_expert", "foundation", "pi_gemma", true}};
  t.load_own = schema_loader<Pi05Config>();
  t.plan = plan_pi05;
  r.add(std::move(t));
}

}  // namespace lf::models

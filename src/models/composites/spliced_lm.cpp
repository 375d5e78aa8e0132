#include "loongforge/models/composites/spliced_lm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <sstream>

#include "causal_lm_plan.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {
namespace {
const std::string kType = "spliced_lm";
}  // namespace

SplicedLm::SplicedLm(const DecoderConfig& foundation, const MlpEncoderConfig& encoder, const SplicedLmConfig& config,
                     const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
                     const lf::dist::ParallelContext* parallel, bool sequence_parallel, const PipelineStage& stage,
                     bool foundation_trainable, std::unique_ptr<lf::dist::ParallelContext> encoder_context,
                     bool encoder_trainable)
    : CausalLm(foundation, backend, seed, dtype, parallel, sequence_parallel, stage, foundation_trainable),
      config_(config), encoder_context_(std::move(encoder_context)), encoder_trainable_(encoder_trainable) {
  LF_CHECK(config.image_token_id < foundation.vocab_size, "model.image_token_id ", config.image_token_id,
           " is outside the vocabulary of ", foundation.vocab_size, " tokens");
  if (!stage.first) return;  // the encoder lives on the first pipeline stage
  LF_CHECK(encoder_context_ != nullptr, "spliced_lm: the first pipeline stage needs the encoder's parallel context");
  ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(component_seed(seed, "image_encoder")), dtype,
                 backend.device(), tensor_parallel_of(encoder_context_.get(), false), encoder_trainable);
  MlpEncoderConfig e = encoder;
  if (e.output_size == 0) e.output_size = foundation.hidden_size;
  LF_CHECK(e.output_size == foundation.hidden_size, "model.image_encoder.output_size ", e.output_size,
           " differs from the foundation's hidden_size ", foundation.hidden_size,
           lf::hint("the encoder's outputs replace token embeddings: set output_size 0 (the foundation's width)"));
  encoder_ = std::make_unique<MlpEncoder>(e, backend, b, "image_encoder");
  encoder_params_ = b.take();
}

SplicedLm::~SplicedLm() = default;

const std::string& SplicedLm::type() const { return kType; }

std::vector<ParameterGroup> SplicedLm::parameter_groups() const {
  auto groups = CausalLm::parameter_groups();
  if (encoder_)
    groups.push_back(ParameterGroup{"image_encoder", encoder_params_, encoder_context_.get(), encoder_trainable_});
  return groups;
}

std::vector<std::string> SplicedLm::batch_fields() const {
  auto f = CausalLm::batch_fields();
  f.push_back("features");
  return f;
}

at::Tensor SplicedLm::embed_inputs(const Batch& batch) const {
  const at::Tensor& tokens = batch.at("tokens");  // [b, s]
  const at::Tensor& features = batch.at("features");
  const int64_t b = tokens.size(0), n = config_.features_per_sample;
  LF_CHECK(features.dim() == 3 && features.size(0) == b && features.size(1) == n, "batch field 'features' must be [",
           b, ", ", n, ", input_size] (model.features_per_sample ", n, "), got ", features.sizes());
  const at::Tensor placeholders = tokens.eq(config_.image_token_id);  // [b, s]
  const auto per_sample = placeholders.sum(1);
  LF_CHECK(per_sample.eq(n).all().item<bool>(), "every sample must hold model.features_per_sample = ", n,
           " placeholder tokens (model.image_token_id ", config_.image_token_id, "), got ", per_sample.cpu(),
           lf::hint("the data must put one placeholder per feature vector"));
  // This encoder replica's share of the micro-batch's feature vectors, then all of them.
  const auto& ectx = *encoder_context_;
  const int64_t shares = ectx.cp_size(), rows = b * n;
  LF_CHECK(rows % shares == 0, "spliced_lm: ", rows, " feature vectors per micro-batch do not split over the ", shares,
           " encoder replicas of a foundation TP group",
           lf::hint("make micro_batch_size x features_per_sample a multiple of the foundation's TP size over the "
                    "encoder's"));
  const at::Tensor flat = features.reshape({rows, features.size(2)}).to(backend_.device(), encoder_params_.front().tensor.scalar_type());
  at::Tensor mine = flat.narrow(0, ectx.cp_rank() * (rows / shares), rows / shares);
  at::Tensor encoded = encoder_->forward(mine);  // [rows / shares, h]
  if (shares > 1) encoded = lf::parallel::gather_from_shares(encoded, ectx.cp());
  // The whole sequence's embeddings on every rank, the placeholders replaced in sample order.
  at::Tensor x = foundation().embed(tokens, 0, /*scatter=*/false);  // [s, b, h]
  at::Tensor xb = x.transpose(0, 1);                                  // [b, s, h]
  xb = xb.masked_scatter(placeholders.to(x.device()).unsqueeze(-1), encoded.to(x.scalar_type()));
  return foundation().scatter_sequence(xb.transpose(0, 1).contiguous());
}

// --- plan -------------------------------------------------------------------------------------

namespace {

class SplicedLmPlan : public CausalLmPlan {
 public:
  SplicedLmPlan(std::shared_ptr<const ModelConfig> config, const PlanArgs& args, lf::config::ErrorList& errors)
      : CausalLmPlan(config, args, errors),
        encoder_(config->fields<MlpEncoderConfig>("image_encoder")),
        own_(config->own_fields<SplicedLmConfig>()),
        encoder_frozen_(config->component("image_encoder").settings.freeze) {
    if (encoder_.output_size == 0) encoder_.output_size = foundation_.hidden_size;
    const int tp = layout_.size(lf::dist::Axis::tp);
    const auto& enc = config->component("image_encoder");
    const auto origin = [&](const std::string& path) {
      const auto* n = args.resolved->find_path(path);
      return n ? n->origin() : lf::config::Origin::from_default();
    };
    if (expert_parallel())
      errors.add("parallel.expert_model_parallel_size", origin("parallel.expert_model_parallel_size"),
                 "expert parallelism is not built for the spliced_lm composite (its foundation's experts stay on every "
                 "rank)",
                 "drop --expert-model-parallel-size / --expert-tensor-parallel-size");
    if (args.job->lora.rank > 0)
      errors.add("lora.rank", origin("lora.rank"),
                 "LoRA adapters are built for the causal_lm composite; spliced_lm would train its encoder and "
                 "foundation whole",
                 "drop --lora-rank, or freeze components with `freeze: true`");
    encoder_tp_ = static_cast<int>(enc.settings.tensor_model_parallel_size.value_or(tp));
    if (tp % encoder_tp_ != 0)
      errors.add("model.image_encoder.tensor_model_parallel_size", origin("model.image_encoder.tensor_model_parallel_size"),
                 "the encoder's tensor-parallel size " + std::to_string(encoder_tp_) +
                     " must divide the foundation's (parallel.tensor_model_parallel_size " + std::to_string(tp) + ")",
                 "its replicas share a foundation TP group: use a divisor of " + std::to_string(tp));
    if (layout_.size(lf::dist::Axis::cp) > 1 || layout_.size(lf::dist::Axis::ep) > 1)
      errors.add("parallel.context_parallel_size", origin("parallel.context_parallel_size"),
                 "spliced_lm places its encoder over the foundation's TP x DP ranks; context and expert parallelism "
                 "are not combined with it yet",
                 "set --context-parallel-size 1 and --expert-model-parallel-size 1");
    if (encoder_.output_size != foundation_.hidden_size)
      errors.add("model.image_encoder.output_size", origin("model.image_encoder.output_size"),
                 "the encoder's output_size " + std::to_string(encoder_.output_size) + " differs from the foundation's " +
                     "hidden_size " + std::to_string(foundation_.hidden_size),
                 "leave output_size at 0 (the foundation's width)");
    if (encoder_tp_ > 0 && encoder_.ffn_hidden_size % encoder_tp_ != 0)
      errors.add("model.image_encoder.ffn_hidden_size", origin("model.image_encoder.ffn_hidden_size"),
                 "model.image_encoder.ffn_hidden_size " + std::to_string(encoder_.ffn_hidden_size) +
                     " is not divisible by the encoder's tensor-parallel size " + std::to_string(encoder_tp_));
    if (own_.image_token_id >= foundation_.vocab_size)
      errors.add("model.image_token_id", origin("model.image_token_id"),
                 "model.image_token_id " + std::to_string(own_.image_token_id) + " is outside the vocabulary of " +
                     std::to_string(foundation_.vocab_size) + " tokens");
    if (job_.parallel.chunkpipe_chunk_size)
      errors.add("parallel.chunkpipe_chunk_size", origin("parallel.chunkpipe_chunk_size"),
                 "spliced_lm does not run under ChunkPipe (its encoder splices whole sequences)",
                 "drop --chunkpipe-chunk-size");
    shares_ = encoder_tp_ > 0 && tp % encoder_tp_ == 0 ? tp / encoder_tp_ : 1;
    const int64_t rows = job_.training.micro_batch_size * own_.features_per_sample;
    if (rows % shares_ != 0)
      errors.add("training.micro_batch_size", origin("training.micro_batch_size"),
                 "micro_batch_size x model.features_per_sample = " + std::to_string(rows) +
                     " feature vectors do not split over the " + std::to_string(shares_) +
                     " encoder replicas of each foundation TP group",
                 "pick sizes whose product is a multiple of " + std::to_string(shares_));
    // The first stage's ranks ordered (foundation DP index, TP index): the encoder's layout over
    // them puts its TP groups and share groups inside each foundation TP group.
    std::vector<std::pair<std::pair<int, int>, int>> first;
    for (int r = 0; r < layout_.world_size(); ++r) {
      const auto c = layout_.coords(r);
      if (c.pp == 0) first.push_back({{c.dp, c.tp}, r});
    }
    std::sort(first.begin(), first.end());
    for (const auto& f : first) encoder_ranks_.push_back(f.second);
  }

  std::string summary() const override {
    return CausalLmPlan::summary() + " + image_encoder " + std::to_string(encoder_.num_parameters()) + " parameters";
  }
  int64_t num_parameters() const override { return CausalLmPlan::num_parameters() + encoder_.num_parameters(); }
  DataNeeds data_needs() const override {
    DataNeeds d = CausalLmPlan::data_needs();
    d.mock_only_why = "spliced_lm's feature vectors come from --mock-data until multimodal records arrive with the "
                      "VLM work (issue 15)";
    return d;
  }

  void add_mock_fields(Batch& batch, uint64_t seed) const override {
    // Placeholders replace each sample's first features_per_sample tokens (and any chance
    // occurrence of the id elsewhere); the loss skips predicting them. Features are drawn from
    // (seed, sample index), so every layout sees the same data.
    at::Tensor tokens = batch.at("tokens").clone(), labels = batch.at("labels").clone();
    at::Tensor mask = batch.find("loss_mask") ? batch.at("loss_mask").clone() : at::ones(tokens.sizes(), at::kFloat);
    const int64_t id = own_.image_token_id, other = (id + 1) % foundation_.vocab_size, n = own_.features_per_sample;
    LF_CHECK(tokens.size(1) > n, "training.seq_length ", tokens.size(1), " leaves no text after ", n, " placeholders");
    tokens.masked_fill_(tokens.eq(id), other);
    labels.masked_fill_(labels.eq(id), other);
    tokens.narrow(1, 0, n).fill_(id);
    labels.narrow(1, 0, n - 1).fill_(id);
    mask.narrow(1, 0, n - 1).fill_(0);
    std::vector<at::Tensor> feats;
    for (int64_t i = 0; i < tokens.size(0); ++i) {
      const int64_t index = i < static_cast<int64_t>(batch.sample_indices.size()) ? batch.sample_indices[static_cast<size_t>(i)] : i;
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + static_cast<uint64_t>(index) + 17);
      feats.push_back(at::normal(0.0, 1.0, {n, encoder_.input_size}, gen, at::kFloat));
    }
    batch.set("tokens", tokens, 1);
    batch.set("labels", labels, 1);
    batch.set("loss_mask", mask, 1);
    batch.set("features", at::stack(feats), -1);
  }

  std::unique_ptr<Model> build(const BuildArgs& args) const override {
    const auto& ctx = *args.context;
    const auto stage = lf::parallel::pipeline::pipeline_stage(foundation_.num_layers, ctx.pp_size(), ctx.pp_rank(), stage_split());
    std::unique_ptr<lf::dist::ParallelContext> enc;
    if (stage.first) enc = args.make_context("image_encoder", encoder_layout(), encoder_ranks_);
    return std::make_unique<SplicedLm>(foundation_, encoder_, own_, *args.backend, args.seed, args.dtype, &ctx,
                                       job_.parallel.sequence_parallel, stage, !frozen_, std::move(enc), !encoder_frozen_);
  }

 protected:
  lf::dist::ParallelLayout encoder_layout() const {
    lf::dist::ParallelSizes s;
    s.tp = encoder_tp_;
    s.cp = shares_;  // the replicas sharing one foundation TP group's micro-batch
    return lf::dist::ParallelLayout(static_cast<int>(encoder_ranks_.size()), s);
  }
  std::string describe_components() const override {
    std::ostringstream os;
    const int dp = layout_.size(lf::dist::Axis::dp);
    os << "  image_encoder  " << config_->component("image_encoder").type << ", " << encoder_.num_parameters()
       << " parameters | tp " << encoder_tp_ << ", " << shares_ << " replica(s) per foundation TP group x dp " << dp
       << " = " << shares_ * dp << "-way data parallel over the " << encoder_ranks_.size()
       << " ranks of pipeline stage 0 (global ranks";
    for (int r : encoder_ranks_) os << " " << r;
    os << ")" << (encoder_frozen_ ? " | frozen" : "") << "\n";
    return os.str();
  }

 private:
  MlpEncoderConfig encoder_;
  SplicedLmConfig own_;
  bool encoder_frozen_;
  int encoder_tp_ = 1, shares_ = 1;
  std::vector<int> encoder_ranks_;
};

std::unique_ptr<ModelPlan> plan_spliced_lm(std::shared_ptr<const ModelConfig> c, const PlanArgs& a,
                                           lf::config::ErrorList& e) {
  return std::make_unique<SplicedLmPlan>(std::move(c), a, e);
}

}  // namespace

void register_spliced_lm(Registry& r) {
  CompositeType t;
  t.name = kType;
  t.description = "An encoder's outputs spliced into a decoder foundation's sequence at placeholder tokens, LM loss";
  t.slots = {{"image_encoder", "encoder", "mlp_encoder", true}, {"foundation", "foundation", "decoder", true}};
  t.load_own = schema_loader<SplicedLmConfig>();
  t.plan = plan_spliced_lm;
  r.add(std::move(t));
}

}  // namespace lf::models

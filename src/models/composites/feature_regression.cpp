#include "loongforge/models/composites/feature_regression.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <sstream>

#include "unused_settings.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/registry.h"

namespace lf::models {
namespace {
const std::string kType = "feature_regression";
}  // namespace

FeatureRegression::FeatureRegression(const FeatureTransformerConfig& foundation, const FeatureRegressionConfig& config,
                                     const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
                                     const lf::dist::ParallelContext* parallel, bool trainable)
    : FeatureRegression(foundation, config, backend, seed, parallel, trainable,
                        ParamBuilder(at::make_generator<at::CPUGeneratorImpl>(seed), dtype, backend.device(),
                                     tensor_parallel_of(parallel, false), trainable)) {}

FeatureRegression::FeatureRegression(const FeatureTransformerConfig& foundation, const FeatureRegressionConfig& config,
                                     const lf::backend::DeviceBackend& backend, uint64_t seed,
                                     const lf::dist::ParallelContext* parallel, bool trainable, ParamBuilder b)
    : parallel_(parallel), trainable_(trainable),
      foundation_(foundation, backend, b, seed, parallel ? parallel->tp_rank() : 0),
      head_(b, foundation.hidden_size, config.output_size, foundation.init_method_std) {
  params_ = b.take();
}

const std::string& FeatureRegression::type() const { return kType; }

std::vector<ParameterGroup> FeatureRegression::parameter_groups() const {
  return {ParameterGroup{"model", params_, parallel_, trainable_}};
}

std::map<std::string, double> FeatureRegression::loss_counts(const Batch& batch) const {
  return {{"mse loss", static_cast<double>(batch.at("targets").size(0))}};
}

StageOutput FeatureRegression::stage_forward(const Batch& batch, const TensorMap&, int64_t chunk, Pass pass) {
  LF_CHECK(chunk == 0, "feature_regression has one model chunk");
  const at::Tensor& inputs = batch.at("inputs");
  auto pred = head_.forward(foundation_.forward(inputs.to(params_.front().tensor.scalar_type())));  // [b, s, out]
  auto mse = RegressionHead::per_sample_mse(pred, batch.at("targets"));            // [b]
  StageOutput out;
  if (pass == Pass::train)
    out.losses.push_back({"mse loss", mse.sum()});
  else
    out.metrics["mse loss"] = {mse.sum().item<double>(), static_cast<double>(mse.numel())};
  return out;
}

double FeatureRegression::flops_per_sample(int64_t s) const {
  const auto& c = foundation_.config();
  const double matmul = static_cast<double>(c.num_parameters());
  const double attention = c.num_layers * 2.0 * 2.0 * static_cast<double>(s) * c.hidden_size;  // bidirectional
  return (6.0 * matmul + 3.0 * 2.0 * attention) * static_cast<double>(s);
}

// --- plan -------------------------------------------------------------------------------------

namespace {

class FeatureRegressionPlan : public ModelPlan {
 public:
  FeatureRegressionPlan(std::shared_ptr<const ModelConfig> config, const PlanArgs& args, lf::config::ErrorList& errors)
      : config_(std::move(config)), layout_(*args.layout), foundation_(config_->fields<FeatureTransformerConfig>("foundation")),
        own_(config_->own_fields<FeatureRegressionConfig>()),
        frozen_(config_->component("foundation").settings.freeze) {
    const auto& job = *args.job;
    auto origin = [&](const std::string& path) {
      const auto* n = args.resolved->find_path(path);
      return n ? n->origin() : lf::config::Origin::from_default();
    };
    const int tp = layout_.size(lf::dist::Axis::tp);
    if (layout_.size(lf::dist::Axis::pp) > 1)
      errors.add("parallel.pipeline_model_parallel_size", origin("parallel.pipeline_model_parallel_size"),
                 "feature_regression runs as one pipeline stage", "set --pipeline-model-parallel-size 1");
    if (job.parallel.sequence_parallel && tp > 1)
      errors.add("parallel.sequence_parallel", origin("parallel.sequence_parallel"),
                 "feature_regression does not use sequence parallelism", "drop --sequence-parallel");
    if (job.parallel.chunkpipe_chunk_size)
      errors.add("parallel.chunkpipe_chunk_size", origin("parallel.chunkpipe_chunk_size"),
                 "feature_regression does not run under ChunkPipe", "drop --chunkpipe-chunk-size");
    // Each CP rank would run the whole sequence and the trainer would sum the loss over dp x cp:
    // twice the loss and the gradient at CP 2.
    if (layout_.size(lf::dist::Axis::cp) > 1)
      errors.add("parallel.context_parallel_size", origin("parallel.context_parallel_size"),
                 "feature_regression has no context parallelism (its sequences are short)",
                 "set --context-parallel-size 1 and scale with data-parallel ranks");
    auto refuse = [&](const std::string& key, const std::string& what, const std::string& hint) {
      errors.add(key, origin(key), what, hint);
    };
    refuse_pipeline_layout_settings("feature_regression", job, refuse);
    refuse_expert_settings("feature_regression", job, layout_, set_by_user(origin), refuse);
    if (job.lora.rank > 0)
      errors.add("lora.rank", origin("lora.rank"), "LoRA adapters are built for the causal_lm composite",
                 "drop --lora-rank");
    if (job.training.training_phase == "sft")
      errors.add("training.training_phase", origin("training.training_phase"),
                 "feature_regression reads no tokens: there is nothing to fine-tune on conversations",
                 "drop --training-phase sft");
    for (auto [field, value] : {std::pair<const char*, int64_t>{"num_attention_heads", foundation_.num_attention_heads},
                                {"num_query_groups", foundation_.query_groups()},
                                {"ffn_hidden_size", foundation_.ffn_hidden_size}})
      if (value % tp != 0)
        errors.add(std::string("model.foundation.") + field, origin(std::string("model.foundation.") + field),
                   std::string("model.foundation.") + field + " " + std::to_string(value) +
                       " is not divisible by parallel.tensor_model_parallel_size " + std::to_string(tp));
    if (job.training.seq_length > foundation_.max_position_embeddings)
      errors.add("training.seq_length", origin("training.seq_length"),
                 "training.seq_length " + std::to_string(job.training.seq_length) +
                     " exceeds model.foundation.max_position_embeddings " +
                     std::to_string(foundation_.max_position_embeddings));
    seq_ = job.training.seq_length;
  }
  const ModelConfig& config() const override { return *config_; }
  std::string describe() const override {
    std::ostringstream os;
    os << "model: " << config_->type << "\n  foundation     " << config_->component("foundation").type << ", "
       << num_parameters() << " parameters (with the head) | tp " << layout_.size(lf::dist::Axis::tp) << ", dp "
       << layout_.size(lf::dist::Axis::dp) << " (the job's layout)" << (frozen_ ? " | frozen" : "") << "\n"
       << "  loss           per-sample MSE over " << seq_ << " x " << own_.output_size << " targets\n";
    return os.str();
  }
  std::string summary() const override {
    return config_->type + ": " + std::to_string(num_parameters()) + " parameters, " +
           std::to_string(foundation_.num_layers) + " layers, hidden " + std::to_string(foundation_.hidden_size);
  }
  int64_t num_parameters() const override {
    return foundation_.num_parameters() + foundation_.hidden_size * own_.output_size + own_.output_size;
  }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.token_data = false;
    d.mock_only_why = "feature_regression trains on --mock-data only (datasets of float records arrive with the "
                      "diffusion work, issue 17)";
    return d;
  }
  void add_mock_fields(Batch& batch, uint64_t seed) const override {
    // inputs ~ N(0, 1) per sample; the target at every position is the mean over the whole
    // sequence of the inputs' first output_size channels (plus the position's own): a causal
    // model, which sees only the prefix, cannot fit it; bidirectional attention can.
    std::vector<at::Tensor> inputs;
    for (int64_t index : batch.sample_indices) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + static_cast<uint64_t>(index) + 29);
      inputs.push_back(at::normal(0.0, 1.0, {seq_, foundation_.input_size}, gen, at::kFloat));
    }
    LF_CHECK(!inputs.empty(), "feature_regression: a batch without sample indices");
    at::Tensor x = at::stack(inputs);  // [b, s, in]
    const int64_t out = own_.output_size, c = std::min(out, foundation_.input_size);
    at::Tensor head = x.narrow(2, 0, c);
    at::Tensor t = head.mean(1, /*keepdim=*/true).expand_as(head) * 2.0 + head * 0.5;
    if (out > c) t = at::cat({t, at::zeros({x.size(0), seq_, out - c})}, 2);
    batch.set("inputs", x, 1);
    batch.set("targets", t.contiguous(), 1);
  }
  std::unique_ptr<Model> build(const BuildArgs& args) const override {
    return std::make_unique<FeatureRegression>(foundation_, own_, *args.backend, args.seed, args.dtype, args.context,
                                               !frozen_);
  }

 private:
  std::shared_ptr<const ModelConfig> config_;
  lf::dist::ParallelLayout layout_;
  FeatureTransformerConfig foundation_;
  FeatureRegressionConfig own_;
  bool frozen_;
  int64_t seq_ = 0;
};

std::unique_ptr<ModelPlan> plan_feature_regression(std::shared_ptr<const ModelConfig> c, const PlanArgs& a,
                                                   lf::config::ErrorList& e) {
  return std::make_unique<FeatureRegressionPlan>(std::move(c), a, e);
}

}  // namespace

void register_feature_regression(Registry& r) {
  r.add(ComponentType{"feature_transformer", "foundation",
                      "Transformer over float feature sequences, bidirectional attention",
                      schema_loader<FeatureTransformerConfig>()});
  CompositeType t;
  t.name = kType;
  t.description = "A feature_transformer with a regression head: per-sample MSE on float targets";
  t.slots = {{"foundation", "foundation", "feature_transformer", true}};
  t.load_own = schema_loader<FeatureRegressionConfig>();
  t.plan = plan_feature_regression;
  r.add(std::move(t));
}

}  // namespace lf::models

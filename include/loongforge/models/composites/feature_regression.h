// The `feature_regression` composite: a feature_transformer foundation (bidirectional attention)
// and a regression head trained with a per-sample MSE on float `targets` [b, s, output_size]
// from `inputs` [b, s, input_size]: the skeleton of a diffusion transformer trained through the
// same trainer as the LLMs (normaliser: samples). One pipeline stage; TP without sequence
// parallelism.
#pragma once

#include "loongforge/core/config/schema.h"
#include "loongforge/models/foundations/feature_transformer.h"
#include "loongforge/models/heads/regression_head.h"
#include "loongforge/models/model.h"

namespace lf::models {

class Registry;

struct FeatureRegressionConfig {
  int64_t output_size = 0;

  template <class V>
  void visit(V& v) {
    v("output_size", output_size, "Target values per position", lf::config::Required{}, lf::config::Min{1});
  }
};

class FeatureRegression : public Model {
 public:
  FeatureRegression(const FeatureTransformerConfig& foundation, const FeatureRegressionConfig& config,
                    const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
                    const lf::dist::ParallelContext* parallel, bool trainable = true);

  const std::string& type() const override;
  std::vector<ParameterGroup> parameter_groups() const override;
  std::map<std::string, double> loss_counts(const Batch& batch) const override;
  StageOutput stage_forward(const Batch& batch, const TensorMap& input, int64_t chunk, Pass pass) override;
  std::vector<std::string> eval_metrics() const override { return {"mse loss"}; }
  std::vector<std::string> batch_fields() const override { return {"inputs", "targets"}; }
  double flops_per_sample(int64_t seq_length) const override;
  void set_training(bool training) override { foundation_.set_training(training); }
  void set_recompute(const RecomputeOptions& r) override { foundation_.set_recompute(r); }
  std::map<std::string, at::Tensor> rng_state() const override { return foundation_.rng().state(); }
  void set_rng_state(const std::map<std::string, at::Tensor>& s) override { foundation_.rng().set_state(s); }
  const std::vector<Parameter>& parameters() const { return params_; }

 private:
  FeatureRegression(const FeatureTransformerConfig& foundation, const FeatureRegressionConfig& config,
                    const lf::backend::DeviceBackend& backend, uint64_t seed, const lf::dist::ParallelContext* parallel,
                    bool trainable, ParamBuilder b);
  const lf::dist::ParallelContext* parallel_;
  bool trainable_;
  FeatureTransformer foundation_;
  RegressionHead head_;
  std::vector<Parameter> params_;
};

void register_feature_regression(Registry& r);

}  // namespace lf::models

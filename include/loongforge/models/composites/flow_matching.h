// The `flow_matching` composite: a video/image diffusion transformer (the `wan` foundation)
// trained with the rectified-flow objective as Wan / DiffSynth train it. Per sample a training
// timestep index k is drawn in [min_timestep_boundary N, max_timestep_boundary N) of the N training
// timesteps, whose sigma is the shifted sigma_k = shift s / (1 + (shift - 1) s) with
// s = 1 - k / N; the model sees x_t = (1 - sigma) x0 + sigma eps at timestep N sigma and regresses
// eps - x0; the per-sample MSE is weighted by Wan's timestep weighting (a Gaussian bump around
// N / 2 normalised to mean 1; `loss_weighting: none` turns it off). Normaliser: samples.
// Wan 2.2 A14B's two noise experts are two runs over the two ranges of k (the high-noise expert:
// max_timestep_boundary 0.358), joined at sampling time. Noise and timesteps are drawn from a
// stream keyed by the seed, the training step and the sample's index: the same on every layout.
#pragma once

#include "loongforge/core/config/schema.h"
#include "loongforge/models/foundations/wan.h"
#include "loongforge/models/model.h"

namespace lf::models {

class Registry;

struct FlowMatchingConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 5.0;
  double min_timestep_boundary = 0.0;
  double max_timestep_boundary = 1.0;
  std::string loss_weighting = "wan";
  bool first_frame_conditioning = false;
  double text_dropout = 0.0;
  // --mock-data: the latent grid (frames, height, width) and the text / image embeddings' lengths.
  std::vector<int64_t> mock_latent_shape = {2, 8, 8};
  int64_t mock_text_length = 8;
  int64_t mock_image_length = 4;

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("num_train_timesteps", num_train_timesteps, "Training timesteps N (sigma grid 1 - k / N)", Min{1});
    v("shift", shift, "Sigma shift: shift s / (1 + (shift - 1) s) (Wan: 5)", Min{0});
    v("min_timestep_boundary", min_timestep_boundary,
      "Lowest fraction of the timestep indices trained (0: from the noisiest)", Min{0}, Max{1});
    v("max_timestep_boundary", max_timestep_boundary,
      "Highest fraction of the timestep indices trained (Wan 2.2 A14B high-noise expert: 0.358)", Min{0}, Max{1});
    v("loss_weighting", loss_weighting, "Per-timestep loss weight: wan (Gaussian bump, mean 1) or none",
      OneOf{{"wan", "none"}});
    v("first_frame_conditioning", first_frame_conditioning,
      "Wan 2.2 TI2V: the first latent frame stays clean (timestep 0 on its tokens) and is not in the loss");
    v("text_dropout", text_dropout,
      "Probability that a training sample's text (and image) embeddings are zeroed: the unconditional model "
      "classifier-free guidance samples with (a zero negative prompt)",
      Min{0}, Max{1});
    v("mock_latent_shape", mock_latent_shape, "--mock-data: latent frames, height, width");
    v("mock_text_length", mock_text_length, "--mock-data: text embedding tokens", Min{1});
    v("mock_image_length", mock_image_length, "--mock-data: image embedding tokens (I2V)", Min{1});
  }
  void validate(const lf::config::Node& tree, const std::string& prefix, lf::config::ErrorList& errors) const;
};

// The training timesteps: sigma_k and 1000-scale timesteps N sigma_k, k = 0..N-1, and the loss
// weights.
struct FlowMatchingSchedule {
  explicit FlowMatchingSchedule(const FlowMatchingConfig& c);
  std::vector<double> sigmas, timesteps, weights;
  int64_t first_id = 0, end_id = 0;  // the trained indices [first_id, end_id)
};

class FlowMatching : public Model {
 public:
  FlowMatching(const WanConfig& foundation, const FlowMatchingConfig& config, const lf::backend::DeviceBackend& backend,
               uint64_t seed, at::ScalarType dtype, const lf::dist::ParallelContext* parallel, bool trainable = true,
               bool sequence_parallel = false);

  const std::string& type() const override;
  std::vector<ParameterGroup> parameter_groups() const override;
  std::map<std::string, double> loss_counts(const Batch& batch) const override;
  StageOutput stage_forward(const Batch& batch, const TensorMap& input, int64_t chunk, Pass pass) override;
  std::vector<std::string> eval_metrics() const override { return {kLoss}; }
  std::vector<std::string> batch_fields() const override;
  double flops_per_sample(int64_t seq_length) const override;
  void set_training(bool training) override { dit_.set_training(training); }
  void set_recompute(const RecomputeOptions& r) override { dit_.set_recompute(r); }
  void set_gradient_sink(const GradientSink* sink) override { dit_.set_weight_grad_slots(sink); }
  bool set_fp8(const lf::ops::Fp8Policy* fp8) override { return dit_.set_fp8(fp8); }
  void end_step(const at::Tensor&) override { ++step_; }
  void resume_at(int64_t iteration) override { step_ = iteration; }
  std::map<std::string, at::Tensor> rng_state() const override;
  void set_rng_state(const std::map<std::string, at::Tensor>& s) override;

  // The weighted per-sample losses [b] fp32 of clean latents given the noise [like latents] and
  // training timestep indices [b] int64 (the Python reference's inputs).
  at::Tensor sample_losses(const WanInputs& clean, const at::Tensor& noise, const at::Tensor& timestep_ids) const;
  const WanDit& dit() const { return dit_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  static constexpr const char* kLoss = "flow matching loss";

 private:
  FlowMatching(const WanConfig& foundation, const FlowMatchingConfig& config, const lf::backend::DeviceBackend& backend,
               uint64_t seed, const lf::dist::ParallelContext* parallel, bool trainable, ParamBuilder b);
  WanInputs inputs_of(const Batch& batch) const;
  const lf::backend::DeviceBackend& backend_;
  const lf::dist::ParallelContext* parallel_;
  bool trainable_;
  FlowMatchingConfig config_;
  FlowMatchingSchedule schedule_;
  uint64_t seed_;
  int64_t step_ = 0;
  WanDit dit_;
  std::vector<Parameter> params_;
};

void register_flow_matching(Registry& r);

}  // namespace lf::models

// What the VLM composites (qwen2_5_vl, qwen3_vl, internvl) share on top of CausalLm: a vision tower
// at TP 1 on the stages that hold it (the first; every stage with --enable-full-hetero-dp), its
// parameter group and context, and the tower's modes (models/composites/vision_modes.h:
// --enable-encoder-hetero-dp, --use-vit-dp-balance, --enable-full-hetero-dp). A composite builds its
// tower from tower_builder() and hands it over with attach_tower(); it names the batch fields that
// carry its media (media_fields) and encodes a micro-batch's media with encode_media(). With
// --enable-full-hetero-dp the plan gives every stage a vision context (its share group the
// foundation's TP x PP x CP ranks of one DP index, the first stage's ranks first): begin_step encodes
// the step's media spread over them and end_backward runs the tower's backward; evaluation and
// generation encode on the first stage. Qwen3-VL's exchanges carry its merged features and DeepStack
// rows side by side.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loongforge/models/composites/causal_lm.h"

namespace lf::models {

class VisionModes;

class VisionLm : public CausalLm {
 public:
  // vision_context: the tower's context (null on a stage without the tower, or on one device).
  VisionLm(const DecoderConfig& foundation, const lf::backend::DeviceBackend& backend, uint64_t seed,
           at::ScalarType dtype, const lf::dist::ParallelContext* parallel, bool sequence_parallel,
           const PipelineStage& stage, bool foundation_trainable,
           std::unique_ptr<lf::dist::ParallelContext> vision_context, bool vision_trainable);
  ~VisionLm() override;

  std::vector<ParameterGroup> parameter_groups() const override;
  // The tower's modes; no-ops on a stage without the tower.
  void set_encoder_data_parallel(bool on);
  void set_vision_balance(bool on);
  void set_full_hetero_dp(int first_stage_ranks);
  void begin_step(const std::vector<Batch>& micro_batches) override;
  void end_backward() override;

  const std::vector<Parameter>& vision_parameters() const { return encoder_params_; }

 protected:
  // Whether this rank builds the tower (the first stage, or a context given for every stage).
  bool holds_tower(const PipelineStage& stage) const { return stage.first || vision_context_ != nullptr; }
  // The tower's parameter builder: component_seed(seed, "vision_encoder"), TP 1.
  ParamBuilder tower_builder(uint64_t seed, at::ScalarType dtype) const;
  // The built tower: its parameters, the function of rows + grids of several media -> [features,
  // width], its patch rows' width and merge (features per medium: t h w / merge^2).
  void attach_tower(std::vector<Parameter> params, std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> encode,
                    int64_t width, int64_t patch_dim, int64_t merge);
  // The (pixel rows, grid) batch fields of each medium kind, in the order encode_media() takes them.
  virtual std::vector<std::pair<std::string, std::string>> media_fields() const = 0;
  // One micro-batch's media (rows of every kind concatenated in media_fields() order, grids [n, 3])
  // -> their features in media order (VisionModes::encode); key: the micro-batch's tokens.
  at::Tensor encode_media(const at::Tensor& key, const at::Tensor& pixels, const at::Tensor& grids) const;

  std::unique_ptr<lf::dist::ParallelContext> vision_context_;
  bool vision_trainable_;
  std::vector<Parameter> encoder_params_;

 private:
  int64_t foundation_cp_ = 1;  // the foundation's CP size (its CP ranks each backpropagate their tokens' part)
  std::unique_ptr<VisionModes> modes_;
};

}  // namespace lf::models

#include "loongforge/models/composites/vision_lm.h"

#include <ATen/CPUGeneratorImpl.h>

#include "loongforge/dist/parallel_context.h"
#include "vision_modes.h"

namespace lf::models {

VisionLm::VisionLm(const DecoderConfig& foundation, const lf::backend::DeviceBackend& backend, uint64_t seed,
                   at::ScalarType dtype, const lf::dist::ParallelContext* parallel, bool sequence_parallel,
                   const PipelineStage& stage, bool foundation_trainable,
                   std::unique_ptr<lf::dist::ParallelContext> vision_context, bool vision_trainable)
    : CausalLm(foundation, backend, seed, dtype, parallel, sequence_parallel, stage, foundation_trainable),
      vision_context_(std::move(vision_context)),
      vision_trainable_(vision_trainable),
      foundation_cp_(parallel ? parallel->cp_size() : 1) {}

VisionLm::~VisionLm() = default;

ParamBuilder VisionLm::tower_builder(uint64_t seed, at::ScalarType dtype) const {
  return ParamBuilder(at::make_generator<at::CPUGeneratorImpl>(component_seed(seed, "vision_encoder")), dtype,
                      backend_.device(), tensor_parallel_of(nullptr, false), vision_trainable_);
}

void VisionLm::attach_tower(std::vector<Parameter> params,
                            std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> encode, int64_t width,
                            int64_t patch_dim, int64_t merge) {
  encoder_params_ = std::move(params);
  VisionTower tower;
  tower.encode = std::move(encode);
  tower.params = &encoder_params_;
  tower.width = width;
  tower.pixel_options =
      at::TensorOptions().dtype(encoder_params_.front().tensor.scalar_type()).device(backend_.device());
  tower.patch_dim = patch_dim;
  tower.merge = merge;
  modes_ = std::make_unique<VisionModes>(vision_context_.get(), foundation_cp_, std::move(tower));
}

std::vector<ParameterGroup> VisionLm::parameter_groups() const {
  auto groups = CausalLm::parameter_groups();
  if (modes_) groups.push_back(ParameterGroup{"vision_encoder", encoder_params_, vision_context_.get(), vision_trainable_});
  return groups;
}

void VisionLm::set_encoder_data_parallel(bool on) {
  if (modes_) modes_->set_encoder_data_parallel(on);
}
void VisionLm::set_vision_balance(bool on) {
  if (modes_) modes_->set_balance(on);
}
void VisionLm::set_full_hetero_dp(int first_stage_ranks) {
  if (modes_) modes_->set_full_hetero_dp(first_stage_ranks);
}

void VisionLm::begin_step(const std::vector<Batch>& micro_batches) {
  if (modes_ && modes_->full_hetero_dp()) modes_->begin_step(micro_batches, media_fields());
}

void VisionLm::end_backward() {
  // The first stage's TP ranks each hold the whole gradient of every feature (its CP ranks each
  // their tokens' part): the return all-to-all's backward sums them, so 1 / TP each.
  if (modes_) modes_->end_backward(1.0 / static_cast<double>(tp_size()));
}

at::Tensor VisionLm::encode_media(const at::Tensor& key, const at::Tensor& pixels, const at::Tensor& grids) const {
  return modes_->encode(key, pixels, grids);
}

}  // namespace lf::models

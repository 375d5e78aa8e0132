#include "loongforge/models/blocks/param_builder.h"

#include <ATen/Functions.h>

#include "loongforge/core/error.h"

namespace lf::models {

ParamBuilder::ParamBuilder(at::Generator generator, at::ScalarType dtype, c10::Device device,
                           lf::parallel::TensorParallel tp, bool trainable)
    : generator_(std::move(generator)), dtype_(dtype), device_(device), tp_(tp), trainable_(trainable) {}

ParamBuilder ParamBuilder::records_only(lf::parallel::TensorParallel tp) {
  ParamBuilder b(at::Generator(), at::kFloat, c10::Device(c10::kMeta), tp, false);
  b.meta_ = true;
  return b;
}

at::Tensor ParamBuilder::normal(std::vector<int64_t> shape, double std) {
  if (meta_) return at::empty(shape, at::TensorOptions().dtype(at::kFloat).device(c10::kMeta));
  return at::normal(0.0, std, shape, generator_, at::kFloat);
}

Parameter& ParamBuilder::keep_shard(const std::string& name, const at::Tensor& full, Sharding sharding, int size,
                                    int rank) {
  sharding.check(full.sizes().vec(), size, "parameter " + name);
  at::Tensor t = sharding.shard(meta_ ? full.to(device_) : full, rank, size).to(dtype_).to(device_);
  t.set_requires_grad(trainable_);
  Parameter p;
  p.name = name;
  p.tensor = t;
  p.sharding = sharding;
  p.tp_size = size;
  p.tp_rank = rank;
  params_.push_back(std::move(p));
  return params_.back();
}

at::Tensor ParamBuilder::add(const std::string& name, const at::Tensor& full, Sharding sharding, bool no_weight_decay,
                             TpGrad grad) {
  if (!keep_) return {};
  const int tp = tp_.size();
  Parameter& p = keep_shard(name, full, sharding, tp, tp_.rank());
  p.no_weight_decay = no_weight_decay;
  p.sequence_parallel = tp > 1 && sharding.is_replicated() &&
                        (grad == TpGrad::partial || (grad == TpGrad::by_layout && tp_.sequence_parallel));
  return p.tensor;
}

at::Tensor ParamBuilder::add_expert(const std::string& name, const at::Tensor& full, Sharding within_expert) {
  if (!keep_) return {};
  LF_CHECK(tp_.ep != nullptr, "ParamBuilder::add_expert(", name, "): no expert-parallel group",
           lf::hint("internal: only expert-parallel layers register expert weights"));
  const int ep = tp_.ep->size(), tp = tp_.size();
  Parameter& p = tp_.ep_split_over_tp && tp > 1
                     ? keep_shard(name, full, Sharding::within_parts(ep, within_expert), ep * tp,
                                  tp_.ep->rank() * tp + tp_.rank())
                     : keep_shard(name, full, Sharding::along(0), ep, tp_.ep->rank());
  p.expert = true;
  return p.tensor;
}

at::Tensor ParamBuilder::add_state(const std::string& name, const at::Tensor& full) {
  if (!keep_) return {};
  Parameter p;
  p.name = name;
  p.tensor = full.to(at::kFloat).to(device_).clone();
  p.sharding = Sharding::replicated();
  p.tp_size = tp_.size();
  p.tp_rank = tp_.rank();
  p.no_weight_decay = true;
  p.state = true;
  params_.push_back(std::move(p));
  return params_.back().tensor;
}

Parameter& ParamBuilder::last() {
  LF_CHECK(!params_.empty(), "ParamBuilder::last: no parameter added yet");
  return params_.back();
}

uint64_t component_seed(uint64_t seed, const std::string& slot) {
  if (slot == "foundation") return seed;
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the slot name
  for (unsigned char c : slot) h = (h ^ c) * 1099511628211ull;
  return seed ^ (h & 0x7fffffffffffull);
}

}  // namespace lf::models

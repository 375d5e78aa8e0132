// How every LoongForge component creates its parameters: each full tensor is drawn from the
// component's generator on the CPU, in a fixed order, on every rank (so the same seed gives the
// same model on every backend and layout), then this rank keeps its TP shard of it when the
// tensor belongs to its pipeline stage. The sharding facts go into the Parameter record
// (parallel/sharding.h). Not the initialisation policy: blocks choose their distributions.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "loongforge/parallel/sharding.h"
#include "loongforge/parallel/tensor/layers.h"

namespace lf::models {

using lf::parallel::Parameter;
using lf::parallel::Sharding;

class ParamBuilder {
 public:
  // tp: the owning component's TP group (its sizes go into every Parameter). trainable false:
  // the component is frozen (parameters do not require grad).
  ParamBuilder(at::Generator generator, at::ScalarType dtype, c10::Device device,
               lf::parallel::TensorParallel tp, bool trainable = true);
  // The records only (names, full shapes, shardings) on the meta device: nothing is drawn or
  // allocated (offline tools on models of any size).
  static ParamBuilder records_only(lf::parallel::TensorParallel tp = {});
  bool meta() const { return meta_; }

  // Draws (always, on every rank): N(0, std) fp32 of `shape`.
  at::Tensor normal(std::vector<int64_t> shape, double std);
  at::Generator& generator() { return generator_; }

  // Whether the tensors added next belong to this rank (its pipeline stage); default true.
  void set_keep(bool keep) { keep_ = keep; }
  bool keeps() const { return keep_; }

  // How a replicated tensor's gradient relates over the TP ranks (Parameter::sequence_parallel:
  // summed over TP before the optimizer step, or not).
  enum class TpGrad {
    by_layout,  // summed under sequence parallelism (the tensor acts on sequence chunks), else whole
    partial,    // differs per TP rank even without sequence parallelism (per-head QK norms): summed
    whole,      // the same on every TP rank even under sequence parallelism (its layer sees the whole
                // sequence and an output gradient already summed over TP, as MLA's down projections)
  };
  // Registers this rank's shard of `full` as a parameter and returns it (undefined when not
  // kept: another stage's tensor, drawn only so that the draw order is the same everywhere).
  // `grad` matters for replicated tensors only.
  at::Tensor add(const std::string& name, const at::Tensor& full, Sharding sharding, bool no_weight_decay,
                 TpGrad grad = TpGrad::by_layout);
  // Registers an expert weight of an expert-parallel layer: this rank's part (along dim 0, the
  // experts) of the tp.ep group, recorded with that group's size and rank (Parameter::expert).
  // With tp.ep_split_over_tp each part is also split over tp by `within_expert` (a split along
  // dim >= 1): recorded as a two-level split over ep x tp ranks (Sharding::outer), rank
  // ep_rank * tp + tp_rank, the numbering of the experts' context (ParallelLayout::expert_layout).
  at::Tensor add_expert(const std::string& name, const at::Tensor& full, Sharding within_expert);
  // Registers model state (Parameter::state): replicated, fp32 whatever the model's dtype, never
  // requires grad. Not drawn from the generator (the draw order of the weights is unchanged).
  at::Tensor add_state(const std::string& name, const at::Tensor& full);
  // The last parameter added (to set flags such as tied_copy).
  Parameter& last();

  const std::vector<Parameter>& params() const { return params_; }
  std::vector<Parameter> take() { return std::move(params_); }
  const lf::parallel::TensorParallel& tp() const { return tp_; }
  at::ScalarType dtype() const { return dtype_; }
  c10::Device device() const { return device_; }

 private:
  // Registers rank's part of `full` split over `size` ranks and returns its record.
  Parameter& keep_shard(const std::string& name, const at::Tensor& full, Sharding sharding, int size, int rank);

  at::Generator generator_;
  at::ScalarType dtype_;
  c10::Device device_;
  lf::parallel::TensorParallel tp_;
  bool trainable_;
  bool meta_ = false;
  bool keep_ = true;
  std::vector<Parameter> params_;
};

// The seed of a component's own generator: the job seed for the foundation (and the heads that
// continue its draw), a different stream per other component so that adding an encoder does not
// change the foundation's initial weights.
uint64_t component_seed(uint64_t seed, const std::string& slot);

}  // namespace lf::models

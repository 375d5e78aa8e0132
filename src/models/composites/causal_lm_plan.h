// The plan of causal_lm (and of composites built on it): the foundation's pipeline stages,
// per-rank estimates and layout checks from the job, then the model. Internal to models/.
#pragma once

#include <string>
#include <vector>

#include "loongforge/models/blocks/lora.h"
#include "loongforge/models/foundations/decoder_config.h"
#include "loongforge/models/registry.h"
#include "loongforge/parallel/pipeline/stages.h"

namespace lf::models {

class CausalLm;

class CausalLmPlan : public ModelPlan {
 public:
  CausalLmPlan(std::shared_ptr<const ModelConfig> config, const PlanArgs& args, lf::config::ErrorList& errors);
  const ModelConfig& config() const override { return *config_; }
  std::string describe() const override;
  std::string summary() const override;
  int64_t num_parameters() const override;
  DataNeeds data_needs() const override;
  std::unique_ptr<Model> build(const BuildArgs& args) const override;

  const DecoderConfig& foundation() const { return foundation_; }
  lf::parallel::pipeline::StageSplit stage_split() const;
  // The job's LoRA adapters (lora.*; disabled when lora.rank is 0).
  LoraSpec lora_spec() const;
  // The adapters' parameters a rank holds for `layers` decoder layers (0 without LoRA).
  double lora_parameters_per_rank(int64_t layers) const;

 protected:
  // The components besides the foundation, one line each, for describe().
  virtual std::string describe_components() const;
  // Stage k's share of the parameters (its layers; embedding first, head last), for --dry-run.
  struct StageCount {
    std::vector<lf::parallel::pipeline::LayerRange> chunks;
    int64_t layers = 0;
    int64_t params = 0;  // of the full model's tensors this stage holds (before / tp)
    int64_t experts = 0; // of those, routed experts' weights (split over ep, or tp)
    std::string extra;   // what besides layers
  };
  std::vector<StageCount> stage_counts() const;
  // What the components besides the foundation add to a rank of pipeline stage k (bytes), for
  // estimates(); `what` names them (empty: nothing).
  struct ComponentEstimate {
    std::string what;
    double params = 0, weights = 0, grads = 0, optimizer = 0, activations = 0;
    std::string note;  // how the activations were counted
  };
  virtual ComponentEstimate component_estimate(size_t stage, int64_t micro_batches) const;
  std::string stage_assignment() const;
  std::string estimates() const;

  // Expert parallelism with expert TP 1 (experts on their own context): ep > 1, or expert TP 1
  // under TP. The context and the placement for the model's constructor.
  bool expert_parallel() const { return expert_parallel_; }
  // Whether the trainer pairs the forward of one micro-batch with the backward of another (the
  // MoE overlap on, its pairing on, more micro-batches a step than pipeline stages, no ChunkPipe;
  // 1F1B or interleaved), and the token chunks of the
  // overlapped all-to-all (--moe-overlap-num-chunks; unset: 1 with pairs, else 2; 0: no overlap).
  bool pairs_micro_batches() const;
  // global batch / (micro-batch size x dp), as the trainer counts them.
  int64_t micro_batches_per_step() const;
  int overlap_chunks() const;
  std::unique_ptr<lf::dist::ParallelContext> make_expert_context(const BuildArgs& args) const;
  // Context parallelism (--context-parallel-size > 1, --cp-comm-type) on a built model.
  void apply_context_parallel(CausalLm& model, const lf::dist::ParallelContext& ctx) const;

  std::shared_ptr<const ModelConfig> config_;
  lf::config::JobConfig job_;
  lf::dist::ParallelLayout layout_;
  DecoderConfig foundation_;
  bool frozen_ = false;
  bool expert_parallel_ = false;
};

void register_causal_lm(Registry& r);

}  // namespace lf::models

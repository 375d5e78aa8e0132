// The model interface the trainer drives without knowing the family: parameters in groups (each
// with the parallel context its gradients are reduced over), this rank's pipeline part, one
// forward over a named batch returning named loss terms (their normalisers are counted from the
// batch, so averaging over micro-batches, data-parallel ranks and pipeline stages is exact for
// every loss) or named evaluation metrics, training mode, recomputation and the dropout streams.
// Composites (models/composites/) implement it; the registry (models/registry.h) builds them
// from YAML. See docs/design/model-layer.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loongforge/backend/functional.h"
#include "loongforge/backend/op_table.h"
#include "loongforge/core/stream_pair.h"
#include "loongforge/core/trace_spans.h"
#include "loongforge/data/batch.h"
#include "loongforge/models/blocks/attention.h"
#include "loongforge/models/blocks/transformer_layer.h"
#include "loongforge/parallel/sharding.h"

namespace lf::dist {
class ParallelContext;
}

namespace lf::models {

using lf::data::Batch;
using lf::data::TensorMap;

// Parameters whose gradients are reduced together: one component's (or several components' that
// share a parallel context). The trainer gives each group its own gradient buffer.
struct ParameterGroup {
  std::string name;  // "model" (the foundation and its heads), "image_encoder", ...
  std::vector<lf::parallel::Parameter> params;
  // The group's layout: gradients are reduced over its data-parallel ranks (dp x cp), summed over
  // its TP group for sequence-parallel parameters; checkpoints name files by its coordinates.
  const lf::dist::ParallelContext* context = nullptr;
  bool trainable = true;  // false: frozen (no gradients, no optimizer state; weights are saved)
  // The frozen base of an adapter (LoRA) run: its weights come from the base checkpoint the run's
  // checkpoints name, and are not saved with them.
  bool base = false;
};

// One loss term of one micro-batch: the sum over its units (tokens, samples); the trainer divides
// by the term's unit count over the whole global batch (loss_counts) before backpropagating.
struct LossTerm {
  std::string name;  // "lm loss", "mse loss"
  at::Tensor sum;    // scalar, differentiable
};

// An evaluation metric summed over a micro-batch with its count: the trainer reports sum / count
// over every evaluated micro-batch of every data-parallel rank.
struct Metric {
  double sum = 0, count = 0;
};
using Metrics = std::map<std::string, Metric>;

// What one stage forward produced.
struct StageOutput {
  TensorMap activations;         // to the next pipeline stage (every stage but the last)
  std::vector<LossTerm> losses;  // the last stage, training
  Metrics metrics;               // the last stage, evaluation
};

enum class Pass { train, eval };

// Gradient-accumulation fusion: lets a layer that computes a weight gradient in its forward (the
// fused output layer + cross entropy) write it straight into the trainer's gradient buffer, scaled
// by the weight the trainer gives the loss term it belongs to. Implemented by the trainer; take()
// may return nothing (then the layer hands its gradient to autograd as usual).
// As a WeightGradSlots it also names, during the step's backward, the slot a linear layer's
// backward writes its weight gradient into (lf::ops::linear; unscaled: the backward's gradient
// already carries the loss weights).
class GradientSink : public lf::ops::WeightGradSlots {
 public:
  ~GradientSink() override = default;
  // param: the parameter; loss_term: the loss term whose backward carries the gradient (its
  // weight this step scales it).
  virtual std::optional<lf::backend::GradInto> take(const at::Tensor& param, const std::string& loss_term) const = 0;
  std::optional<lf::backend::GradInto> weight_grad_slot(const at::Tensor&) const override { return std::nullopt; }
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const std::string& type() const = 0;  // the composite's registry name

  virtual std::vector<ParameterGroup> parameter_groups() const = 0;

  // Pipeline: this rank's model chunks (interleaved schedule: > 1) and its place.
  virtual int64_t num_model_chunks() const { return 1; }
  virtual bool first_stage() const { return true; }
  virtual bool last_stage() const { return true; }
  virtual std::string describe_stage() const { return "the whole model"; }

  // Per loss term, the units of this micro-batch it is normalised by (the tokens that count, the
  // samples): known from the batch alone, on every stage.
  virtual std::map<std::string, double> loss_counts(const Batch& batch) const = 0;
  // Model chunk `chunk` of this rank on one micro-batch. input: the previous stage's activations
  // (empty on the first stage's chunk 0). train: losses on the last stage's last chunk;
  // eval (no autograd): metrics there.
  virtual StageOutput stage_forward(const Batch& batch, const TensorMap& input, int64_t chunk, Pass pass) = 0;
  // The non-pipelined step: the whole model on one micro-batch.
  StageOutput forward_step(const Batch& batch, Pass pass = Pass::train) { return stage_forward(batch, {}, 0, pass); }

  // ChunkPipe: the chunk of a sequence at positions [start, start + c) (`chunk`: the batch's
  // sequence fields cut to it) over the earlier chunks' keys/values in kv. with_head false on the
  // last stage skips the head (a pass that only needs keys and values).
  virtual bool supports_chunkpipe() const { return false; }
  virtual StageOutput chunk_forward(const Batch& chunk, const TensorMap& input, int64_t start, ChunkAttention& kv,
                                    bool with_head, Pass pass);

  // A training step's work that spans its micro-batches and ranks the pipeline schedule keeps apart
  // (--enable-full-hetero-dp: a vision tower on every stage encodes the step's media here, before
  // the first forward, and runs its backward after the last backward). Every rank calls begin_step
  // with the step's micro-batches in order before the schedule, and end_backward after the
  // schedule's last backward, before the gradient reduction. Collective; nothing by default.
  virtual void begin_step(const std::vector<Batch>& /*micro_batches*/) {}
  virtual void end_backward() {}

  // The metrics stage_forward(.., Pass::eval) reports on the last stage (every stage knows them).
  virtual std::vector<std::string> eval_metrics() const = 0;
  // Batch fields the model reads, for messages ("tokens, labels, loss_mask").
  virtual std::vector<std::string> batch_fields() const = 0;
  // Training FLOPs (forward + backward) per sample of `seq_length` (TFLOP/s logging).
  virtual double flops_per_sample(int64_t seq_length) const = 0;

  virtual void set_training(bool training) = 0;
  virtual void set_recompute(const RecomputeOptions&) {}
  // FP8 GEMMs under this policy (null: none; it must outlive training). Returns whether the model
  // has any GEMM the policy applies to (false: the model does not do FP8, and a run asking for it
  // is refused).
  virtual bool set_fp8(const lf::ops::Fp8Policy*) { return false; }
  // Training steps' gradient destinations (null: none); the model must not outlive the sink.
  virtual void set_gradient_sink(const GradientSink*) {}
  // Where the model records spans of its work inside forwards and backwards (--pipeline-trace;
  // null: nowhere). What a model records, if anything, is its own (MoE: the overlapped
  // all-to-alls and expert computation); the sink must outlive the model's training.
  virtual void set_trace(lf::TraceSpans*) {}
  // The streams of the MoE overlap across micro-batches (null: none): the model yields to the
  // other stream where it waits for communication. Returns whether the model was built to pair
  // micro-batches (false: the trainer runs forwards and backwards as the schedule orders them);
  // the pair must outlive its use.
  virtual bool set_streams(lf::StreamPair*) { return false; }
  // Loss terms that arise inside the layers of any pipeline stage (MoE's load-balancing loss and
  // z-loss, one unit per micro-batch in loss_counts): their gradient enters in backward at the
  // layer that computes them, scaled by the weight the trainer gives the term (the step's weights,
  // set for its duration, null outside); their values summed over this rank's layers and the
  // step's micro-batches come from internal_loss_sums().
  virtual void set_loss_weights(const std::map<std::string, double>*) {}
  virtual std::map<std::string, double> internal_loss_sums() const { return {}; }
  // MoE routing statistics of the step: tokens per expert of this rank's MoE layers, [layers, E]
  // fp32 on the CPU (undefined: no MoE layers here). end_step receives it summed over the
  // data-parallel ranks (applies the expert-bias rule) and starts the next step's statistics.
  virtual at::Tensor expert_load() const { return {}; }
  virtual void end_step(const at::Tensor& /*global_expert_load*/) {}
  // Every dropout stream of every component (checkpoints; ChunkPipe's replay).
  virtual std::map<std::string, at::Tensor> rng_state() const { return {}; }
  virtual void set_rng_state(const std::map<std::string, at::Tensor>&) {}
  // The training iterations done before this run's first step: the loaded checkpoint's iteration
  // (0 for a new run or --finetune), given after any set_rng_state. Models whose random streams are
  // functions of the step (the noise and timesteps of flow matching, pi0.5, GR00T) set their step
  // counter from it: per-rank RNG states are not loaded when the layout changes (or with
  // --no-load-rng), and the streams must still continue, not restart at step 1.
  virtual void resume_at(int64_t /*iteration*/) {}
};

}  // namespace lf::models

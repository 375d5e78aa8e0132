// The `causal_lm` composite: a decoder foundation (foundations/decoder.h) plus the LM head
// (heads/lm_head.h), as a Model the trainer drives (next-token loss over `labels`, counted where
// `loss_mask` is 1; per-sample `position_ids` and `document_ids` for packed documents) and as the
// object generation and HF conversion use (full logits, the KV cache, full parameters by name).
// Swapping the backbone is the foundation's defaults line. Built by the registry
// (models/registry.h) or directly.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/models/foundations/decoder.h"
#include "loongforge/models/heads/lm_head.h"
#include "loongforge/models/model.h"

namespace lf::models {

// Expert parallelism with expert TP 1: the experts' own context (built from
// ParallelLayout::expert_layout: its tp axis is the expert-parallel group, its dp expert-DP) and
// the token dispatcher. No context: every rank holds every expert, split over TP.
struct ExpertPlacement {
  const lf::dist::ParallelContext* context = nullptr;
  bool allgather = true;  // else all-to-all
  int overlap_chunks = 0;  // all-to-all: > 0 overlaps the dispatch of that many token chunks (CCT)
  bool delay_wgrad = false;  // overlapped: the expert weights' gradients after every chunk's input gradient
  // The MoE overlap across micro-batches (CausalLmPlan::pairs_micro_batches): the trainer pairs
  // the forward of one micro-batch with the backward of another (set_streams accepts the streams).
  bool pair_micro_batches = false;
  // Expert TP = TP > 1 with expert parallelism: the experts are split over tp x ep (the context's
  // tp group), dispatched over the dense context's ep group (TensorParallel::ep_split_over_tp).
  bool split_over_tp = false;
};

class CausalLm : public Model {
 public:
  // The loss term of multi-token prediction (config().mtp_num_layers > 0): mtp_loss_scaling_factor
  // times the mean over MTP layers of their cross entropy, per main-loss token.
  static constexpr const char* kMtpLoss = "mtp loss";

  // Parameters are drawn from `seed` on the CPU in a fixed order, then moved to the backend's
  // device, so the same seed gives the same model on every backend and layout: with a context of
  // TP size tp, this rank keeps its shard of exactly the tensors the single-device model draws
  // (padding rows aside, which are zero). `parallel` (may be null: single device) must outlive
  // the model. sequence_parallel: activations between TP regions are split along the sequence.
  CausalLm(const DecoderConfig& config, const lf::backend::DeviceBackend& backend, uint64_t seed,
           at::ScalarType dtype, const lf::dist::ParallelContext* parallel = nullptr, bool sequence_parallel = false);
  // One pipeline stage of that model: every rank still draws every tensor in the same order (so
  // the PP model from seed S is the single-device model from seed S split by layers) and keeps
  // its stage's. With tied embeddings the last stage (when not also first) holds a tied_copy of
  // the embedding as its output layer. trainable false: frozen.
  CausalLm(const DecoderConfig& config, const lf::backend::DeviceBackend& backend, uint64_t seed,
           at::ScalarType dtype, const lf::dist::ParallelContext* parallel, bool sequence_parallel,
           const PipelineStage& stage, bool trainable = true, ExpertPlacement experts = {});

  ~CausalLm() override;

  // --- Model ---
  const std::string& type() const override;
  std::vector<ParameterGroup> parameter_groups() const override;
  int64_t num_model_chunks() const override { return foundation_.stage().num_chunks(); }
  bool first_stage() const override { return foundation_.stage().first; }
  bool last_stage() const override { return foundation_.stage().last; }
  std::string describe_stage() const override { return foundation_.describe_stage(); }
  std::map<std::string, double> loss_counts(const Batch& batch) const override;
  StageOutput stage_forward(const Batch& batch, const TensorMap& input, int64_t chunk, Pass pass) override;
  bool supports_chunkpipe() const override { return true; }
  StageOutput chunk_forward(const Batch& chunk, const TensorMap& input, int64_t start, ChunkAttention& kv,
                            bool with_head, Pass pass) override;
  std::vector<std::string> eval_metrics() const override { return {"lm loss", "accuracy"}; }
  std::vector<std::string> batch_fields() const override;
  double flops_per_sample(int64_t seq_length) const override;
  void set_training(bool training) override { foundation_.set_training(training); }
  void set_recompute(const RecomputeOptions& r) override { foundation_.set_recompute(r); }
  bool set_fp8(const lf::ops::Fp8Policy* fp8) override { return foundation_.set_fp8(fp8); }
  void set_gradient_sink(const GradientSink* sink) override {
    head_.set_gradient_sink(sink, "lm loss");
    foundation_.set_weight_grad_slots(sink);
  }
  void set_loss_weights(const std::map<std::string, double>* w) override { foundation_.moe_step().set_weights(w); }
  std::map<std::string, double> internal_loss_sums() const override { return foundation_.moe_step().loss_sums(); }
  void set_trace(lf::TraceSpans* spans) override { foundation_.moe_step().set_trace(spans); }
  bool set_streams(lf::StreamPair* streams) override {  // every stage, with MoE layers or not
    if (!experts_.pair_micro_batches) return false;
    foundation_.moe_step().set_streams(streams);
    return true;
  }
  at::Tensor expert_load() const override;
  void end_step(const at::Tensor& global_expert_load) override;
  std::map<std::string, at::Tensor> rng_state() const override;
  void set_rng_state(const std::map<std::string, at::Tensor>& state) override;

  // --- whole-model and stage calls on token tensors (generation, conversion, tests) ---
  // tokens: [b, s] int64 -> full-vocabulary logits [s, b, vocab_size] (under TP gathered over the
  // group, so every TP rank returns the same tensor).
  at::Tensor forward(const at::Tensor& tokens) const;
  // Incremental decoding (no autograd graph is kept): tokens [b, n] at positions cache.length ..
  // cache.length + n - 1 attend to the cached keys/values and their own causal prefix; appends
  // theirs to the cache. Returns full-vocabulary logits [n, b, vocab_size]. Not with SP.
  at::Tensor forward(const at::Tensor& tokens, KvCache& cache) const;
  // Multi-token prediction: tokens [b, s] -> per MTP layer k its full-vocabulary logits [s, b,
  // vocab_size] for the token k + 2 ahead of each position (the last k + 1 positions see padding
  // tokens 0); speculative-decoding drafts, parity tests. Whole model, no SP.
  std::vector<at::Tensor> mtp_logits(const at::Tensor& tokens) const;
  // tokens, labels: [b, s] -> per-token loss [s * b] fp32 (labels < 0: 0). Under TP the cross
  // entropy is vocab-parallel and every TP rank returns the same values.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& labels) const;
  // This stage's part. input: tokens [b, s] on the first stage, else the previous stage's hidden
  // states [s(/tp with SP), b, h]. Returns hidden states unless last; on the last stage the
  // per-token loss (labels given) or full logits (labels undefined). chunk: which of this rank's
  // model chunks (interleaved schedule).
  at::Tensor stage_forward(const at::Tensor& input, const at::Tensor& labels = {}, int64_t chunk = 0) const;
  // ChunkPipe: stage_forward for the tokens at positions [start, start + c); with_head false on
  // the last stage returns the hidden states (before the final norm).
  at::Tensor stage_forward_chunk(const at::Tensor& input, const at::Tensor& labels, int64_t start,
                                 ChunkAttention& kv, bool with_head = true) const;

  const std::vector<Parameter>& parameters() const { return params_; }
  // Copies full (unsharded, single-device layout) tensors into this rank's shards. Every
  // parameter must be present with its full shape; vocabulary tables may also come with exactly
  // vocab_size rows (the padding is zero-filled). Extra names are an error (a model mismatch);
  // other pipeline stages' names are expected.
  void load_full_parameters(const std::map<std::string, at::Tensor>& full);
  // The same for the LoRA adapters (our names, full [r, in] / [out, r] tensors): every adapter of
  // this rank must be present; names of other stages' layers are expected, others are an error.
  void load_full_lora(const std::map<std::string, at::Tensor>& full);

  const PipelineStage& stage() const { return foundation_.stage(); }
  bool training() const { return foundation_.training(); }
  const RecomputeOptions& recompute() const { return foundation_.recompute(); }
  lf::parallel::RngTracker& rng() const { return foundation_.rng(); }
  const DecoderConfig& config() const { return foundation_.config(); }
  int tp_size() const { return foundation_.tp().size(); }
  bool sequence_parallel() const { return foundation_.tp().sequence_parallel; }
  const Decoder& foundation() const { return foundation_; }
  const lf::dist::ParallelContext* context() const { return parallel_; }
  const ExpertPlacement& experts() const { return experts_; }
  // Keeps a context the model's parameters use (the experts') alive as long as the model.
  void keep_context(std::unique_ptr<lf::dist::ParallelContext> c);
  // Context parallelism over the context's CP group (size > 1; before training): stage_forward
  // takes whole micro-batches and runs this rank's tokens (parallel/context/context_parallel.h);
  // the loss and metric sums are this rank's share (the trainer sums them over dp x cp), the
  // loss counts those of the whole batch.
  void set_context_parallel(lf::parallel::CpCommType comm);
  const lf::parallel::ContextParallel& context_parallel() const { return cp_; }

  // LoRA: adds the adapters of `spec` (Decoder::add_lora, drawn from component_seed(seed, "lora"))
  // as the trainable parameter group "lora" and freezes every other parameter (no gradients, no
  // gradient buffers, no optimizer state). Once, before training.
  void add_lora(const LoraSpec& spec, uint64_t seed);
  const LoraSpec& lora() const { return lora_; }
  const std::vector<Parameter>& lora_parameters() const { return lora_params_; }

 protected:
  // The first stage's input to the layers: [s(/tp), b, h] from the batch (tokens embedded; a
  // multimodal composite splices its encoders' outputs in). Under context parallelism it gets the
  // whole micro-batch and returns this rank's tokens (context_share of the whole sequence).
  virtual at::Tensor embed_inputs(const Batch& batch) const;
  // The last stage: final norm, head, loss or metrics.
  StageOutput head_output(const at::Tensor& x, const Batch& batch, Pass pass) const;
  DecoderInputs inputs_of(const Batch& batch, int64_t seq) const;
  // Under context parallelism: this rank's tokens of the batch (its sequence fields -- tokens,
  // labels, loss_mask, position_ids -- in the CP layout; document_ids and per-sample fields such as
  // media whole). inputs_of adds the layout's positions when the batch has none.
  Batch context_slice(const Batch& batch) const;
  // This rank's share of whole-sequence hidden states [s, b, h] (dim 0 in the CP layout), and of an
  // injection over the whole sequence (its mask sliced, its rows those of this rank's positions);
  // unchanged without context parallelism. Differentiable.
  at::Tensor context_share(const at::Tensor& x) const;
  HiddenInjection context_share(const HiddenInjection& injection) const;
  void check_whole_model(const char* what) const;
  const LmHead& lm_head() const { return head_; }

  const lf::backend::DeviceBackend& backend_;
  const lf::dist::ParallelContext* parallel_;
  bool trainable_;

 private:
  CausalLm(const DecoderConfig& config, const lf::backend::DeviceBackend& backend, uint64_t seed,
           const lf::dist::ParallelContext* parallel, const PipelineStage& stage, bool trainable, ParamBuilder b,
           ExpertPlacement experts);
  at::Tensor local_logits(const at::Tensor& tokens, KvCache* cache) const;
  // Training, last stage: the MTP layers on the decoder's output x (before its final norm).
  at::Tensor mtp_loss_sum(const at::Tensor& x, const Batch& batch) const;

  ExpertPlacement experts_;
  lf::parallel::ContextParallel cp_;
  LoraSpec lora_;
  std::vector<Parameter> lora_params_;
  std::vector<std::unique_ptr<lf::dist::ParallelContext>> owned_contexts_;
  Decoder foundation_;
  LmHead head_;
  std::vector<Parameter> params_;
};

// A causal_lm `model:` section loaded through the registry: the foundation's fields and the
// section with every default filled in. An lf::config::ConfigError names every problem (and a
// section of another type).
struct CausalLmConfig {
  DecoderConfig foundation;
  lf::config::Node resolved;
};
CausalLmConfig load_causal_lm(const lf::config::Node& model);

// The parameter records of a causal LM of `config` at TP 1 (names, full shapes on the meta device,
// shardings), built without drawing or allocating weights: what offline tools need to cut full
// tensors for any layout (the HF converter's native checkpoints).
std::vector<Parameter> causal_lm_parameter_specs(const DecoderConfig& config);
std::map<std::string, lf::parallel::Sharding> causal_lm_shardings(const DecoderConfig& config);

// The TP group of `parallel` (null or size 1: none) with sequence_parallel.
lf::parallel::TensorParallel tensor_parallel_of(const lf::dist::ParallelContext* parallel, bool sequence_parallel);

}  // namespace lf::models

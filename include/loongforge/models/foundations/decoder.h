// The decoder-only transformer foundation (LLaMA-2/3, Qwen2/2.5, Qwen3, Mistral style): the
// token embedding, the layers (blocks/transformer_layer.h: RMSNorm or LayerNorm, RoPE optionally
// llama3-scaled, GQA attention with optional QKV bias and per-head QK RMSNorm, SwiGLU or GELU MLP,
// optional biases, hidden dropout) and the final norm. The LM head (output layer, tied or not,
// and the loss) is heads/lm_head.h; a composite (composites/causal_lm.h) puts them together.
// Written once for one device; given a TP group it holds this rank's shards (parallel/tensor),
// given a pipeline stage only its layers.
//
// Parameter layouts (the full, unsharded tensors; the HF converter depends on them):
//   embedding.word_embeddings.weight   [v_pad, h]; rows >= vocab_size are padding (zero). TP: dim 0.
//   decoder.layers.<i>.self_attention.linear_qkv.weight   [ng * (nq / ng + 2) * d, h], Megatron's
//       per-group interleaved rows: for each query group g: its nq/ng query heads, then its key
//       head, then its value head (d rows each). TP rank r owns groups [r ng/tp, (r+1) ng/tp): a
//       contiguous slice along dim 0. .bias (add_qkv_bias or add_bias_linear): the same rows.
//   ...self_attention.q_layernorm.weight, k_layernorm.weight  [d] (qk_layernorm), replicated.
//   ...self_attention.linear_proj.weight  [h, nq * d], columns in query-head order. TP: dim 1.
//       .bias [h] (add_bias_linear), replicated, added after the reduction.
//   ...mlp.linear_fc1.weight   [2 f, h] = [gate; up] (swiglu) or [f, h] (GELU). TP: gate and up
//       are split on their own, rank r holds [gate_r; up_r] (blocks = 2). .bias likewise.
//   ...mlp.linear_fc2.weight   [h, f]. TP: dim 1. .bias [h], replicated.
//   MoE layers (num_experts > 0, moe_layer_freq) hold instead of mlp.linear_fc1/fc2
//   (blocks/moe.h): mlp.router.weight [E, h], mlp.router.expert_bias [E] (model state),
//   mlp.experts.linear_fc1.weight [E, 2 f_e, h] ([gate; up] per expert), mlp.experts.linear_fc2.weight
//   [E, h, f_e], and with shared experts mlp.shared_experts.linear_fc1/linear_fc2.weight (+ gate_weight [1, h]).
//   *layernorm.weight (+ .bias with LayerNorm)  [h], replicated.
//   decoder.final_layernorm.weight (+ .bias)   [h], on the last stage.
// Layer names keep their global index under pipeline parallelism.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/models/blocks/embeddings.h"
#include "loongforge/models/blocks/rope.h"
#include "loongforge/models/blocks/transformer_layer.h"
#include "loongforge/models/foundations/decoder_config.h"
#include "loongforge/parallel/pipeline/stages.h"
#include "loongforge/parallel/tensor/random.h"

namespace lf::models {

using PipelineStage = lf::parallel::pipeline::PipelineStage;

// Rank pp_rank of pp for this model's layers (lf::parallel::pipeline::pipeline_stage).
PipelineStage pipeline_stage(const DecoderConfig& config, int pp, int pp_rank,
                             std::optional<int64_t> first_stage_layers = {},
                             std::optional<int64_t> last_stage_layers = {},
                             std::optional<int64_t> layers_per_virtual_stage = {},
                             const std::optional<std::string>& layout = {});

RopeSpec rope_spec(const DecoderConfig& c);

// An addition to the hidden states after one decoder layer at masked positions (Qwen3-VL's
// DeepStack): after global layer `layer`, the hidden state of sample b at position p gains the next
// row of `values` wherever mask[b, p] is true (rows in (b, p) row-major order, as masked_scatter
// takes them). mask [b, s] bool over the whole sequence (sequence parallelism: each rank adds its
// chunk's rows), values [mask.sum(), h]; differentiable in values.
struct HiddenInjection {
  int64_t layer = 0;
  at::Tensor mask;
  at::Tensor values;
};

// Per-forward inputs of the layers beyond the hidden states.
struct DecoderInputs {
  int64_t start = 0;          // position of the first token (KV cache, ChunkPipe)
  int64_t seq = 0;            // the full sequence length of the hidden states (SP: before the split;
                              // CP: this rank's tokens)
  at::Tensor position_ids;    // [b, s] int64 per-sample positions (packed documents), [3, b, s] with
                              // mrope_section (t/h/w M-RoPE positions), [s] shared by every sample
                              // (context parallelism), or undefined (0 ..)
  at::Tensor document_ids;    // [b, s] int64: attention stays within a document, or undefined. CP:
                              // the ids of the whole sequence [b, s x cp] (attention.h)
  const lf::parallel::ContextParallel* cp = nullptr;  // context parallelism (whole sequences only)
  KvCache* cache = nullptr;
  ChunkAttention* chunk = nullptr;
  // Additions after given layers (whole sequences only: no KV cache, no ChunkPipe). Every layer
  // named must be among those the run_layers call runs (an error otherwise: under pipeline
  // parallelism the stage holding the layer must receive the injection).
  std::vector<HiddenInjection> injections;
};

class Decoder {
 public:
  // Draws every tensor from `b`'s generator in a fixed order on every rank and keeps this stage's
  // (b.tp(): the TP group). seed, tp_rank, pp_rank: the dropout streams (Megatron: --seed drives
  // both init and dropout). The first stage's embedding table as drawn stays available through
  // initial_embedding() until release_initial_embedding() (a tied LM head copies it).
  Decoder(const DecoderConfig& config, const lf::backend::DeviceBackend& backend, ParamBuilder& b,
          const PipelineStage& stage, uint64_t seed, int tp_rank, int pp_rank);

  // tokens [b, s] -> [s(/tp), b, h] (embedding + its dropout). scatter false: the whole sequence
  // even under sequence parallelism (scatter_sequence() afterwards).
  at::Tensor embed(const at::Tensor& tokens, int64_t start, bool scatter = true) const;
  // [s, b, h] -> this rank's sequence chunk under sequence parallelism (identity otherwise);
  // differentiable (backward all-gathers).
  at::Tensor scatter_sequence(const at::Tensor& x) const;
  // Local layers [lo, hi) (default: all of this rank's): [s(/tp), b, h] -> [s(/tp), b, h]; with
  // in.injections the run is split after each injected layer (the recomputation policy counts
  // layers from each piece's start).
  at::Tensor run_layers(at::Tensor x, const DecoderInputs& in, size_t lo = 0, size_t hi = SIZE_MAX) const;
  // Final norm (last stage): [s(/tp), b, h] -> [s(/tp), b, h].
  at::Tensor final_norm(const at::Tensor& x) const;

  // Local layer indices [begin, end) of model chunk c.
  std::pair<size_t, size_t> chunk_layers(int64_t c) const;
  // The global index of local layer i.
  int64_t global_layer(size_t local) const;
  size_t num_local_layers() const { return layers_.size(); }
  const TransformerLayer& layer(size_t local) const { return layers_.at(local); }
  const PipelineStage& stage() const { return stage_; }
  std::string describe_stage() const { return stage_.describe(); }
  const at::Tensor& embedding_weight() const { return embedding_.weight(); }
  const at::Tensor& initial_embedding() const { return initial_embedding_; }
  void release_initial_embedding() { initial_embedding_ = at::Tensor(); }

  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  void set_recompute(const RecomputeOptions& r) { recompute_ = r; }
  // Gradient-accumulation fusion (null: none): the token embedding's and the dense layers' linear
  // weight gradients go straight into the slots this names (lf::ops::embedding / linear).
  void set_weight_grad_slots(const lf::ops::WeightGradSlots* slots) { slots_ = slots; }
  const RecomputeOptions& recompute() const { return recompute_; }
  // FP8 for the attention's (MLA: its up projections and linear_proj) and MLP's or experts' linear
  // layers (null: none) of the layers the policy does not keep in the training dtype (its
  // first/last layer counts, over the whole model; MTP layers follow the policy); the policy must
  // outlive training. False when it keeps every layer; a count beyond the model's layers throws.
  bool set_fp8(const lf::ops::Fp8Policy* fp8);
  lf::parallel::RngTracker& rng() const { return rng_; }
  const DecoderConfig& config() const { return config_; }
  const lf::parallel::TensorParallel& tp() const { return tp_; }

  // Multi-token prediction (config.mtp_num_layers; last stage): registers, per MTP layer k,
  // mtp.layers.<k>.enorm / hnorm (norms of the embedded tokens and of the incoming hidden states),
  // eh_proj [h, 2h] (column-parallel), transformer_layer.* (a decoder layer; MoE in a MoE model)
  // and final_layernorm. The composite calls it after its head, so the main weights' draws do not
  // depend on it.
  // last_stage_table: on a last stage that is not the first, the output layer's tied copy of the
  // embedding (undefined when untied: the MTP layers then register their own tied copy).
  void add_mtp(ParamBuilder& b, const at::Tensor& last_stage_table = {});
  size_t num_mtp_layers() const { return mtp_.size(); }

  // LoRA adapters (spec.targets) on every decoder layer, drawn from `b` (the adapters' own
  // builder and generator: the base weights' draws are unchanged) in layer order on every rank,
  // this stage's kept. Registers decoder.layers.<i>.self_attention.<q|k|v|o>_proj.lora_<A|B>.weight
  // and decoder.layers.<i>.mlp.<gate|up|down>_proj.lora_<A|B>.weight. Refused (naming the module)
  // on MLA attention and on MoE or non-SwiGLU MLPs, whose projections PEFT names differently.
  void add_lora(ParamBuilder& b, const LoraSpec& spec);
  // MTP layer k: hidden [s(/tp), b, h] (the decoder's output before its final norm for k = 0, else
  // MTP layer k - 1's output) and tokens [b, s] k + 1 positions ahead -> [s(/tp), b, h] (before the
  // layer's final norm).
  at::Tensor mtp_forward(size_t k, const at::Tensor& hidden, const at::Tensor& tokens, const DecoderInputs& in) const;
  at::Tensor mtp_final_norm(size_t k, const at::Tensor& x) const;

  // MoE: this rank's MoE layers (in local layer order), their step statistics and auxiliary-loss
  // weights, and the expert-bias update from the step's global load [moe_layers, E].
  size_t num_moe_layers() const { return moe_layers_; }
  MoeStep& moe_step() const { return moe_step_; }
  void update_expert_bias(const at::Tensor& load) const;

 private:
  DecoderConfig config_;
  const lf::backend::DeviceBackend& backend_;
  lf::parallel::TensorParallel tp_;
  PipelineStage stage_;
  TokenEmbedding embedding_;
  at::Tensor initial_embedding_;
  std::vector<TransformerLayer> layers_;  // this rank's, chunk after chunk in global order
  Norm final_norm_;
  bool training_ = true;
  RecomputeOptions recompute_;
  const lf::ops::WeightGradSlots* slots_ = nullptr;
  const lf::ops::Fp8Policy* fp8_ = nullptr;
  mutable lf::parallel::RngTracker rng_;
  size_t moe_layers_ = 0;
  mutable MoeStep moe_step_;
  TransformerLayerConfig layer_config_;  // the layers' settings (the MLP dense; moe_config_ for MoE)
  MoeConfig moe_config_;
  struct MtpLayer {
    Norm enorm, hnorm;
    at::Tensor eh_proj;
    TransformerLayer layer;
    Norm final_norm;
  };
  std::vector<MtpLayer> mtp_;
  TokenEmbedding mtp_embedding_;  // the last stage's copy of the embedding (MTP under PP)
  AttentionInputs attention_inputs(const DecoderInputs& in) const;
  at::Tensor inject(const at::Tensor& x, const HiddenInjection& injection, int64_t seq) const;
  at::Tensor embed_with(const TokenEmbedding& table, const at::Tensor& tokens, int64_t start, bool scatter = true) const;
};

// The MoE block settings of a decoder config (blocks/moe.h).
MoeConfig moe_config(const DecoderConfig& c);

}  // namespace lf::models

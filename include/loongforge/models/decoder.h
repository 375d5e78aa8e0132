// The decoder-only transformer family (LLaMA-2/3, Qwen2/2.5, Qwen3, Mistral style): RMSNorm or
// LayerNorm, RoPE (optionally llama3-scaled), GQA attention with optional QKV bias and per-head QK
// RMSNorm, SwiGLU or GELU MLP, optional linear biases, hidden dropout, activation recomputation and
// a KV cache for generation. Written once for one device; every fused op goes through the
// DeviceBackend (backend/functional.h). Given a ParallelContext it runs tensor-parallel (and
// sequence-parallel) through the layers of parallel/tensor: it then holds only this TP rank's
// shards of the same parameters.
//
// Parameter layouts (the full, unsharded tensors; the HF converter depends on them):
//   embedding.word_embeddings.weight, output_layer.weight   [v_pad, h]; rows >= vocab_size are
//       padding (initialised to zero, excluded from the softmax); v_pad = padded_vocab_size(tp).
//       TP: split along dim 0 (vocab).
//   self_attention.linear_qkv.weight   [ng * (nq / ng + 2) * d, h], Megatron's per-group
//       interleaved rows: for each query group g = 0..ng-1: its nq/ng query heads, then its key
//       head, then its value head (d rows each). TP rank r owns groups [r ng/tp, (r+1) ng/tp): a
//       contiguous slice along dim 0. .bias (add_qkv_bias or add_bias_linear): the same rows.
//   self_attention.q_layernorm.weight, k_layernorm.weight  [d] (qk_layernorm), replicated.
//   self_attention.linear_proj.weight  [h, nq * d], columns in query-head order. TP: dim 1.
//       .bias [h] (add_bias_linear), replicated, added after the reduction.
//   mlp.linear_fc1.weight              [2 f, h] = [gate; up] (swiglu) or [f, h] (GELU). TP: gate
//       and up are split on their own, rank r holds [gate_r; up_r] (partition_blocks = 2).
//       .bias [2 f] or [f] (add_bias_linear), split like the rows.
//   mlp.linear_fc2.weight              [h, f]. TP: dim 1. .bias [h], replicated.
//   *layernorm.weight (+ .bias with LayerNorm)  [h], replicated (sequence_parallel with SP).
//
// Pipeline parallelism: built for a PipelineStage, the decoder holds a contiguous range of layers
// (names keep their global index, decoder.layers.<i>...), the embedding on the first stage, the
// final norm and output layer on the last; stage_forward() runs that part.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/models/decoder_config.h"
#include "loongforge/parallel/pipeline/chunk_attention.h"
#include "loongforge/parallel/pipeline/stages.h"
#include "loongforge/parallel/tensor/layers.h"
#include "loongforge/parallel/tensor/random.h"

namespace lf::dist {
class ParallelContext;
}

namespace lf::models {

struct NamedParameter {
  std::string name;     // Megatron-style: decoder.layers.0.self_attention.linear_qkv.weight
  at::Tensor tensor;    // requires_grad leaf
  bool no_weight_decay = false;  // norms and biases
  // Tensor parallelism: >= 0 when this rank holds a shard of the full tensor along that dim
  // (each TP rank a different part); -1 when the tensor is replicated over the TP group.
  int64_t partition_dim = -1;
  // Replicated over TP but used on sequence-parallel (sharded) activations: its gradient must be
  // summed over the TP group before the optimizer (Megatron's `sequence_parallel` attribute).
  bool sequence_parallel = false;
  // The full tensor stacks this many equal blocks along partition_dim, each split over TP on its
  // own (fc1's [gate; up]: 2); a shard is then [block0_r; block1_r; ...].
  int64_t partition_blocks = 1;
  // Pipeline parallelism with tied embeddings: the last stage's copy of the first stage's
  // embedding (same name, same values), used as its output layer. Its gradient is summed with the
  // owner's over the embedding group before the optimizer (Megatron); the gradient norm, the
  // parameter dump and checkpoints skip it (the owner counts).
  bool tied_copy = false;
};

// The part of the model one pipeline rank holds: one or more model chunks, each a contiguous range
// of layers (global indices); several under the interleaved schedule (virtual stages, in
// virtual-stage order). The embedding comes before chunk 0 when first, the final norm and output
// layer (and loss) after the last chunk when last.
struct PipelineStage {
  std::vector<lf::parallel::pipeline::LayerRange> chunks;  // empty: the whole model, one chunk
  bool first = true, last = true;
  int64_t num_chunks() const { return chunks.empty() ? 1 : static_cast<int64_t>(chunks.size()); }
};
// Rank pp_rank of pp: its layers by lf::parallel::pipeline::split_layers (even, or the uneven
// first/last stage sizes), with layers_per_virtual_stage its model chunks by
// split_virtual_layers (interleaved schedule), or with a layout string (Megatron's
// --pipeline-model-parallel-layout) by split_by_layout. At most one of the three ways; errors
// name the values.
PipelineStage pipeline_stage(const DecoderConfig& config, int pp, int pp_rank,
                             std::optional<int64_t> first_stage_layers = {},
                             std::optional<int64_t> last_stage_layers = {},
                             std::optional<int64_t> layers_per_virtual_stage = {},
                             const std::optional<std::string>& layout = {});

// ChunkPipe: a chunk's attention over the keys and values of the earlier chunks.
using ChunkAttention = lf::parallel::pipeline::ChunkAttention;

// Activation recomputation (Megatron's --recompute-*). full: a layer keeps only its input and
// recomputes everything in backward; method uniform groups num_layers consecutive layers per
// checkpoint, block checkpoints the first num_layers layers only. selective: recompute the parts
// whose activations are large and cheap to redo: RoPE + core attention and the MLP activation.
struct RecomputeOptions {
  enum class Granularity { none, full, selective };
  enum class Method { uniform, block };
  Granularity granularity = Granularity::none;
  Method method = Method::uniform;
  int64_t num_layers = 1;
};

// Keys and values of the tokens seen so far, per layer, for incremental decoding
// (Decoder::forward with a cache). k, v: [b, nkv / tp, t, d].
struct KvCache {
  std::vector<at::Tensor> k, v;
  int64_t length = 0;  // tokens cached (the position of the next token)
};

class Decoder {
 public:
  // Parameters are drawn from `seed` on the CPU in a fixed order, then moved to the backend's
  // device, so the same seed gives the same model on every backend and layout: with a context of
  // TP size tp, this rank keeps its shard of exactly the tensors the single-device model draws
  // (padding rows aside, which are zero). `parallel` (may be null: single device) must outlive
  // the decoder. sequence_parallel: activations between TP regions are split along the sequence.
  Decoder(const DecoderConfig& config, const lf::backend::DeviceBackend& backend, uint64_t seed,
          at::ScalarType dtype, const lf::dist::ParallelContext* parallel = nullptr,
          bool sequence_parallel = false);
  // One pipeline stage of that model: every rank still draws every tensor in the same order (so
  // the PP model from seed S is the single-device model from seed S split by layers) and keeps
  // its stage's. With tied embeddings the last stage (when not also first) holds a tied_copy of
  // the embedding as its output layer.
  Decoder(const DecoderConfig& config, const lf::backend::DeviceBackend& backend, uint64_t seed,
          at::ScalarType dtype, const lf::dist::ParallelContext* parallel, bool sequence_parallel,
          const PipelineStage& stage);

  // tokens: [b, s] int64 -> full-vocabulary logits [s, b, vocab_size] (padding columns dropped;
  // under TP gathered over the group, so every TP rank returns the same tensor).
  at::Tensor forward(const at::Tensor& tokens) const;
  // Incremental decoding (no autograd graph is kept): tokens [b, n] at positions cache.length ..
  // cache.length + n - 1 attend to the cached keys/values and their own causal prefix; appends
  // theirs to the cache. Returns full-vocabulary logits [n, b, vocab_size]. Not with SP.
  at::Tensor forward(const at::Tensor& tokens, KvCache& cache) const;
  // tokens, labels: [b, s] -> per-token loss [s * b] fp32 over the whole sequence (labels < 0
  // are ignored: loss 0). Under TP the cross entropy is vocab-parallel (no rank forms
  // full-vocabulary logits) and every TP rank returns the same values.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& labels) const;
  // This stage's part. input: tokens [b, s] on the first stage, else the previous stage's hidden
  // states [s(/tp with SP), b, h]. Returns hidden states [s(/tp), b, h] unless last; on the last
  // stage the per-token loss [s * b] (labels [b, s] given) or full logits [s, b, vocab] (labels
  // undefined), as loss() / forward(). forward(), loss() and the KV cache need the whole model.
  // chunk: which of this rank's model chunks (interleaved schedule); the embedding runs before
  // chunk 0 on the first rank, the head after the last chunk on the last rank.
  at::Tensor stage_forward(const at::Tensor& input, const at::Tensor& labels = {}, int64_t chunk = 0) const;
  // ChunkPipe: stage_forward for the tokens at positions [start, start + c) of a sequence whose
  // earlier chunks' keys/values are in `kv` (this chunk's are added to it). with_head = false on the
  // last stage returns the hidden states instead of the loss (a pass that only needs the keys and
  // values). One model chunk per rank; no activation recomputation (ChunkPipe recomputes).
  at::Tensor stage_forward_chunk(const at::Tensor& input, const at::Tensor& labels, int64_t start,
                                 ChunkAttention& kv, bool with_head = true) const;
  const PipelineStage& stage() const { return stage_; }
  // "layers [a, b)" or "layers [a, b) + [c, d)" (virtual stages): for messages.
  std::string describe_stage() const;

  const std::vector<NamedParameter>& parameters() const { return params_; }
  // Copies full (unsharded, single-device layout) tensors into this rank's shards. Every
  // parameter must be present with its full shape; vocabulary tables may also come with exactly
  // vocab_size rows (the padding is zero-filled). Extra names are an error (a model mismatch).
  void load_full_parameters(const std::map<std::string, at::Tensor>& full);

  // Training mode (default) applies hidden dropout; eval mode does not.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  void set_recompute(const RecomputeOptions& r) { recompute_ = r; }
  const RecomputeOptions& recompute() const { return recompute_; }
  // The dropout streams (checkpointed with the rest of the RNG state).
  lf::parallel::RngTracker& rng() const { return rng_; }
  const DecoderConfig& config() const { return config_; }
  int tp_size() const { return tp_.size(); }
  bool sequence_parallel() const { return tp_.sequence_parallel; }

 private:
  struct Layer {
    at::Tensor input_norm, input_norm_bias, qkv, qkv_bias, q_norm, k_norm, proj, proj_bias,
        pre_mlp_norm, pre_mlp_norm_bias, fc1, fc1_bias, fc2, fc2_bias;
  };
  // Registers `full` (this rank's shard of it) as a parameter; while keep_ is false (a tensor of
  // another pipeline stage) it only lets the draw happen and returns an undefined tensor.
  at::Tensor add(std::string name, const at::Tensor& full, at::ScalarType dtype, bool no_decay,
                 int64_t partition_dim = -1, int64_t blocks = 1);
  void check_whole_model(const char* what) const;
  // tokens [b, s] -> [s(/tp), b, h] (embedding + its dropout)
  at::Tensor embed(const at::Tensor& tokens, int64_t start) const;
  // Local layers [lo, hi) (default: all of this rank's): [s(/tp), b, h] -> [s(/tp), b, h]; s: the
  // full sequence length of the input; `chunk`: ChunkPipe's keys/values.
  at::Tensor run_layers(at::Tensor x, int64_t start, int64_t s, KvCache* cache, size_t lo = 0,
                        size_t hi = SIZE_MAX, ChunkAttention* chunk = nullptr) const;
  // Final norm + output layer: [s(/tp), b, h] -> this rank's vocab shard [s, b, v_pad / tp]
  at::Tensor head(const at::Tensor& x) const;
  // Local logits -> per-token loss [s b] / full logits [s, b, vocab]
  at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& labels) const;
  at::Tensor full_logits(const at::Tensor& logits) const;
  at::Tensor norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
  // x: [s(/tp), b, h] -> this rank's vocab shard of the logits [s, b, v_pad / tp]
  at::Tensor local_logits(const at::Tensor& tokens, KvCache* cache = nullptr) const;
  // One layer: x [s(/tp), b, h] -> [s(/tp), b, h]; `cache`: incremental decoding of layer i.
  at::Tensor layer_forward(size_t i, const at::Tensor& x, const at::Tensor& cos,
                           const at::Tensor& sin, KvCache* cache, ChunkAttention* chunk = nullptr) const;
  // The residual branches, before the add: [s(/tp), b, h] -> [s(/tp), b, h]
  at::Tensor attention(size_t i, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       KvCache* cache, ChunkAttention* chunk = nullptr) const;
  at::Tensor mlp(const Layer& l, const at::Tensor& x) const;
  at::Tensor hidden_dropout(const at::Tensor& x) const;
  bool recompute_layer(size_t i) const;
  at::Tensor stage_forward_impl(const at::Tensor& input, const at::Tensor& labels, int64_t chunk,
                                int64_t start, ChunkAttention* kv, bool with_head) const;
  // Local layer indices [begin, end) of model chunk c.
  std::pair<size_t, size_t> chunk_layers(int64_t c) const;

  DecoderConfig config_;
  const lf::backend::DeviceBackend& backend_;
  lf::parallel::TensorParallel tp_;
  std::vector<NamedParameter> params_;
  at::Tensor embedding_, final_norm_, final_norm_bias_, output_;
  std::vector<Layer> layers_;  // this rank's, chunk after chunk in global order within each
  PipelineStage stage_;
  bool keep_ = true;
  bool training_ = true;
  RecomputeOptions recompute_;
  mutable lf::parallel::RngTracker rng_;
};

// RoPE frequencies: inv_freq[i] = base^(-2i/d), optionally rescaled as in Llama 3.1 (frequencies
// with wavelengths above original_max / low_freq_factor divided by factor, those below
// original_max / high_freq_factor kept, a smooth blend between).
struct RopeSpec {
  int64_t head_dim = 0;
  double base = 10000;
  bool llama3_scaling = false;
  double factor = 8, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position = 8192;
};
RopeSpec rope_spec(const DecoderConfig& c);
// cos, sin: [s, head_dim] for positions start..start+s-1 (Megatron's non-interleaved halves).
std::pair<at::Tensor, at::Tensor> rope_tables(const RopeSpec& spec, int64_t start, int64_t seq,
                                              const at::TensorOptions& options);
inline std::pair<at::Tensor, at::Tensor> rope_tables(int64_t seq, int64_t head_dim, double base,
                                                     const at::TensorOptions& options) {
  return rope_tables(RopeSpec{head_dim, base}, 0, seq, options);
}

}  // namespace lf::models

// The decoder-only transformer (LLaMA/Qwen style: RMSNorm, RoPE, GQA attention, SwiGLU MLP),
// written once for one device; every fused op goes through the DeviceBackend (backend/functional.h).
// Given a ParallelContext it runs tensor-parallel (and sequence-parallel) through the layers of
// parallel/tensor: it then holds only this TP rank's shards of the same parameters.
//
// Parameter layouts (the full, unsharded tensors; the HF converter depends on them):
//   embedding.word_embeddings.weight, output_layer.weight   [v_pad, h]; rows >= vocab_size are
//       padding (initialised to zero, excluded from the softmax); v_pad = padded_vocab_size(tp).
//       TP: split along dim 0 (vocab).
//   self_attention.linear_qkv.weight   [ng * (nq / ng + 2) * d, h], Megatron's per-group
//       interleaved rows: for each query group g = 0..ng-1: its nq/ng query heads, then its key
//       head, then its value head (d rows each). TP rank r owns groups [r ng/tp, (r+1) ng/tp): a
//       contiguous slice along dim 0.
//   self_attention.linear_proj.weight  [h, nq * d], columns in query-head order. TP: dim 1.
//   mlp.linear_fc1.weight              [2 f, h] = [gate; up]. TP: gate and up are split on their
//       own, rank r holds [gate_r; up_r] (partition_blocks = 2).
//   mlp.linear_fc2.weight              [h, f]. TP: dim 1.
//   *layernorm.weight                  [h], replicated (sequence_parallel with SP).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/models/decoder_config.h"
#include "loongforge/parallel/tensor/layers.h"

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

  // tokens: [b, s] int64 -> full-vocabulary logits [s, b, vocab_size] (padding columns dropped;
  // under TP gathered over the group, so every TP rank returns the same tensor).
  at::Tensor forward(const at::Tensor& tokens) const;
  // tokens, labels: [b, s] -> per-token loss [s * b] fp32 over the whole sequence (labels < 0
  // are ignored: loss 0). Under TP the cross entropy is vocab-parallel (no rank forms
  // full-vocabulary logits) and every TP rank returns the same values.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& labels) const;

  const std::vector<NamedParameter>& parameters() const { return params_; }
  const DecoderConfig& config() const { return config_; }
  int tp_size() const { return tp_.size(); }
  bool sequence_parallel() const { return tp_.sequence_parallel; }

 private:
  struct Layer {
    at::Tensor input_norm, qkv, proj, pre_mlp_norm, fc1, fc2;
  };
  at::Tensor add(std::string name, const at::Tensor& full, at::ScalarType dtype, bool no_decay,
                 int64_t partition_dim = -1, int64_t blocks = 1);
  // x: [s(/tp), b, h] -> this rank's vocab shard of the logits [s, b, v_pad / tp]
  at::Tensor local_logits(const at::Tensor& tokens) const;
  // x: [s(/tp), b, h] -> [s(/tp), b, h] (the residual branch, before the add)
  at::Tensor attention(const Layer& l, const at::Tensor& x, const at::Tensor& cos,
                       const at::Tensor& sin) const;
  at::Tensor mlp(const Layer& l, const at::Tensor& x) const;

  DecoderConfig config_;
  const lf::backend::DeviceBackend& backend_;
  lf::parallel::TensorParallel tp_;
  std::vector<NamedParameter> params_;
  at::Tensor embedding_, final_norm_, output_;
  std::vector<Layer> layers_;
};

// cos, sin: [s, head_dim] for positions 0..s-1 (Megatron's non-interleaved halves layout).
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t seq, int64_t head_dim, double base,
                                              const at::TensorOptions& options);

}  // namespace lf::models

// A pre-norm transformer layer (norm -> attention -> dropout -> residual, norm -> MLP -> dropout
// -> residual) and the loop over a range of layers with Megatron's activation recomputation
// (full: uniform groups or the first N layers; selective: core attention and the MLP
// activation). Shared by every foundation built of these layers. Not the embeddings or heads.
#pragma once

#include <ATen/core/Tensor.h>

#include <span>
#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/models/blocks/attention.h"
#include "loongforge/models/blocks/mla.h"
#include "loongforge/models/blocks/mlp.h"
#include "loongforge/models/blocks/moe.h"
#include "loongforge/models/blocks/norms.h"
#include "loongforge/models/recompute.h"
#include "loongforge/parallel/tensor/random.h"

namespace lf::models {

struct TransformerLayerConfig {
  NormSpec norm;
  AttentionConfig attention;
  bool mla = false;  // multi-latent attention (mla_config) instead of `attention`
  MlaConfig mla_config;
  MlpConfig mlp;
  double hidden_dropout = 0.0;
  bool moe = false;  // the MLP is a mixture of experts (moe_config)
  MoeConfig moe_config;
};

// What the layers of one forward share besides the attention inputs.
struct LayerContext {
  const lf::backend::DeviceBackend* backend = nullptr;
  const lf::parallel::TensorParallel* tp = nullptr;
  lf::parallel::RngTracker* rng = nullptr;  // dropout streams
  bool training = true;
  RecomputeOptions recompute;
  MoeStep* moe = nullptr;     // the MoE layers' routing statistics and auxiliary-loss weights
  size_t moe_layers = 0;      // this rank's MoE layers (the size of moe's load table)
  // Gradient-accumulation fusion for the dense attention's and MLP's linear layers (null: none).
  const lf::ops::WeightGradSlots* slots = nullptr;
  // FP8 for the attention's (MLA: its up projections and linear_proj), the MLP's and the MoE experts'
  // linear layers (null: none).
  const lf::ops::Fp8Policy* fp8 = nullptr;
};

class TransformerLayer {
 public:
  TransformerLayer() = default;
  // Registers prefix.input_layernorm, prefix.self_attention.*, prefix.pre_mlp_layernorm,
  // prefix.mlp.* (an Mlp, or a MoeLayer when c.moe) in this order. moe_index: the layer's index
  // among the rank's MoE layers.
  TransformerLayer(ParamBuilder& b, const std::string& prefix, const TransformerLayerConfig& c, size_t moe_index = 0);
  // x: [s(/tp), b, h] -> [s(/tp), b, h]; `layer`: the index into the attention cache/chunk slots.
  at::Tensor forward(const at::Tensor& x, const AttentionInputs& in, const LayerContext& lc, size_t layer) const;
  bool is_moe() const { return c_.moe; }
  const MoeLayer& moe() const { return moe_; }
  // LoRA adapters on this layer's projections (drawn by the caller from the adapters' builder).
  void set_lora(LayerLora lora) { lora_ = std::move(lora); }
  // Whether LayerContext::fp8 applies to this layer (false: its GEMMs stay in the training dtype,
  // Megatron's --first-last-layers-bf16).
  void set_fp8(bool on) { fp8_ = on; }
  bool fp8() const { return fp8_; }
  const LayerLora& lora() const { return lora_; }

 private:
  TransformerLayerConfig c_;
  Norm input_norm_, pre_mlp_norm_;
  SelfAttention attention_;
  MlaAttention mla_;
  Mlp mlp_;
  MoeLayer moe_;
  size_t moe_index_ = 0;
  LayerLora lora_;
  bool fp8_ = true;
};

// Hidden dropout with the stream the activation's layout calls for: replicated activations draw
// the same mask on every TP rank, sequence-parallel chunks different ones.
at::Tensor hidden_dropout(const at::Tensor& x, double p, const LayerContext& lc);

// layers[lo, hi) over x with the recomputation policy of lc (full recomputation only without a
// cache or ChunkPipe; `lo` is where the policy's counting starts: a model chunk's first layer).
// `layers` must view the model's own layers, never a temporary copy: recomputation runs them
// again in backward, after this call has returned.
at::Tensor run_layers(std::span<const TransformerLayer> layers, size_t lo, size_t hi, at::Tensor x,
                      const AttentionInputs& in, const LayerContext& lc);

}  // namespace lf::models

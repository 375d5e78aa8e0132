// The `feature_transformer` foundation: a transformer over sequences of float feature vectors
// (an input projection, pre-norm layers with bidirectional attention and optional 1D RoPE, a
// final norm): the skeleton of a diffusion transformer (patch latents in, noise prediction out)
// and of a ViT. Shares its blocks with the decoder. Tensor-parallel through parallel/tensor; one
// pipeline stage.
#pragma once

#include <ATen/core/Tensor.h>

#include "loongforge/backend/device_backend.h"
#include "loongforge/core/config/node.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/models/blocks/embeddings.h"
#include "loongforge/models/blocks/transformer_layer.h"
#include "loongforge/parallel/tensor/random.h"

namespace lf::models {

struct FeatureTransformerConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;  // 0: num_attention_heads
  int64_t input_size = 0;
  int64_t max_position_embeddings = 0;
  std::string normalization = "RMSNorm";
  double norm_epsilon = 1e-5;
  bool swiglu = true;
  std::string position_embedding_type = "rope";
  double rotary_base = 10000;
  bool add_bias_linear = false;
  double init_method_std = 0.02;
  double hidden_dropout = 0.0;

  template <class V>
  void visit(V& v) {
    using namespace lf::config;
    v("num_layers", num_layers, "Transformer layers", Required{}, Min{1});
    v("hidden_size", hidden_size, "Hidden size", Required{}, Min{1});
    v("ffn_hidden_size", ffn_hidden_size, "MLP hidden size", Required{}, Min{1});
    v("num_attention_heads", num_attention_heads, "Attention heads", Required{}, Min{1});
    v("num_query_groups", num_query_groups, "Key/value heads (GQA); 0: num_attention_heads", Min{0});
    v("input_size", input_size, "Width of the input feature vectors", Required{}, Min{1});
    v("max_position_embeddings", max_position_embeddings, "Longest sequence", Required{}, Min{1});
    v("normalization", normalization, "Norm layer", OneOf{{"RMSNorm", "LayerNorm"}});
    v("norm_epsilon", norm_epsilon, "Epsilon of the norm layers", Min{0});
    v("swiglu", swiglu, "SwiGLU MLP (false: GELU)");
    v("position_embedding_type", position_embedding_type, "rope (1D) or none", OneOf{{"rope", "none"}});
    v("rotary_base", rotary_base, "RoPE base (theta)", Min{1});
    v("add_bias_linear", add_bias_linear, "Biases in the linear layers");
    v("init_method_std", init_method_std, "Std of the normal initialisation", Min{0});
    v("hidden_dropout", hidden_dropout, "Dropout after attention and MLP (training mode only)", Min{0}, Max{1});
  }
  int64_t query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t num_parameters() const;
  void validate(const lf::config::Node& tree, const std::string& prefix, lf::config::ErrorList& errors) const;
};

class FeatureTransformer {
 public:
  // Registers input_layer.{weight,bias}, transformer.layers.<i>.*, transformer.final_layernorm.*
  // in `b`. seed/tp_rank: the dropout streams.
  FeatureTransformer(const FeatureTransformerConfig& c, const lf::backend::DeviceBackend& backend, ParamBuilder& b,
                     uint64_t seed, int tp_rank);
  // inputs: [b, s, input_size] -> [s, b, h] (final-normed).
  at::Tensor forward(const at::Tensor& inputs) const;

  void set_training(bool t) { training_ = t; }
  void set_recompute(const RecomputeOptions& r) { recompute_ = r; }
  lf::parallel::RngTracker& rng() const { return rng_; }
  const FeatureTransformerConfig& config() const { return c_; }

 private:
  FeatureTransformerConfig c_;
  const lf::backend::DeviceBackend& backend_;
  lf::parallel::TensorParallel tp_;
  ReplicatedLinear input_;
  std::vector<TransformerLayer> layers_;
  Norm final_norm_;
  bool training_ = true;
  RecomputeOptions recompute_;
  mutable lf::parallel::RngTracker rng_;
};

}  // namespace lf::models

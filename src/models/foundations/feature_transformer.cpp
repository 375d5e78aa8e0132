#include "loongforge/models/foundations/feature_transformer.h"

#include <cmath>
#include <tuple>

#include "loongforge/core/config/config_error.h"
#include "loongforge/core/error.h"
#include "loongforge/models/blocks/rope.h"

namespace lf::models {

int64_t FeatureTransformerConfig::num_parameters() const {
  const int64_t h = hidden_size, d = head_dim(), nq = num_attention_heads, nkv = query_groups(), f = ffn_hidden_size;
  const int64_t mlp_in = swiglu ? 2 * f : f, norm = normalization == "LayerNorm" ? 2 * h : h;
  int64_t per_layer = (nq + 2 * nkv) * d * h + h * nq * d + mlp_in * h + h * f + 2 * norm;
  if (add_bias_linear) per_layer += (nq + 2 * nkv) * d + h + mlp_in + h;
  return input_size * h + h + num_layers * per_layer + norm;
}

void FeatureTransformerConfig::validate(const lf::config::Node& tree, const std::string& prefix,
                                        lf::config::ErrorList& errors) const {
  auto origin = [&](const char* k) {
    const auto* n = tree.find(k);
    return n ? n->origin() : lf::config::Origin::from_default();
  };
  if (hidden_size % num_attention_heads != 0)
    errors.add(prefix + ".num_attention_heads", origin("num_attention_heads"),
               "num_attention_heads " + std::to_string(num_attention_heads) + " does not divide hidden_size " +
                   std::to_string(hidden_size));
  else if (position_embedding_type == "rope" && head_dim() % 2 != 0)
    errors.add(prefix + ".num_attention_heads", origin("num_attention_heads"),
               "RoPE needs an even head dimension, got " + std::to_string(head_dim()));
  if (num_attention_heads % query_groups() != 0)
    errors.add(prefix + ".num_query_groups", origin("num_query_groups"),
               "num_query_groups " + std::to_string(query_groups()) + " does not divide num_attention_heads " +
                   std::to_string(num_attention_heads));
  if (hidden_dropout >= 1.0)
    errors.add(prefix + ".hidden_dropout", origin("hidden_dropout"), "hidden_dropout must be below 1");
}

FeatureTransformer::FeatureTransformer(const FeatureTransformerConfig& c, const lf::backend::DeviceBackend& backend,
                                       ParamBuilder& b, uint64_t seed, int tp_rank)
    : c_(c), backend_(backend), tp_(b.tp()), rng_(seed, tp_rank, 0) {
  const int64_t tp = tp_.size();
  LF_CHECK(c.num_attention_heads % tp == 0 && c.query_groups() % tp == 0 && c.ffn_hidden_size % tp == 0,
           "feature_transformer: heads ", c.num_attention_heads, ", query groups ", c.query_groups(), " and ffn_hidden_size ",
           c.ffn_hidden_size, " must be divisible by the tensor-parallel size ", tp);
  const double std = c.init_method_std, out_std = std / std::sqrt(2.0 * c.num_layers);
  TransformerLayerConfig lc;
  lc.norm = {c.normalization == "LayerNorm", c.norm_epsilon};
  lc.attention = {c.hidden_size, c.num_attention_heads, c.query_groups(), c.head_dim(), c.add_bias_linear,
                  c.add_bias_linear, false, c.norm_epsilon, std, out_std};
  lc.mlp = {c.hidden_size, c.ffn_hidden_size, c.swiglu, c.add_bias_linear, std, out_std};
  lc.hidden_dropout = c.hidden_dropout;
  input_ = ReplicatedLinear(b, "input_layer", c.input_size, c.hidden_size, std, true);
  for (int64_t i = 0; i < c.num_layers; ++i) layers_.emplace_back(b, "transformer.layers." + std::to_string(i), lc);
  final_norm_ = Norm(b, "transformer.final_layernorm", c.hidden_size, lc.norm);
}

at::Tensor FeatureTransformer::forward(const at::Tensor& inputs) const {
  LF_CHECK(inputs.dim() == 3 && inputs.size(2) == c_.input_size, "feature_transformer: inputs must be [b, s, ",
           c_.input_size, "], got ", inputs.sizes());
  const int64_t s = inputs.size(1);
  LF_CHECK(s <= c_.max_position_embeddings, "sequence length ", s, " exceeds max_position_embeddings ",
           c_.max_position_embeddings);
  at::Tensor x = input_.forward(inputs.transpose(0, 1).contiguous());  // [s, b, h]
  AttentionInputs a;
  a.mask = lf::backend::AttentionMask::none();  // bidirectional
  if (c_.position_embedding_type == "rope")
    std::tie(a.cos, a.sin) = rope_tables(RopeSpec{c_.head_dim(), c_.rotary_base}, 0, s,
                                         at::TensorOptions().dtype(at::kFloat).device(backend_.device()));
  LayerContext lc{&backend_, &tp_, &rng_, training_, recompute_};
  x = run_layers(layers_, 0, layers_.size(), x, a, lc);
  return final_norm_(backend_, x);
}

}  // namespace lf::models

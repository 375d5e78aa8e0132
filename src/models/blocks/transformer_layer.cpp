#include "loongforge/models/blocks/transformer_layer.h"

#include <ATen/TensorOperators.h>

#include <algorithm>

#include "loongforge/models/recompute.h"

namespace lf::models {

TransformerLayer::TransformerLayer(ParamBuilder& b, const std::string& prefix, const TransformerLayerConfig& c,
                                   size_t moe_index)
    : c_(c), moe_index_(moe_index) {
  const int64_t h = c.attention.hidden_size;
  input_norm_ = Norm(b, prefix + ".input_layernorm", h, c.norm);
  if (c.mla)
    mla_ = MlaAttention(b, prefix + ".self_attention", c.mla_config);
  else
    attention_ = SelfAttention(b, prefix + ".self_attention", c.attention);
  pre_mlp_norm_ = Norm(b, prefix + ".pre_mlp_layernorm", h, c.norm);
  if (c.moe)
    moe_ = MoeLayer(b, prefix + ".mlp", c.moe_config);
  else
    mlp_ = Mlp(b, prefix + ".mlp", c.mlp);
}

at::Tensor hidden_dropout(const at::Tensor& x, double p, const LayerContext& lc) {
  if (!lc.training || p == 0.0) return x;
  const bool split = lc.tp->sequence_parallel && lc.tp->size() > 1;
  return lf::parallel::dropout(x, p, lc.rng->get(split ? lf::parallel::RngTracker::kModelParallel
                                                       : lf::parallel::RngTracker::kDefault));
}

at::Tensor TransformerLayer::forward(const at::Tensor& x, const AttentionInputs& in, const LayerContext& lc,
                                     size_t layer) const {
  const auto& be = *lc.backend;
  AttentionInputs a = in;
  a.selective_recompute = lc.recompute.granularity == RecomputeOptions::Granularity::selective;
  LoraInputs lora{&lora_, lc.rng, lc.training};
  const LoraInputs* lp = lora_.any() ? &lora : nullptr;
  const lf::ops::Fp8Policy* fp8 = fp8_ ? lc.fp8 : nullptr;
  // The dense blocks take the un-normed input and their norm, to fuse it into their first linear.
  auto attn = c_.mla ? mla_.forward(be, *lc.tp, input_norm_(be, x), a, layer, lc.moe, lc.training, fp8)
                     : attention_.forward(be, *lc.tp, x, a, layer, lp, lc.slots, &input_norm_, fp8);
  auto y = x + hidden_dropout(attn, c_.hidden_dropout, lc);
  auto mlp = c_.moe ? moe_.forward(be, *lc.tp, pre_mlp_norm_(be, y), lc.training, a.selective_recompute, lc.moe,
                                   moe_index_, lc.moe_layers, a.cp, fp8)
                    : mlp_.forward(be, *lc.tp, y, a.selective_recompute, lp, lc.slots, &pre_mlp_norm_, fp8);
  return y + hidden_dropout(mlp, c_.hidden_dropout, lc);
}

at::Tensor run_layers(std::span<const TransformerLayer> layers, size_t lo, size_t hi, at::Tensor x,
                      const AttentionInputs& in, const LayerContext& lc) {
  using R = RecomputeOptions;
  const size_t n = std::min(hi, layers.size());
  const bool full = lc.recompute.granularity == R::Granularity::full && !in.cache && !in.chunk;
  // i - lo: the layer's index within its model chunk (block: the first num_layers of each chunk).
  auto recomputed = [&](size_t i) {
    if (!full) return false;
    if (lc.recompute.method == R::Method::block) return static_cast<int64_t>(i - lo) < lc.recompute.num_layers;
    return true;  // uniform: every layer, in groups of num_layers
  };
  for (size_t i = lo; i < n;) {
    if (recomputed(i)) {
      // uniform: num_layers consecutive layers per checkpoint; block: one layer each, first N.
      const size_t group = lc.recompute.method == R::Method::uniform
                               ? std::min(n - i, static_cast<size_t>(lc.recompute.num_layers))
                               : 1;
      std::vector<at::Tensor> inputs{x};
      AttentionInputs plain = in;
      plain.cache = nullptr;
      plain.chunk = nullptr;
      x = lf::models::recompute(
          // By value: the span views the model's layers, which outlive the backward pass.
          [layers, i, group, plain, lc](const std::vector<at::Tensor>& t) {
            at::Tensor y = t[0];
            for (size_t j = i; j < i + group; ++j) y = layers[j].forward(y, plain, lc, j);
            return y;
          },
          inputs, lc.rng, lc.moe ? lc.moe->streams() : nullptr);
      i += group;
    } else {
      x = layers[i].forward(x, in, lc, i);
      ++i;
    }
  }
  return x;
}

}  // namespace lf::models

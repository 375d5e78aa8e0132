#include "loongforge/models/decoder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>

#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"

namespace lf::models {
namespace {
at::Tensor normal(at::Generator& gen, std::vector<int64_t> shape, double std) {
  return at::normal(0.0, std, shape, gen, at::kFloat);
}
}  // namespace

std::pair<at::Tensor, at::Tensor> rope_tables(int64_t seq, int64_t head_dim, double base,
                                              const at::TensorOptions& options) {
  // inv_freq[i] = base^(-2i/d); angle[p, i] = p * inv_freq[i]; both halves share the angles.
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto inv_freq = at::pow(base, -at::arange(0, head_dim, 2, f64) / static_cast<double>(head_dim));
  auto angles = at::outer(at::arange(seq, f64), inv_freq);  // [s, d/2]
  auto emb = at::cat({angles, angles}, -1);                  // [s, d]
  return {at::cos(emb).to(options), at::sin(emb).to(options)};
}

at::Tensor Decoder::add(std::string name, at::Tensor t, bool no_decay) {
  t = t.to(backend_.device()).set_requires_grad(true);
  params_.push_back({std::move(name), t, no_decay});
  return t;
}

Decoder::Decoder(const DecoderConfig& c, const lf::backend::DeviceBackend& backend, uint64_t seed,
                 at::ScalarType dtype)
    : config_(c), backend_(backend) {
  LF_CHECK(c.swiglu, "the decoder supports the SwiGLU MLP only for now (model swiglu: false)",
           lf::hint("set swiglu: true"));
  LF_CHECK(c.normalization == "RMSNorm", "the decoder supports RMSNorm only for now, got ",
           c.normalization, lf::hint("set normalization: RMSNorm"));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t h = c.hidden_size, d = c.head_dim(), nq = c.num_attention_heads,
                nkv = c.query_groups(), f = c.ffn_hidden_size, v = c.padded_vocab_size();
  // Megatron's init: N(0, std) everywhere, output projections scaled by 1/sqrt(2 * layers).
  const double std = c.init_method_std, out_std = std / std::sqrt(2.0 * c.num_layers);
  auto cast = [&](at::Tensor t) { return t.to(dtype); };
  embedding_ = add("embedding.word_embeddings.weight", cast(normal(gen, {v, h}, std)), false);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    std::string p = "decoder.layers." + std::to_string(i) + ".";
    Layer l;
    l.input_norm = add(p + "input_layernorm.weight", cast(at::ones({h})), true);
    l.qkv = add(p + "self_attention.linear_qkv.weight", cast(normal(gen, {(nq + 2 * nkv) * d, h}, std)), false);
    l.proj = add(p + "self_attention.linear_proj.weight", cast(normal(gen, {h, nq * d}, out_std)), false);
    l.pre_mlp_norm = add(p + "pre_mlp_layernorm.weight", cast(at::ones({h})), true);
    l.fc1 = add(p + "mlp.linear_fc1.weight", cast(normal(gen, {2 * f, h}, std)), false);
    l.fc2 = add(p + "mlp.linear_fc2.weight", cast(normal(gen, {h, f}, out_std)), false);
    layers_.push_back(l);
  }
  final_norm_ = add("decoder.final_layernorm.weight", cast(at::ones({h})), true);
  if (c.untie_embeddings_and_output_weights)
    output_ = add("output_layer.weight", cast(normal(gen, {v, h}, std)), false);
}

at::Tensor Decoder::attention(const Layer& l, const at::Tensor& x, const at::Tensor& cos,
                              const at::Tensor& sin) const {
  const int64_t s = x.size(0), b = x.size(1), d = config_.head_dim(),
                nq = config_.num_attention_heads, nkv = config_.query_groups();
  auto qkv = at::linear(x, l.qkv);  // [s, b, (nq + 2 nkv) d]
  auto parts = qkv.split({nq * d, nkv * d, nkv * d}, -1);
  auto q = lf::ops::rope(backend_, parts[0].reshape({s, b, nq, d}), cos, sin);
  auto k = lf::ops::rope(backend_, parts[1].reshape({s, b, nkv, d}), cos, sin);
  auto v = parts[2].reshape({s, b, nkv, d});
  // [s, b, n, d] -> [b, n, s, d]
  auto o = lf::ops::sdpa(backend_, q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}),
                         v.permute({1, 2, 0, 3}), lf::backend::AttentionMask::causal());
  o = o.permute({2, 0, 1, 3}).reshape({s, b, nq * d});  // [s, b, nq d]
  return at::linear(o, l.proj);
}

at::Tensor Decoder::mlp(const Layer& l, const at::Tensor& x) const {
  return at::linear(lf::ops::swiglu(backend_, at::linear(x, l.fc1)), l.fc2);
}

at::Tensor Decoder::forward(const at::Tensor& tokens) const {
  LF_CHECK(tokens.dim() == 2, "tokens must be [batch, seq], got ", tokens.sizes());
  const int64_t s = tokens.size(1);
  LF_CHECK(s <= config_.max_position_embeddings, "sequence length ", s,
           " exceeds max_position_embeddings ", config_.max_position_embeddings,
           lf::hint("raise model max_position_embeddings or lower --seq-length"));
  auto [cos, sin] = rope_tables(s, config_.head_dim(), config_.rotary_base,
                                at::TensorOptions().dtype(at::kFloat).device(backend_.device()));
  auto x = at::embedding(embedding_, tokens.t().contiguous());  // [s, b, h]
  const double eps = config_.norm_epsilon;
  for (const auto& l : layers_) {
    x = x + attention(l, lf::ops::rms_norm(backend_, x, l.input_norm, eps), cos, sin);
    x = x + mlp(l, lf::ops::rms_norm(backend_, x, l.pre_mlp_norm, eps));
  }
  x = lf::ops::rms_norm(backend_, x, final_norm_, eps);
  return at::linear(x, output_.defined() ? output_ : embedding_);  // [s, b, v]
}

at::Tensor Decoder::loss(const at::Tensor& tokens, const at::Tensor& labels) const {
  auto logits = forward(tokens);  // [s, b, v]
  auto target = labels.t().reshape({-1}).to(backend_.device());  // [s b]
  return lf::ops::softmax_cross_entropy(backend_, logits.reshape({-1, logits.size(-1)}), target,
                                        /*ignore_index=*/-100);
}

}  // namespace lf::models

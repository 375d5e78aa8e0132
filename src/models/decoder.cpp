#include "loongforge/models/decoder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>

#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/parallel/tensor/cross_entropy.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {
namespace {
at::Tensor normal(at::Generator& gen, std::vector<int64_t> shape, double std) {
  return at::normal(0.0, std, shape, gen, at::kFloat);
}
// The vocabulary rows are drawn for the real vocabulary only and padded with zeros, so the draw
// (and every tensor drawn after it) does not depend on the padding, which depends on tp.
at::Tensor vocab_table(at::Generator& gen, int64_t vocab, int64_t padded, int64_t h, double std) {
  auto t = normal(gen, {vocab, h}, std);
  return padded == vocab ? t : at::cat({t, at::zeros({padded - vocab, h})}, 0);
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

at::Tensor Decoder::add(std::string name, const at::Tensor& full, at::ScalarType dtype,
                        bool no_decay, int64_t partition_dim, int64_t blocks) {
  const int tp = tp_.size(), r = tp_.rank();
  at::Tensor t = full;
  if (tp > 1 && partition_dim >= 0)
    t = blocks > 1 ? lf::parallel::shard_stacked(full, blocks, r, tp)
                   : lf::parallel::shard_along(full, partition_dim, r, tp);
  t = t.to(dtype).to(backend_.device()).set_requires_grad(true);
  NamedParameter p;
  p.name = std::move(name);
  p.tensor = t;
  p.no_weight_decay = no_decay;
  p.partition_dim = tp > 1 ? partition_dim : -1;
  p.partition_blocks = tp > 1 && partition_dim >= 0 ? blocks : 1;
  // Norm weights act on sequence-split activations; everything replicated here is a norm.
  p.sequence_parallel = tp > 1 && tp_.sequence_parallel && partition_dim < 0;
  params_.push_back(std::move(p));
  return t;
}

Decoder::Decoder(const DecoderConfig& c, const lf::backend::DeviceBackend& backend, uint64_t seed,
                 at::ScalarType dtype, const lf::dist::ParallelContext* parallel,
                 bool sequence_parallel)
    : config_(c), backend_(backend) {
  LF_CHECK(c.swiglu, "the decoder supports the SwiGLU MLP only for now (model swiglu: false)",
           lf::hint("set swiglu: true"));
  LF_CHECK(c.normalization == "RMSNorm", "the decoder supports RMSNorm only for now, got ",
           c.normalization, lf::hint("set normalization: RMSNorm"));
  LF_CHECK(c.hidden_dropout == 0.0 && c.attention_dropout == 0.0,
           "the decoder has no dropout yet (hidden_dropout ", c.hidden_dropout,
           ", attention_dropout ", c.attention_dropout, ")",
           lf::hint("set both to 0; parallel/tensor/random.h has the TP-aware RNG streams"));
  const int64_t h = c.hidden_size, d = c.head_dim(), nq = c.num_attention_heads,
                nkv = c.query_groups(), f = c.ffn_hidden_size;
  if (parallel && parallel->tp_size() > 1) {
    const int64_t tp = parallel->tp_size();
    LF_CHECK(nq % tp == 0 && nkv % tp == 0, "num_attention_heads ", nq, " and num_query_groups ",
             nkv, " must both be divisible by the tensor-model-parallel size ", tp,
             lf::hint("each TP rank owns whole query groups; pick a TP size dividing both"));
    LF_CHECK(f % tp == 0, "ffn_hidden_size ", f, " is not divisible by the tensor-model-parallel size ",
             tp, lf::hint("pick an ffn_hidden_size that is a multiple of the TP size"));
    tp_.tp = &parallel->tp();
    tp_.sequence_parallel = sequence_parallel;
  }
  const int64_t v = c.padded_vocab_size(tp_.size());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  // Megatron's init: N(0, std) everywhere, output projections scaled by 1/sqrt(2 * layers).
  // Every rank draws the full tensors in the same order and keeps its shard.
  const double std = c.init_method_std, out_std = std / std::sqrt(2.0 * c.num_layers);
  embedding_ = add("embedding.word_embeddings.weight", vocab_table(gen, c.vocab_size, v, h, std),
                   dtype, false, 0);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    std::string p = "decoder.layers." + std::to_string(i) + ".";
    Layer l;
    l.input_norm = add(p + "input_layernorm.weight", at::ones({h}), dtype, true);
    l.qkv = add(p + "self_attention.linear_qkv.weight", normal(gen, {(nq + 2 * nkv) * d, h}, std),
                dtype, false, 0);
    l.proj = add(p + "self_attention.linear_proj.weight", normal(gen, {h, nq * d}, out_std), dtype,
                 false, 1);
    l.pre_mlp_norm = add(p + "pre_mlp_layernorm.weight", at::ones({h}), dtype, true);
    l.fc1 = add(p + "mlp.linear_fc1.weight", normal(gen, {2 * f, h}, std), dtype, false, 0, 2);
    l.fc2 = add(p + "mlp.linear_fc2.weight", normal(gen, {h, f}, out_std), dtype, false, 1);
    layers_.push_back(l);
  }
  final_norm_ = add("decoder.final_layernorm.weight", at::ones({h}), dtype, true);
  if (c.untie_embeddings_and_output_weights)
    output_ = add("output_layer.weight", vocab_table(gen, c.vocab_size, v, h, std), dtype, false, 0);
}

at::Tensor Decoder::attention(const Layer& l, const at::Tensor& x, const at::Tensor& cos,
                              const at::Tensor& sin) const {
  const int64_t d = config_.head_dim(), tp = tp_.size(), groups = config_.query_groups() / tp,
                per_group = config_.num_attention_heads / config_.query_groups(),
                nq = groups * per_group;  // this rank's heads
  auto qkv = lf::parallel::column_parallel_linear(x, l.qkv, {}, tp_);  // [s, b, groups (pg+2) d]
  const int64_t s = qkv.size(0), b = qkv.size(1);
  qkv = qkv.view({s, b, groups, per_group + 2, d});
  auto q = lf::ops::rope(backend_, qkv.narrow(3, 0, per_group).reshape({s, b, nq, d}), cos, sin);
  auto k = lf::ops::rope(backend_, qkv.select(3, per_group).contiguous(), cos, sin);
  auto v = qkv.select(3, per_group + 1);
  // [s, b, n, d] -> [b, n, s, d]
  auto o = lf::ops::sdpa(backend_, q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}),
                         v.permute({1, 2, 0, 3}), lf::backend::AttentionMask::causal());
  o = o.permute({2, 0, 1, 3}).reshape({s, b, nq * d});  // [s, b, nq d]
  return lf::parallel::row_parallel_linear(o, l.proj, {}, tp_);
}

at::Tensor Decoder::mlp(const Layer& l, const at::Tensor& x) const {
  auto gate_up = lf::parallel::column_parallel_linear(x, l.fc1, {}, tp_);  // [s, b, 2 f / tp]
  return lf::parallel::row_parallel_linear(lf::ops::swiglu(backend_, gate_up), l.fc2, {}, tp_);
}

at::Tensor Decoder::local_logits(const at::Tensor& tokens) const {
  LF_CHECK(tokens.dim() == 2, "tokens must be [batch, seq], got ", tokens.sizes());
  const int64_t s = tokens.size(1);
  LF_CHECK(s <= config_.max_position_embeddings, "sequence length ", s,
           " exceeds max_position_embeddings ", config_.max_position_embeddings,
           lf::hint("raise model max_position_embeddings or lower --seq-length"));
  LF_CHECK(!tp_.sequence_parallel || s % tp_.size() == 0, "sequence parallelism: sequence length ",
           s, " is not divisible by the tensor-model-parallel size ", tp_.size(),
           lf::hint("pick --seq-length as a multiple of the TP size"));
  auto [cos, sin] = rope_tables(s, config_.head_dim(), config_.rotary_base,
                                at::TensorOptions().dtype(at::kFloat).device(backend_.device()));
  // [s(/tp), b, h]: the sequence chunk under SP.
  auto x = lf::parallel::vocab_parallel_embedding(tokens.t().contiguous(), embedding_, tp_);
  const double eps = config_.norm_epsilon;
  for (const auto& l : layers_) {
    x = x + attention(l, lf::ops::rms_norm(backend_, x, l.input_norm, eps), cos, sin);
    x = x + mlp(l, lf::ops::rms_norm(backend_, x, l.pre_mlp_norm, eps));
  }
  x = lf::ops::rms_norm(backend_, x, final_norm_, eps);
  return lf::parallel::column_parallel_linear(x, output_.defined() ? output_ : embedding_, {}, tp_);
}

at::Tensor Decoder::forward(const at::Tensor& tokens) const {
  auto logits = local_logits(tokens);  // [s, b, v_pad / tp]
  if (tp_.size() > 1) logits = lf::parallel::gather_from_tp(logits, *tp_.tp);
  return logits.narrow(-1, 0, config_.vocab_size);  // [s, b, vocab]
}

at::Tensor Decoder::loss(const at::Tensor& tokens, const at::Tensor& labels) const {
  auto logits = local_logits(tokens);                             // [s, b, v_pad / tp]
  auto target = labels.t().reshape({-1}).to(backend_.device());  // [s b]
  auto flat = logits.reshape({-1, logits.size(-1)});
  if (tp_.size() > 1)
    return lf::parallel::vocab_parallel_cross_entropy(flat, target, *tp_.tp, config_.vocab_size,
                                                      /*ignore_index=*/-100);
  // Padding columns take no probability mass (as in the vocab-parallel path).
  const int64_t vocab = config_.vocab_size;
  auto real = flat.size(1) == vocab ? flat : flat.narrow(1, 0, vocab).contiguous();
  return lf::ops::softmax_cross_entropy(backend_, real, target, /*ignore_index=*/-100);
}

}  // namespace lf::models

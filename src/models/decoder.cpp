#include "loongforge/models/decoder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/recompute.h"
#include "loongforge/parallel/pipeline/stages.h"
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

RopeSpec rope_spec(const DecoderConfig& c) {
  RopeSpec r;
  r.head_dim = c.head_dim();
  r.base = c.rotary_base;
  r.llama3_scaling = c.rope_scaling;
  r.factor = c.rope_scaling_factor;
  r.low_freq_factor = c.rope_scaling_low_freq_factor;
  r.high_freq_factor = c.rope_scaling_high_freq_factor;
  r.original_max_position = c.rope_scaling_original_max_position_embeddings;
  return r;
}

std::pair<at::Tensor, at::Tensor> rope_tables(const RopeSpec& spec, int64_t start, int64_t seq,
                                              const at::TensorOptions& options) {
  // inv_freq[i] = base^(-2i/d); angle[p, i] = p * inv_freq[i]; both halves share the angles.
  const int64_t d = spec.head_dim;
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto inv_freq = at::pow(spec.base, -at::arange(0, d, 2, f64) / static_cast<double>(d));
  if (spec.llama3_scaling) {
    // Llama 3.1: long wavelengths slowed down by `factor`, short ones kept, a linear blend in
    // between (in wavelength-to-context ratio).
    const double old = static_cast<double>(spec.original_max_position);
    const double low_wavelen = old / spec.low_freq_factor, high_wavelen = old / spec.high_freq_factor;
    auto wavelen = 2 * M_PI / inv_freq;
    auto scaled = at::where(wavelen > low_wavelen, inv_freq / spec.factor, inv_freq);
    auto smooth = (old / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor);
    auto blended = (1 - smooth) * scaled / spec.factor + smooth * scaled;
    auto medium = at::logical_and(wavelen >= high_wavelen, wavelen <= low_wavelen);
    inv_freq = at::where(medium, blended, scaled);
  }
  auto angles = at::outer(at::arange(start, start + seq, f64), inv_freq);  // [s, d/2]
  auto emb = at::cat({angles, angles}, -1);                                // [s, d]
  return {at::cos(emb).to(options), at::sin(emb).to(options)};
}

PipelineStage pipeline_stage(const DecoderConfig& config, int pp, int pp_rank,
                             std::optional<int64_t> first_stage_layers,
                             std::optional<int64_t> last_stage_layers,
                             std::optional<int64_t> layers_per_virtual_stage,
                             const std::optional<std::string>& layout) {
  LF_CHECK(pp_rank >= 0 && pp_rank < pp, "pipeline rank ", pp_rank, " is outside [0, ", pp, ")");
  PipelineStage stage;
  stage.first = pp_rank == 0;
  stage.last = pp_rank == pp - 1;
  if (layout) {
    LF_CHECK(!first_stage_layers && !last_stage_layers && !layers_per_virtual_stage,
             "parallel.pipeline_model_parallel_layout cannot be combined with "
             "parallel.decoder_first/last_pipeline_num_layers or num_layers_per_virtual_pipeline_stage",
             lf::hint("the layout string says everything: drop the other split flags"));
    stage.chunks = lf::parallel::pipeline::split_by_layout(*layout, config.num_layers, pp)[static_cast<size_t>(pp_rank)];
  } else if (layers_per_virtual_stage) {
    LF_CHECK(!first_stage_layers && !last_stage_layers,
             "parallel.num_layers_per_virtual_pipeline_stage cannot be combined with "
             "parallel.decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers",
             lf::hint("use either virtual stages (interleaved schedule) or an uneven split"));
    stage.chunks = lf::parallel::pipeline::split_virtual_layers(config.num_layers, pp,
                                                                *layers_per_virtual_stage)[static_cast<size_t>(pp_rank)];
  } else {
    stage.chunks = {lf::parallel::pipeline::split_layers(config.num_layers, pp, first_stage_layers,
                                                         last_stage_layers)[static_cast<size_t>(pp_rank)]};
  }
  return stage;
}

at::Tensor Decoder::add(std::string name, const at::Tensor& full, at::ScalarType dtype,
                        bool no_decay, int64_t partition_dim, int64_t blocks) {
  if (!keep_) return {};  // another pipeline stage's tensor: drawn, not kept
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
  // Replicated parameters that see only part of the data on each TP rank need their gradient
  // summed over TP: with SP every replicated one (norms and the row-parallel biases act on
  // sequence chunks); the per-head QK norms always (each rank holds different heads).
  const bool qk_norm = p.name.find("_layernorm.weight") != std::string::npos &&
                       (p.name.find(".q_layernorm.") != std::string::npos ||
                        p.name.find(".k_layernorm.") != std::string::npos);
  p.sequence_parallel = tp > 1 && partition_dim < 0 && (tp_.sequence_parallel || qk_norm);
  params_.push_back(std::move(p));
  return t;
}

Decoder::Decoder(const DecoderConfig& c, const lf::backend::DeviceBackend& backend, uint64_t seed,
                 at::ScalarType dtype, const lf::dist::ParallelContext* parallel,
                 bool sequence_parallel)
    : Decoder(c, backend, seed, dtype, parallel, sequence_parallel, PipelineStage{}) {}

Decoder::Decoder(const DecoderConfig& c, const lf::backend::DeviceBackend& backend, uint64_t seed,
                 at::ScalarType dtype, const lf::dist::ParallelContext* parallel,
                 bool sequence_parallel, const PipelineStage& stage)
    : config_(c), backend_(backend), stage_(stage) {
  if (stage_.chunks.empty()) stage_.chunks = {{0, c.num_layers}};
  {
    bool ok = stage_.chunks.front().begin >= 0 && stage_.chunks.back().end <= c.num_layers &&
              (!stage_.first || stage_.chunks.front().begin == 0) &&
              (!stage_.last || stage_.chunks.back().end == c.num_layers);
    for (size_t k = 0; k < stage_.chunks.size(); ++k)
      ok = ok && stage_.chunks[k].begin <= stage_.chunks[k].end &&
           (k == 0 || stage_.chunks[k - 1].end <= stage_.chunks[k].begin);
    LF_CHECK(ok, "pipeline stage ", describe_stage(), " (first ", stage_.first, ", last ", stage_.last,
             ") does not fit a model of ", c.num_layers, " layers",
             lf::hint("build stages with lf::models::pipeline_stage()"));
  }
  LF_CHECK(c.normalization == "RMSNorm" || c.normalization == "LayerNorm",
           "normalization must be RMSNorm or LayerNorm, got ", c.normalization);
  LF_CHECK(c.attention_dropout == 0.0, "attention_dropout ", c.attention_dropout,
           " is not supported (the fused attention op has no dropout)",
           lf::hint("set attention_dropout: 0; hidden_dropout is supported"));
  LF_CHECK(c.hidden_dropout >= 0.0 && c.hidden_dropout < 1.0, "hidden_dropout must be in [0, 1), got ",
           c.hidden_dropout);
  const int64_t h = c.hidden_size, d = c.head_dim(), nq = c.num_attention_heads,
                nkv = c.query_groups(), f = c.ffn_hidden_size;
  int tp_rank = 0, pp_rank = 0;
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
  if (parallel) {
    tp_rank = parallel->tp_rank();
    pp_rank = parallel->pp_rank();
  }
  // Dropout streams from the same seed (Megatron: --seed drives both init and dropout).
  rng_ = lf::parallel::RngTracker(seed, tp_rank, pp_rank);
  const bool layer_norm = c.normalization == "LayerNorm";
  const int64_t v = c.padded_vocab_size(tp_.size());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  // Megatron's init: N(0, std) for weights, zeros for biases, ones for norms; output
  // projections scaled by 1/sqrt(2 * layers). Every rank draws the full tensors in the same
  // order and keeps its shard.
  const double std = c.init_method_std, out_std = std / std::sqrt(2.0 * c.num_layers);
  const at::Tensor embedding_full = vocab_table(gen, c.vocab_size, v, h, std);
  keep_ = stage_.first;
  embedding_ = add("embedding.word_embeddings.weight", embedding_full, dtype, false, 0);
  const int64_t mlp_in = c.swiglu ? 2 * f : f, mlp_blocks = c.swiglu ? 2 : 1;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    std::string p = "decoder.layers." + std::to_string(i) + ".";
    keep_ = false;
    for (const auto& r : stage_.chunks) keep_ = keep_ || (i >= r.begin && i < r.end);
    Layer l;
    l.input_norm = add(p + "input_layernorm.weight", at::ones({h}), dtype, true);
    if (layer_norm) l.input_norm_bias = add(p + "input_layernorm.bias", at::zeros({h}), dtype, true);
    l.qkv = add(p + "self_attention.linear_qkv.weight", normal(gen, {(nq + 2 * nkv) * d, h}, std),
                dtype, false, 0);
    if (c.add_qkv_bias || c.add_bias_linear)
      l.qkv_bias = add(p + "self_attention.linear_qkv.bias", at::zeros({(nq + 2 * nkv) * d}), dtype,
                       true, 0);
    if (c.qk_layernorm) {
      l.q_norm = add(p + "self_attention.q_layernorm.weight", at::ones({d}), dtype, true);
      l.k_norm = add(p + "self_attention.k_layernorm.weight", at::ones({d}), dtype, true);
    }
    l.proj = add(p + "self_attention.linear_proj.weight", normal(gen, {h, nq * d}, out_std), dtype,
                 false, 1);
    if (c.add_bias_linear) l.proj_bias = add(p + "self_attention.linear_proj.bias", at::zeros({h}), dtype, true);
    l.pre_mlp_norm = add(p + "pre_mlp_layernorm.weight", at::ones({h}), dtype, true);
    if (layer_norm) l.pre_mlp_norm_bias = add(p + "pre_mlp_layernorm.bias", at::zeros({h}), dtype, true);
    l.fc1 = add(p + "mlp.linear_fc1.weight", normal(gen, {mlp_in, h}, std), dtype, false, 0, mlp_blocks);
    if (c.add_bias_linear)
      l.fc1_bias = add(p + "mlp.linear_fc1.bias", at::zeros({mlp_in}), dtype, true, 0, mlp_blocks);
    l.fc2 = add(p + "mlp.linear_fc2.weight", normal(gen, {h, f}, out_std), dtype, false, 1);
    if (c.add_bias_linear) l.fc2_bias = add(p + "mlp.linear_fc2.bias", at::zeros({h}), dtype, true);
    if (keep_) layers_.push_back(std::move(l));
  }
  keep_ = stage_.last;
  final_norm_ = add("decoder.final_layernorm.weight", at::ones({h}), dtype, true);
  if (layer_norm) final_norm_bias_ = add("decoder.final_layernorm.bias", at::zeros({h}), dtype, true);
  if (c.untie_embeddings_and_output_weights)
    output_ = add("output_layer.weight", vocab_table(gen, c.vocab_size, v, h, std), dtype, false, 0);
  else if (stage_.last && !stage_.first) {
    // Tied embeddings over several stages: the last stage's output layer starts as a copy of the
    // embedding and stays one because their gradients are summed over the embedding group.
    output_ = add("embedding.word_embeddings.weight", embedding_full, dtype, false, 0);
    params_.back().tied_copy = true;
  }
  keep_ = true;
}

std::string Decoder::describe_stage() const {
  std::string out = "layers ";
  for (size_t k = 0; k < stage_.chunks.size(); ++k)
    out += (k ? " + [" : "[") + std::to_string(stage_.chunks[k].begin) + ", " +
           std::to_string(stage_.chunks[k].end) + ")";
  return out;
}

std::pair<size_t, size_t> Decoder::chunk_layers(int64_t c) const {
  LF_CHECK(c >= 0 && c < stage_.num_chunks(), "model chunk ", c, " of a pipeline stage with ",
           stage_.num_chunks(), " chunk(s) (", describe_stage(), ")");
  size_t begin = 0;
  for (int64_t k = 0; k < c; ++k) begin += static_cast<size_t>(stage_.chunks[static_cast<size_t>(k)].size());
  return {begin, begin + static_cast<size_t>(stage_.chunks[static_cast<size_t>(c)].size())};
}

void Decoder::check_whole_model(const char* what) const {
  LF_CHECK(stage_.first && stage_.last && stage_.num_chunks() == 1, what,
           " needs the whole model; this decoder is a pipeline stage with ", describe_stage(),
           lf::hint("run a pipeline stage with stage_forward() under a pipeline schedule"));
}

void Decoder::load_full_parameters(const std::map<std::string, at::Tensor>& full) {
  at::NoGradGuard no_grad;
  const int tp = tp_.size(), r = tp_.rank();
  std::vector<std::string> missing;
  for (auto& p : params_) {
    auto it = full.find(p.name);
    if (it == full.end()) {
      missing.push_back(p.name);
      continue;
    }
    at::Tensor t = it->second;
    const bool vocab = p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight";
    const int64_t v_pad = config_.padded_vocab_size(tp);
    if (vocab && t.dim() == 2 && t.size(0) != v_pad && t.size(0) >= config_.vocab_size) {
      // Real rows only (HF), or padded for another TP size: keep the real rows, pad with zeros.
      t = t.narrow(0, 0, config_.vocab_size);
      t = at::cat({t, at::zeros({v_pad - config_.vocab_size, t.size(1)}, t.options())}, 0);
    }
    auto want = p.tensor.sizes().vec();
    if (p.partition_dim >= 0) want[static_cast<size_t>(p.partition_dim)] *= tp;
    LF_CHECK(t.sizes().vec() == want, "parameter ", p.name, ": the given tensor has shape ", t.sizes(),
             ", the model needs ", c10::IntArrayRef(want),
             lf::hint("the weights belong to a model with a different configuration"));
    if (p.partition_dim >= 0)
      t = p.partition_blocks > 1 ? lf::parallel::shard_stacked(t, p.partition_blocks, r, tp)
                                 : lf::parallel::shard_along(t, p.partition_dim, r, tp);
    p.tensor.copy_(t);
  }
  LF_CHECK(missing.empty(), missing.size(), " parameters missing, first: ", missing.empty() ? "" : missing[0],
           lf::hint("the weights belong to a different model family or configuration"));
  if (full.size() != params_.size()) {
    const bool whole = stage_.first && stage_.last;
    for (const auto& [name, t] : full) {
      bool known = false;
      for (const auto& p : params_) known = known || p.name == name;
      if (!whole && !known) {
        // A pipeline stage holds part of the model: other stages' names are expected.
        const std::string layers = "decoder.layers.";
        if (name.rfind(layers, 0) == 0) {
          const auto dot = name.find('.', layers.size());
          const std::string idx = name.substr(layers.size(), dot - layers.size());
          known = !idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos &&
                  std::stoll(idx) < config_.num_layers;
        } else {
          known = name == "embedding.word_embeddings.weight" || name == "output_layer.weight" ||
                  name.rfind("decoder.final_layernorm.", 0) == 0;
        }
      }
      LF_CHECK(known, "tensor ", name, " is not a parameter of this model",
               lf::hint("the weights belong to a model with a different configuration (biases, "
                        "QK norms, tied embeddings?)"));
    }
  }
}

at::Tensor Decoder::norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
  const double eps = config_.norm_epsilon;
  return config_.normalization == "LayerNorm" ? lf::ops::layer_norm(backend_, x, w, b, eps)
                                              : lf::ops::rms_norm(backend_, x, w, eps);
}

at::Tensor Decoder::hidden_dropout(const at::Tensor& x) const {
  const double p = config_.hidden_dropout;
  if (!training_ || p == 0.0) return x;
  // Replicated activations draw the same mask on every TP rank; sequence-parallel chunks differ.
  return lf::parallel::dropout(x, p,
                               rng_.get(tp_.sequence_parallel && tp_.size() > 1
                                            ? lf::parallel::RngTracker::kModelParallel
                                            : lf::parallel::RngTracker::kDefault));
}

// i: the layer's index within its model chunk (block: the first num_layers of each chunk).
bool Decoder::recompute_layer(size_t i) const {
  if (recompute_.granularity != RecomputeOptions::Granularity::full) return false;
  if (recompute_.method == RecomputeOptions::Method::block)
    return static_cast<int64_t>(i) < recompute_.num_layers;
  return true;  // uniform: every layer, in groups of num_layers (see local_logits)
}

at::Tensor Decoder::attention(size_t i, const at::Tensor& x, const at::Tensor& cos,
                              const at::Tensor& sin, KvCache* cache, ChunkAttention* chunk) const {
  const Layer& l = layers_[i];
  const int64_t d = config_.head_dim(), tp = tp_.size(), groups = config_.query_groups() / tp,
                per_group = config_.num_attention_heads / config_.query_groups(),
                nq = groups * per_group;  // this rank's heads
  auto qkv = lf::parallel::column_parallel_linear(x, l.qkv, l.qkv_bias, tp_);  // [s, b, groups (pg+2) d]
  const int64_t s = qkv.size(0), b = qkv.size(1);
  qkv = qkv.view({s, b, groups, per_group + 2, d});
  auto q = qkv.narrow(3, 0, per_group).reshape({s, b, nq, d});
  auto k = qkv.select(3, per_group).contiguous();  // [s, b, groups, d]
  auto v = qkv.select(3, per_group + 1);
  // Core attention: QK norm, RoPE, softmax(QK^T) V. [s, b, n, d] -> [s, b, nq d]
  auto core = [this, &l, cos, sin, s, b, nq, d, cache, chunk, i](const at::Tensor& q0, const at::Tensor& k0,
                                                                  const at::Tensor& v0) {
    at::Tensor qn = q0, kn = k0;
    if (l.q_norm.defined()) {
      qn = lf::ops::rms_norm(backend_, q0, l.q_norm, config_.norm_epsilon);
      kn = lf::ops::rms_norm(backend_, k0, l.k_norm, config_.norm_epsilon);
    }
    auto qr = lf::ops::rope(backend_, qn, cos, sin).permute({1, 2, 0, 3});  // [b, n, s, d]
    auto kr = lf::ops::rope(backend_, kn, cos, sin).permute({1, 2, 0, 3});
    auto vr = v0.permute({1, 2, 0, 3});
    auto mask = lf::backend::AttentionMask::causal();
    if (cache) {
      const int64_t past = cache->length;
      if (past > 0) {
        kr = at::cat({cache->k[i], kr}, 2);
        vr = at::cat({cache->v[i], vr}, 2);
      }
      cache->k[i] = kr.contiguous();
      cache->v[i] = vr.contiguous();
      // The causal mask is bottom-right aligned (backend/op_table.h): query j, at position
      // past + j, sees keys 0 .. past + j, the cached ones included.
    }
    at::Tensor o;
    if (chunk) {
      // ChunkPipe: this chunk's queries over the earlier chunks' keys and its own, causally.
      chunk->k[i] = kr;
      chunk->v[i] = vr;
      const bool prefix = i < chunk->prefix_k.size() && chunk->prefix_k[i].defined() &&
                          chunk->prefix_k[i].size(2) > 0;
      o = prefix ? lf::ops::sdpa_after_prefix(backend_, qr, chunk->prefix_k[i], chunk->prefix_v[i], kr, vr)
                 : lf::ops::sdpa(backend_, qr, kr, vr, mask);
    } else {
      o = lf::ops::sdpa(backend_, qr, kr, vr, mask);  // [b, nq, s, d]
    }
    return o.permute({2, 0, 1, 3}).reshape({s, b, nq * d});
  };
  at::Tensor o;
  if (recompute_.granularity == RecomputeOptions::Granularity::selective && !cache && !chunk) {
    std::vector<at::Tensor> in{q, k, v};
    o = lf::models::recompute([core](const std::vector<at::Tensor>& t) { return core(t[0], t[1], t[2]); }, in);
  } else {
    o = core(q, k, v);
  }
  return lf::parallel::row_parallel_linear(o, l.proj, l.proj_bias, tp_);
}

at::Tensor Decoder::mlp(const Layer& l, const at::Tensor& x) const {
  auto fc1 = lf::parallel::column_parallel_linear(x, l.fc1, l.fc1_bias, tp_);  // [s, b, (2) f / tp]
  auto act = [this](const at::Tensor& t) {
    return config_.swiglu ? lf::ops::swiglu(backend_, t) : lf::ops::gelu(backend_, t);
  };
  at::Tensor a = recompute_.granularity == RecomputeOptions::Granularity::selective
                     ? lf::models::recompute([act](const std::vector<at::Tensor>& t) { return act(t[0]); }, {fc1})
                     : act(fc1);
  return lf::parallel::row_parallel_linear(a, l.fc2, l.fc2_bias, tp_);
}

at::Tensor Decoder::layer_forward(size_t i, const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin, KvCache* cache, ChunkAttention* chunk) const {
  const Layer& l = layers_[i];
  auto y = x + hidden_dropout(attention(i, norm(x, l.input_norm, l.input_norm_bias), cos, sin, cache, chunk));
  return y + hidden_dropout(mlp(l, norm(y, l.pre_mlp_norm, l.pre_mlp_norm_bias)));
}

at::Tensor Decoder::embed(const at::Tensor& tokens, int64_t start) const {
  LF_CHECK(tokens.dim() == 2, "tokens must be [batch, seq], got ", tokens.sizes());
  const int64_t s = tokens.size(1);
  LF_CHECK(start + s <= config_.max_position_embeddings, "sequence length ", start + s,
           " exceeds max_position_embeddings ", config_.max_position_embeddings,
           lf::hint("raise model max_position_embeddings or lower --seq-length"));
  LF_CHECK(!tp_.sequence_parallel || s % tp_.size() == 0, "sequence parallelism: sequence length ",
           s, " is not divisible by the tensor-model-parallel size ", tp_.size(),
           lf::hint("pick --seq-length as a multiple of the TP size"));
  // [s(/tp), b, h]: the sequence chunk under SP.
  auto x = lf::parallel::vocab_parallel_embedding(tokens.t().contiguous(), embedding_, tp_);
  return hidden_dropout(x);  // Megatron's embedding dropout uses hidden_dropout
}

at::Tensor Decoder::run_layers(at::Tensor x, int64_t start, int64_t s, KvCache* cache, size_t lo,
                               size_t hi, ChunkAttention* chunk) const {
  LF_CHECK(start + s <= config_.max_position_embeddings, "sequence length ", start + s,
           " exceeds max_position_embeddings ", config_.max_position_embeddings,
           lf::hint("raise model max_position_embeddings or lower --seq-length"));
  auto [cos, sin] = rope_tables(rope_spec(config_), start, s,
                                at::TensorOptions().dtype(at::kFloat).device(backend_.device()));
  if (cache && cache->k.empty()) {
    cache->k.resize(layers_.size());
    cache->v.resize(layers_.size());
  }
  if (chunk) {
    chunk->k.assign(layers_.size(), at::Tensor());
    chunk->v.assign(layers_.size(), at::Tensor());
  }
  const size_t n = std::min(hi, layers_.size());
  const bool full = recompute_.granularity == RecomputeOptions::Granularity::full && !cache && !chunk;
  for (size_t i = lo; i < n;) {
    if (full && recompute_layer(i - lo)) {
      // uniform: num_layers consecutive layers per checkpoint; block: one layer each, first N.
      const size_t group = recompute_.method == RecomputeOptions::Method::uniform
                               ? std::min(n - i, static_cast<size_t>(recompute_.num_layers))
                               : 1;
      std::vector<at::Tensor> in{x};
      x = lf::models::recompute(
          [this, i, group, cos, sin](const std::vector<at::Tensor>& t) {
            at::Tensor y = t[0];
            for (size_t j = i; j < i + group; ++j) y = layer_forward(j, y, cos, sin, nullptr);
            return y;
          },
          in, &rng_);
      i += group;
    } else {
      x = layer_forward(i, x, cos, sin, cache, chunk);
      ++i;
    }
  }
  if (cache) cache->length += s;
  return x;
}

at::Tensor Decoder::head(const at::Tensor& x) const {
  auto y = norm(x, final_norm_, final_norm_bias_);
  return lf::parallel::column_parallel_linear(y, output_.defined() ? output_ : embedding_, {}, tp_);
}

at::Tensor Decoder::local_logits(const at::Tensor& tokens, KvCache* cache) const {
  LF_CHECK(tokens.dim() == 2, "tokens must be [batch, seq], got ", tokens.sizes());
  LF_CHECK(!cache || !tp_.sequence_parallel, "incremental decoding with sequence parallelism",
           lf::hint("build the decoder for generation without sequence_parallel"));
  const int64_t s = tokens.size(1), start = cache ? cache->length : 0;
  return head(run_layers(embed(tokens, start), start, s, cache));
}

at::Tensor Decoder::stage_forward(const at::Tensor& input, const at::Tensor& labels, int64_t chunk) const {
  return stage_forward_impl(input, labels, chunk, 0, nullptr, true);
}

at::Tensor Decoder::stage_forward_chunk(const at::Tensor& input, const at::Tensor& labels, int64_t start,
                                        ChunkAttention& kv, bool with_head) const {
  LF_CHECK(stage_.num_chunks() == 1, "ChunkPipe runs one model chunk per pipeline rank; this stage has ",
           describe_stage(), lf::hint("drop --num-layers-per-virtual-pipeline-stage with --chunkpipe-chunk-size"));
  return stage_forward_impl(input, labels, 0, start, &kv, with_head);
}

at::Tensor Decoder::stage_forward_impl(const at::Tensor& input, const at::Tensor& labels, int64_t chunk,
                                       int64_t start, ChunkAttention* kv, bool with_head) const {
  LF_CHECK(input.defined(), "pipeline stage with ", describe_stage(), ": no input");
  const auto [lo, hi] = chunk_layers(chunk);
  const bool embeds = stage_.first && chunk == 0, heads = stage_.last && chunk == stage_.num_chunks() - 1;
  at::Tensor x;
  int64_t s = 0;
  if (embeds) {
    s = input.size(-1);
    x = embed(input, start);
  } else {
    LF_CHECK(input.dim() == 3 && input.size(2) == config_.hidden_size, "pipeline stage with ",
             describe_stage(), ": hidden states must be [s, b, ", config_.hidden_size, "], got ",
             input.sizes());
    // Under SP the stages exchange sequence chunks [s / tp, b, h].
    s = input.size(0) * (tp_.sequence_parallel ? tp_.size() : 1);
    x = input;
  }
  x = run_layers(x, start, s, nullptr, lo, hi, kv);
  if (!heads || !with_head) return x;
  auto logits = head(x);
  return labels.defined() ? loss_of(logits, labels) : full_logits(logits);
}

at::Tensor Decoder::full_logits(const at::Tensor& local) const {
  auto logits = local;  // [s, b, v_pad / tp]
  if (tp_.size() > 1) logits = lf::parallel::gather_from_tp(logits, *tp_.tp);
  return logits.narrow(-1, 0, config_.vocab_size);  // [s, b, vocab]
}

at::Tensor Decoder::forward(const at::Tensor& tokens) const {
  check_whole_model("Decoder::forward");
  return full_logits(local_logits(tokens));
}

at::Tensor Decoder::forward(const at::Tensor& tokens, KvCache& cache) const {
  check_whole_model("Decoder::forward with a KV cache");
  at::NoGradGuard no_grad;
  return full_logits(local_logits(tokens, &cache));
}

at::Tensor Decoder::loss(const at::Tensor& tokens, const at::Tensor& labels) const {
  check_whole_model("Decoder::loss");
  return loss_of(local_logits(tokens), labels);
}

at::Tensor Decoder::loss_of(const at::Tensor& logits, const at::Tensor& labels) const {
  // logits: [s, b, v_pad / tp]
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

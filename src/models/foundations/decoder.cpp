#include "loongforge/models/foundations/decoder.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "loongforge/backend/fp8.h"
#include "loongforge/core/error.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {

RopeSpec rope_spec(const DecoderConfig& c) {
  RopeSpec r;
  r.head_dim = c.multi_latent_attention ? c.qk_pos_emb_head_dim : c.head_dim();
  r.yarn = c.rope_type == "yarn";
  r.yarn_factor = c.rotary_scaling_factor;
  r.beta_fast = c.beta_fast;
  r.beta_slow = c.beta_slow;
  r.mscale = c.mscale;
  r.mscale_all_dim = c.mscale_all_dim;
  r.interleaved = c.rotary_interleaved;
  r.base = c.rotary_base;
  r.llama3_scaling = c.rope_scaling;
  r.factor = c.rope_scaling_factor;
  r.low_freq_factor = c.rope_scaling_low_freq_factor;
  r.high_freq_factor = c.rope_scaling_high_freq_factor;
  r.original_max_position = c.rope_scaling_original_max_position_embeddings;
  return r;
}

MoeConfig moe_config(const DecoderConfig& c) {
  MoeConfig m;
  m.hidden_size = c.hidden_size;
  m.num_experts = c.num_experts;
  m.ffn_hidden_size = c.expert_ffn_hidden_size();
  m.topk = c.moe_router_topk;
  m.swiglu = c.swiglu;
  m.score_function = c.moe_router_score_function;
  m.pre_softmax = c.moe_router_pre_softmax;
  m.num_groups = c.moe_router_num_groups;
  m.group_topk = c.moe_router_group_topk;
  m.scaling_factor = c.moe_router_topk_scaling_factor;
  m.load_balancing = c.moe_router_load_balancing_type;
  m.aux_loss_coeff = c.moe_aux_loss_coeff;
  m.z_loss_coeff = c.moe_z_loss_coeff;
  m.expert_bias = c.moe_router_enable_expert_bias;
  m.bias_update_rate = c.moe_router_bias_update_rate;
  m.shared_ffn_hidden_size = c.moe_shared_expert_intermediate_size;
  m.shared_gate = c.moe_shared_expert_gate;
  m.capacity_factor = c.moe_expert_capacity_factor;
  m.drop_by_position = c.moe_token_drop_policy == "position";
  m.init_std = c.init_method_std;
  m.out_std = c.init_method_std / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  return m;
}

PipelineStage pipeline_stage(const DecoderConfig& config, int pp, int pp_rank,
                             std::optional<int64_t> first_stage_layers, std::optional<int64_t> last_stage_layers,
                             std::optional<int64_t> layers_per_virtual_stage, const std::optional<std::string>& layout) {
  lf::parallel::pipeline::StageSplit split;
  split.first_stage_layers = first_stage_layers;
  split.last_stage_layers = last_stage_layers;
  split.layers_per_virtual_stage = layers_per_virtual_stage;
  split.layout = layout;
  return lf::parallel::pipeline::pipeline_stage(config.num_layers, pp, pp_rank, split);
}

Decoder::Decoder(const DecoderConfig& c, const lf::backend::DeviceBackend& backend, ParamBuilder& b,
                 const PipelineStage& stage, uint64_t seed, int tp_rank, int pp_rank)
    : config_(c), backend_(backend), tp_(b.tp()), stage_(stage) {
  if (stage_.chunks.empty()) stage_.chunks = {{0, c.num_layers}};
  if (!c.mrope_section.empty()) {
    int64_t sum = 0;
    for (int64_t v : c.mrope_section) sum += v;
    LF_CHECK(c.mrope_section.size() == 3 && sum == rope_spec(c).head_dim / 2,
             "model mrope_section must be 3 sections (temporal, height, width) summing to the rotary head_dim / 2 = ",
             rope_spec(c).head_dim / 2, "; got ", c.mrope_section.size(), " summing to ", sum,
             lf::hint("Qwen2.5-VL uses [16, 24, 24] for head_dim 128"));
  }
  LF_CHECK(!c.mrope_interleaved || !c.mrope_section.empty(), "model mrope_interleaved needs mrope_section",
           lf::hint("Qwen3-VL uses mrope_section [24, 20, 20] with mrope_interleaved for head_dim 128"));
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
  const int64_t h = c.hidden_size, nq = c.num_attention_heads, nkv = c.query_groups(), f = c.ffn_hidden_size;
  if (tp_.size() > 1) {
    const int64_t tp = tp_.size();
    LF_CHECK(nq % tp == 0 && (c.multi_latent_attention || nkv % tp == 0), "num_attention_heads ", nq, " and num_query_groups ", nkv,
             " must both be divisible by the tensor-model-parallel size ", tp,
             lf::hint("each TP rank owns whole query groups; pick a TP size dividing both"));
    LF_CHECK(f % tp == 0, "ffn_hidden_size ", f, " is not divisible by the tensor-model-parallel size ", tp,
             lf::hint("pick an ffn_hidden_size that is a multiple of the TP size"));
    LF_CHECK(!c.is_moe() || (c.expert_ffn_hidden_size() % tp == 0 && c.moe_shared_expert_intermediate_size % tp == 0),
             "moe_ffn_hidden_size ", c.expert_ffn_hidden_size(), " and moe_shared_expert_intermediate_size ",
             c.moe_shared_expert_intermediate_size, " must be divisible by the tensor-model-parallel size ", tp,
             lf::hint("each TP rank holds an equal share of every expert"));
  }
  rng_ = lf::parallel::RngTracker(seed, tp_rank, pp_rank);
  // Megatron's init: N(0, std) for weights, zeros for biases, ones for norms; output projections
  // scaled by 1/sqrt(2 * layers). Every rank draws the full tensors in the same order and keeps its
  // shard.
  const double std = c.init_method_std, out_std = std / std::sqrt(2.0 * c.num_layers);
  TransformerLayerConfig lc;
  lc.norm = {c.normalization == "LayerNorm", c.norm_epsilon};
  lc.attention = {h, nq, nkv, c.head_dim(), c.add_qkv_bias || c.add_bias_linear, c.add_bias_linear,
                  c.qk_layernorm, c.norm_epsilon, std, out_std, c.rotary_interleaved};
  if (c.multi_latent_attention) {
    lc.mla = true;
    lc.mla_config = {h, nq, c.q_lora_rank, c.kv_lora_rank, c.qk_head_dim, c.qk_pos_emb_head_dim, c.v_head_dim,
                     c.norm_epsilon, c.softmax_scale(), c.rotary_interleaved, std, out_std};
    if (c.dsa())
      lc.mla_config.dsa = {true, c.dsa_indexer_n_heads, c.dsa_indexer_head_dim, c.dsa_indexer_topk,
                           c.dsa_indexer_loss_coeff, c.dsa_indexer_warmup};
  }
  lc.mlp = {h, f, c.swiglu, c.add_bias_linear, std, out_std};
  lc.hidden_dropout = c.hidden_dropout;
  const auto moe_pattern = c.moe_layer_pattern();
  const MoeConfig moe = c.is_moe() ? moe_config(c) : MoeConfig{};

  initial_embedding_ = vocab_table(b, c.vocab_size, c.padded_vocab_size(tp_.size()), h, std);
  b.set_keep(stage_.first);
  embedding_ = TokenEmbedding(b, "embedding.word_embeddings.weight", initial_embedding_);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    bool keep = false;
    for (const auto& r : stage_.chunks) keep = keep || (i >= r.begin && i < r.end);
    b.set_keep(keep);
    TransformerLayerConfig layer_config = lc;
    layer_config.moe = moe_pattern[static_cast<size_t>(i)];
    if (layer_config.moe) layer_config.moe_config = moe;
    TransformerLayer layer(b, "decoder.layers." + std::to_string(i), layer_config, moe_layers_);
    if (keep) {
      if (layer_config.moe) ++moe_layers_;
      layers_.push_back(std::move(layer));
    }
  }
  b.set_keep(stage_.last);
  final_norm_ = Norm(b, "decoder.final_layernorm", h, lc.norm);
  b.set_keep(true);
  layer_config_ = lc;
  moe_config_ = moe;
}

void Decoder::add_lora(ParamBuilder& b, const LoraSpec& spec) {
  if (!spec.enabled()) return;
  const auto& c = config_;
  const int64_t h = c.hidden_size, d = c.head_dim(), nq = c.num_attention_heads, nkv = c.query_groups(),
                f = c.ffn_hidden_size;
  const auto moe_pattern = c.moe_layer_pattern();
  using K = LoraAdapter::Kind;
  size_t local = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    bool keep = false;
    for (const auto& r : stage_.chunks) keep = keep || (i >= r.begin && i < r.end);
    b.set_keep(keep);
    const std::string prefix = "decoder.layers." + std::to_string(i);
    LayerLora lora;
    for (LoraModule m : kLoraModules) {
      if (!spec.targets_module(m)) continue;
      const bool attn = is_attention_module(m);
      LF_CHECK(!attn || !c.multi_latent_attention, "LoRA target ", lora_module_name(m),
               ": this model uses multi-latent attention, whose projections are not q/k/v/o_proj",
               lf::hint("target the MLP modules only (--lora-target-modules gate_proj up_proj down_proj)"));
      LF_CHECK(attn || (!moe_pattern[static_cast<size_t>(i)] && c.swiglu), "LoRA target ", lora_module_name(m),
               ": layer ", i, " has ", moe_pattern[static_cast<size_t>(i)] ? "a mixture of experts" : "a GELU MLP",
               ", not gate/up/down projections",
               lf::hint("target the attention modules only (--lora-target-modules q_proj k_proj v_proj o_proj)"));
      const std::string name = prefix + (attn ? ".self_attention." : ".mlp.") + lora_module_name(m);
      switch (m) {
        case LoraModule::q_proj: lora[m] = LoraAdapter(b, name, h, nq * d, K::column, spec); break;
        case LoraModule::k_proj:
        case LoraModule::v_proj: lora[m] = LoraAdapter(b, name, h, nkv * d, K::column, spec); break;
        case LoraModule::o_proj: lora[m] = LoraAdapter(b, name, nq * d, h, K::row, spec); break;
        case LoraModule::gate_proj:
        case LoraModule::up_proj: lora[m] = LoraAdapter(b, name, h, f, K::column, spec); break;
        case LoraModule::down_proj: lora[m] = LoraAdapter(b, name, f, h, K::row, spec); break;
      }
    }
    if (keep) layers_[local++].set_lora(std::move(lora));
  }
  b.set_keep(true);
}

void Decoder::add_mtp(ParamBuilder& b, const at::Tensor& last_stage_table) {
  const auto& c = config_;
  const int64_t h = c.hidden_size;
  if (c.mtp_num_layers > 0 && stage_.last && !stage_.first) {
    // The MTP layers embed tokens on the last stage: the output layer's tied copy of the embedding
    // when there is one, else a copy of their own, kept equal to the first stage's by summing
    // their gradients over the embedding group (as Megatron does for MTP).
    at::Tensor table = last_stage_table;
    if (!table.defined()) {
      table = b.add("embedding.word_embeddings.weight", initial_embedding_, Sharding::vocabulary(), false);
      b.last().tied_copy = true;
      b.last().pipeline_tied = true;
    }
    mtp_embedding_ = TokenEmbedding(table);
  }
  b.set_keep(stage_.last);
  for (int64_t k = 0; k < c.mtp_num_layers; ++k) {
    const std::string prefix = "mtp.layers." + std::to_string(k);
    MtpLayer m;
    m.enorm = Norm(b, prefix + ".enorm", h, layer_config_.norm);
    m.hnorm = Norm(b, prefix + ".hnorm", h, layer_config_.norm);
    m.eh_proj = b.add(prefix + ".eh_proj.weight", b.normal({h, 2 * h}, c.init_method_std), Sharding::along(0), false);
    TransformerLayerConfig lc = layer_config_;
    lc.moe = c.is_moe();
    if (lc.moe) lc.moe_config = moe_config_;
    m.layer = TransformerLayer(b, prefix + ".transformer_layer", lc, moe_layers_);
    m.final_norm = Norm(b, prefix + ".final_layernorm", h, layer_config_.norm);
    if (stage_.last) {
      if (lc.moe) ++moe_layers_;
      mtp_.push_back(std::move(m));
    }
  }
  b.set_keep(true);
}

at::Tensor Decoder::mtp_forward(size_t k, const at::Tensor& hidden, const at::Tensor& tokens,
                                const DecoderInputs& in) const {
  LF_CHECK(k < mtp_.size(), "MTP layer ", k, " of ", mtp_.size(), " on this rank (", describe_stage(), ")");
  LF_CHECK(!in.cache && !in.chunk, "multi-token prediction runs on whole sequences (no KV cache, no ChunkPipe)");
  const auto& m = mtp_[k];
  // [enorm(embed(tokens)); hnorm(hidden)] -> eh_proj (column-parallel, gathered back to the full
  // hidden size; SP: the sequence chunk again), as Megatron's MultiTokenPredictionLayer.
  at::Tensor e = m.enorm(backend_, stage_.first ? embed(tokens, in.start) : embed_with(mtp_embedding_, tokens, in.start));
  at::Tensor joined = at::cat({e, m.hnorm(backend_, hidden)}, -1);
  at::Tensor x;
  if (tp_.size() > 1) {
    x = lf::parallel::gather_from_tp(lf::parallel::column_parallel_linear(joined, m.eh_proj, {}, tp_), *tp_.tp);
    if (tp_.sequence_parallel) x = lf::parallel::scatter_to_sequence_parallel(x, *tp_.tp);
  } else {
    x = at::matmul(joined, m.eh_proj.t());
  }
  AttentionInputs a = attention_inputs(in);
  LayerContext lc{&backend_, &tp_, &rng_, training_, recompute_, &moe_step_, moe_layers_, slots_, fp8_};
  // A view of the layer itself: a copy would be gone when full recomputation reruns it in backward.
  return lf::models::run_layers(std::span<const TransformerLayer>(&m.layer, 1), 0, 1, x, a, lc);
}

at::Tensor Decoder::mtp_final_norm(size_t k, const at::Tensor& x) const {
  LF_CHECK(k < mtp_.size(), "MTP layer ", k, " of ", mtp_.size(), " on this rank (", describe_stage(), ")");
  return mtp_[k].final_norm(backend_, x);
}

std::pair<size_t, size_t> Decoder::chunk_layers(int64_t c) const {
  LF_CHECK(c >= 0 && c < stage_.num_chunks(), "model chunk ", c, " of a pipeline stage with ", stage_.num_chunks(),
           " chunk(s) (", describe_stage(), ")");
  size_t begin = 0;
  for (int64_t k = 0; k < c; ++k) begin += static_cast<size_t>(stage_.chunks[static_cast<size_t>(k)].size());
  return {begin, begin + static_cast<size_t>(stage_.chunks[static_cast<size_t>(c)].size())};
}

at::Tensor Decoder::embed(const at::Tensor& tokens, int64_t start, bool scatter) const {
  LF_CHECK(stage_.first, "the embedding lives on the first pipeline stage; this one holds ", describe_stage());
  return embed_with(embedding_, tokens, start, scatter);
}

at::Tensor Decoder::embed_with(const TokenEmbedding& table, const at::Tensor& tokens, int64_t start, bool scatter) const {
  LF_CHECK(tokens.dim() == 2, "tokens must be [batch, seq], got ", tokens.sizes());
  const int64_t s = tokens.size(1);
  LF_CHECK(start + s <= config_.max_position_embeddings, "sequence length ", start + s,
           " exceeds max_position_embeddings ", config_.max_position_embeddings,
           lf::hint("raise model max_position_embeddings or lower --seq-length"));
  LF_CHECK(!tp_.sequence_parallel || s % tp_.size() == 0, "sequence parallelism: sequence length ", s,
           " is not divisible by the tensor-model-parallel size ", tp_.size(),
           lf::hint("pick --seq-length as a multiple of the TP size"));
  // [s(/tp), b, h]: the sequence chunk under SP. Megatron's embedding dropout uses hidden_dropout.
  auto x = table.forward(tp_, tokens, scatter, slots_);
  lf::parallel::TensorParallel layout = tp_;
  if (!scatter) layout.sequence_parallel = false;
  LayerContext lc{&backend_, &layout, &rng_, training_, recompute_, nullptr, 0, slots_, fp8_};
  return hidden_dropout(x, config_.hidden_dropout, lc);
}

at::Tensor Decoder::scatter_sequence(const at::Tensor& x) const {
  if (!tp_.sequence_parallel || tp_.size() == 1) return x;
  return lf::parallel::scatter_to_sequence_parallel(x, *tp_.tp);
}

AttentionInputs Decoder::attention_inputs(const DecoderInputs& in) const {
  const int64_t start = in.start, s = in.seq;
  LF_CHECK(start + s <= config_.max_position_embeddings, "sequence length ", start + s,
           " exceeds max_position_embeddings ", config_.max_position_embeddings,
           lf::hint("raise model max_position_embeddings or lower --seq-length"));
  const auto options = at::TensorOptions().dtype(at::kFloat).device(backend_.device());
  AttentionInputs a;
  if (in.position_ids.defined() && in.position_ids.dim() == 1) {
    // Positions shared by every sample (this rank's tokens under context parallelism).
    LF_CHECK(!in.cache && in.position_ids.size(0) == s, "shared position ids must be [", s,
             "] (no KV cache), got ", in.position_ids.sizes());
    LF_CHECK(in.position_ids.max().item<int64_t>() < config_.max_position_embeddings, "a position id reaches ",
             in.position_ids.max().item<int64_t>(), ", past max_position_embeddings ", config_.max_position_embeddings);
    std::tie(a.cos, a.sin) = rope_tables_at(rope_spec(config_), in.position_ids, options);
  } else if (in.position_ids.defined()) {
    LF_CHECK(!in.cache && !in.chunk, "per-sample position ids work on whole sequences (no KV cache, no ChunkPipe)");
    const bool mrope = in.position_ids.dim() == 3;
    LF_CHECK(!mrope || !config_.mrope_section.empty(), "position_ids [3, batch, seq] (M-RoPE) need model "
             "mrope_section; got ", in.position_ids.sizes(), lf::hint("set the foundation's mrope_section, e.g. [16, 24, 24]"));
    LF_CHECK((in.position_ids.dim() == 2 || (mrope && in.position_ids.size(0) == 3)) && in.position_ids.size(-1) == s,
             "position_ids must be [batch, ", s, "]", config_.mrope_section.empty() ? "" : " or [3, batch, seq] (M-RoPE)",
             ", got ", in.position_ids.sizes());
    LF_CHECK(in.position_ids.max().item<int64_t>() < config_.max_position_embeddings, "a position id reaches ",
             in.position_ids.max().item<int64_t>(), ", past max_position_embeddings ", config_.max_position_embeddings);
    std::vector<at::Tensor> cos, sin;
    const int64_t b = in.position_ids.size(mrope ? 1 : 0);
    for (int64_t i = 0; i < b; ++i) {
      // M-RoPE tables [s, d] per sample from its [3, s] positions; [b, s] positions are 1D RoPE.
      auto [c, si] = mrope ? mrope_tables(rope_spec(config_), in.position_ids.select(1, i), config_.mrope_section, options,
                                          config_.mrope_interleaved)
                           : rope_tables_at(rope_spec(config_), in.position_ids[i], options);
      cos.push_back(c);
      sin.push_back(si);
    }
    a.cos = at::stack(cos);
    a.sin = at::stack(sin);
  } else {
    std::tie(a.cos, a.sin) = rope_tables(rope_spec(config_), start, s, options);
  }
  if (in.document_ids.defined()) {
    LF_CHECK(!in.cache && !in.chunk, "document masks (--reset-attention-mask) work on whole sequences (no KV cache, "
             "no ChunkPipe)");
    // Attention within each document, run by run: no [s, s] mask.
    a.documents = in.document_ids.to(at::kCPU);
    const int64_t whole = s * (in.cp ? in.cp->size() : 1);
    LF_CHECK(a.documents.dim() == 2 && a.documents.size(1) == whole, "document ids must be [batch, ", whole, "]",
             in.cp && in.cp->on() ? " (the whole sequence under context parallelism)" : "", ", got ",
             a.documents.sizes());
  }
  if (in.cp && in.cp->on()) {
    LF_CHECK(!in.cache, "context parallelism runs whole sequences or ChunkPipe chunks (no KV cache)");
    a.cp = in.cp;
  }
  return a;
}

bool Decoder::set_fp8(const lf::ops::Fp8Policy* fp8) {
  const int64_t n = config_.num_layers;
  const std::vector<bool> on = fp8 ? fp8->layers_in_fp8(n, "layers") : std::vector<bool>(static_cast<size_t>(n), true);
  fp8_ = fp8;
  for (size_t i = 0; i < layers_.size(); ++i) layers_[i].set_fp8(on[static_cast<size_t>(global_layer(i))]);
  // Every layer has an FP8 GEMM: its MLP's (dense or the experts') if not its attention's.
  return std::find(on.begin(), on.end(), true) != on.end();
}

int64_t Decoder::global_layer(size_t local) const {
  size_t before = 0;
  for (const auto& r : stage_.chunks) {
    const auto n = static_cast<size_t>(r.size());
    if (local < before + n) return r.begin + static_cast<int64_t>(local - before);
    before += n;
  }
  LF_FAIL("local layer ", local, " of a pipeline stage with ", layers_.size(), " layers (", describe_stage(), ")");
}

at::Tensor Decoder::inject(const at::Tensor& x, const HiddenInjection& j, int64_t seq) const {
  LF_CHECK(j.mask.dim() == 2 && j.mask.size(1) == seq && j.mask.size(0) == x.size(1), "injection after layer ",
           j.layer, ": the mask must be [batch ", x.size(1), ", seq ", seq, "], got ", j.mask.sizes());
  const auto mask = j.mask.to(x.device(), at::kBool);
  LF_CHECK(j.values.dim() == 2 && j.values.size(1) == x.size(2) && j.values.size(0) == mask.sum().item<int64_t>(),
           "injection after layer ", j.layer, ": values must be [", mask.sum().item<int64_t>(),
           " (the mask's positions), ", x.size(2), "], got ", j.values.sizes());
  at::Tensor local = mask, values = j.values.to(x.device(), x.scalar_type());
  const bool chunked = tp_.sequence_parallel && tp_.size() > 1;
  LF_CHECK(x.size(0) * (chunked ? tp_.size() : 1) == seq, "injection after layer ", j.layer, ": hidden states of ",
           x.size(0), " positions", chunked ? " per sequence-parallel rank" : "", " for a sequence of ", seq);
  if (chunked) {
    // Sequence parallelism: this rank's chunk of the sequence and the rows that fall in it.
    const int64_t len = x.size(0), start = static_cast<int64_t>(tp_.rank()) * len;
    const auto row = (mask.reshape({-1}).to(at::kLong).cumsum(0) - 1).view(mask.sizes());
    local = mask.narrow(1, start, len);
    // Every TP rank holds all rows and uses its own: in backward the ranks' row gradients are
    // summed (copy_to_tp), so the encoder that made them gets the whole gradient on every rank,
    // as on the embedding's path (scatter_to_sequence_parallel gathers it there).
    values = lf::parallel::copy_to_tp(values, *tp_.tp)
                 .index_select(0, row.narrow(1, start, len).masked_select(local));
  }
  const auto add = at::zeros({x.size(1), x.size(0), x.size(2)}, x.options())
                       .masked_scatter(local.unsqueeze(-1), values);  // [b, s(/tp), h]
  return x + add.transpose(0, 1);
}

at::Tensor Decoder::run_layers(at::Tensor x, const DecoderInputs& in, size_t lo, size_t hi) const {
  hi = std::min(hi, layers_.size());
  if (!in.injections.empty()) {
    LF_CHECK(!in.cache && !in.chunk, "hidden-state injections (DeepStack) work on whole sequences (no KV cache, no "
             "ChunkPipe)");
    std::vector<std::pair<size_t, const HiddenInjection*>> at_layer;
    for (const auto& j : in.injections) {
      size_t local = SIZE_MAX;
      for (size_t i = lo; i < hi; ++i)
        if (global_layer(i) == j.layer) local = i;
      LF_CHECK(local != SIZE_MAX, "an injection after decoder layer ", j.layer, " reached a call running ",
               hi > lo ? "layers " + std::to_string(global_layer(lo)) + ".." + std::to_string(global_layer(hi - 1))
                       : std::string("no layers"),
               " of pipeline stage ", describe_stage(),
               lf::hint("the stage holding that layer must receive the injection"));
      at_layer.push_back({local, &j});
    }
    std::stable_sort(at_layer.begin(), at_layer.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    DecoderInputs rest = in;
    rest.injections.clear();
    size_t from = lo;
    for (const auto& [local, j] : at_layer) {
      if (local + 1 > from) x = run_layers(x, rest, from, local + 1);
      from = local + 1;
      x = inject(x, *j, in.seq);
    }
    return from < hi ? run_layers(x, rest, from, hi) : x;
  }
  AttentionInputs a = attention_inputs(in);
  a.cache = in.cache;
  a.chunk = in.chunk;
  if (in.cache && in.cache->k.empty()) {
    in.cache->k.resize(layers_.size());
    in.cache->v.resize(layers_.size());
    in.cache->index_k.resize(layers_.size());
  }
  if (in.chunk) {
    in.chunk->k.assign(layers_.size(), at::Tensor());
    in.chunk->v.assign(layers_.size(), at::Tensor());
  }
  LayerContext lc{&backend_, &tp_, &rng_, training_, recompute_, &moe_step_, moe_layers_, slots_, fp8_};
  x = lf::models::run_layers(layers_, lo, hi, x, a, lc);
  if (in.cache) in.cache->length += in.seq;
  return x;
}

void Decoder::update_expert_bias(const at::Tensor& load) const {
  LF_CHECK(load.dim() == 2 && load.size(0) == static_cast<int64_t>(moe_layers_), "expert load must be [",
           moe_layers_, ", experts] (this rank's MoE layers), got ", load.sizes());
  int64_t row = 0;
  for (const auto& layer : layers_)
    if (layer.is_moe()) layer.moe().update_expert_bias(load[row++]);
  for (const auto& m : mtp_)
    if (m.layer.is_moe()) m.layer.moe().update_expert_bias(load[row++]);
}

at::Tensor Decoder::final_norm(const at::Tensor& x) const {
  LF_CHECK(stage_.last, "the final norm lives on the last pipeline stage; this one holds ", describe_stage());
  return final_norm_(backend_, x);
}

}  // namespace lf::models

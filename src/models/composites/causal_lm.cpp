#include "loongforge/models/composites/causal_lm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cstdlib>
#include <set>

#include "loongforge/backend/functional.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/error.h"
#include "loongforge/core/config/config_error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/registry.h"
#include "loongforge/parallel/context/context_parallel.h"

namespace lf::models {

lf::parallel::TensorParallel tensor_parallel_of(const lf::dist::ParallelContext* parallel, bool sequence_parallel) {
  lf::parallel::TensorParallel tp;
  if (parallel && parallel->tp_size() > 1) {
    tp.tp = &parallel->tp();
    tp.sequence_parallel = sequence_parallel;
  }
  if (parallel && parallel->cp_size() > 1) tp.fp8_amax = &parallel->tp_cp();  // each CP rank holds other tokens
  return tp;
}

CausalLmConfig load_causal_lm(const lf::config::Node& model) {
  auto config = load_model_config(model);
  if (config->type != "causal_lm") {
    lf::config::ErrorList errors;
    const auto* t = model.find("type");
    errors.add("model.type", t ? t->origin() : model.origin(),
               "model.type must be causal_lm here, got '" + config->type + "'",
               "this tool works on decoder language models");
    errors.throw_if_any();
  }
  return {config->fields<DecoderConfig>("foundation"), config->resolved};
}

namespace {

ParamBuilder builder_for(uint64_t seed, at::ScalarType dtype, const lf::backend::DeviceBackend& backend,
                         const lf::dist::ParallelContext* parallel, bool sequence_parallel, bool trainable,
                         const ExpertPlacement& experts) {
  auto tp = tensor_parallel_of(parallel, sequence_parallel);
  if (experts.context) {
    tp.ep = &experts.context->tp();
    if (experts.split_over_tp) {
      LF_CHECK(parallel != nullptr && parallel->ep_size() * tp.size() == experts.context->tp_size() &&
                   experts.context->tp_rank() == parallel->ep().rank() * tp.size() + tp.rank(),
               "experts split over tp x ep: the experts' context (tp size ", experts.context->tp_size(),
               ", rank ", experts.context->tp_rank(), ") does not number its ranks ep rank x tp + tp rank",
               lf::hint("internal: build it with ParallelLayout::expert_layout"));
      tp.ep = &parallel->ep();
      tp.ep_split_over_tp = true;
    }
    tp.ep_allgather = experts.allgather;
    tp.ep_overlap_chunks = experts.overlap_chunks;
    tp.ep_delay_wgrad = experts.delay_wgrad;
  }
  return ParamBuilder(at::make_generator<at::CPUGeneratorImpl>(seed), dtype, backend.device(), tp, trainable);
}

LmHeadConfig head_config(const DecoderConfig& c, int tp) {
  return {c.hidden_size, c.vocab_size, c.padded_vocab_size(tp), !c.untie_embeddings_and_output_weights,
          c.init_method_std, c.cross_entropy_loss_fusion};
}

const std::string kType = "causal_lm";

// A DSA lightning indexer's weight (blocks/mla.h: <layer>.self_attention.indexer.*).
bool is_dsa_indexer(const std::string& name) { return name.find(".indexer.") != std::string::npos; }

}  // namespace

CausalLm::CausalLm(const DecoderConfig& config, const lf::backend::DeviceBackend& backend, uint64_t seed,
                   at::ScalarType dtype, const lf::dist::ParallelContext* parallel, bool sequence_parallel)
    : CausalLm(config, backend, seed, dtype, parallel, sequence_parallel, PipelineStage{}) {}

CausalLm::CausalLm(const DecoderConfig& config, const lf::backend::DeviceBackend& backend, uint64_t seed,
                   at::ScalarType dtype, const lf::dist::ParallelContext* parallel, bool sequence_parallel,
                   const PipelineStage& stage, bool trainable, ExpertPlacement experts)
    : CausalLm(config, backend, seed, parallel, stage, trainable,
               builder_for(seed, dtype, backend, parallel, sequence_parallel, trainable, experts), experts) {}

CausalLm::CausalLm(const DecoderConfig& config, const lf::backend::DeviceBackend& backend, uint64_t seed,
                   const lf::dist::ParallelContext* parallel, const PipelineStage& stage, bool trainable, ParamBuilder b,
                   ExpertPlacement experts)
    : backend_(backend), parallel_(parallel), trainable_(trainable), experts_(experts),
      foundation_(config, backend, b, stage, seed, parallel ? parallel->tp_rank() : 0, parallel ? parallel->pp_rank() : 0),
      head_([&] {
        b.set_keep(foundation_.stage().last);
        const bool same_stage = foundation_.stage().first;
        LmHead h(head_config(config, b.tp().size()), backend, b, same_stage ? &foundation_.embedding_weight() : nullptr,
                 foundation_.initial_embedding());
        b.set_keep(true);
        return h;
      }()) {
  foundation_.add_mtp(b, config.untie_embeddings_and_output_weights ? at::Tensor() : head_.weight());
  params_ = b.take();
  foundation_.release_initial_embedding();
  // DSA's warm-up stage trains the indexers only: every other weight frozen (no gradients, no
  // optimizer state), the indexers a trainable group of their own (parameter_groups).
  if (config.dsa_indexer_warmup)
    for (auto& p : params_)
      if (!is_dsa_indexer(p.name)) p.tensor.set_requires_grad(false);
  // Tied embeddings split over pipeline stages: the first stage's owner is summed with the last
  // stage's copy.
  const auto& st = foundation_.stage();
  // MTP layers on the last stage embed with a copy of the embedding too.
  if ((!config.untie_embeddings_and_output_weights || config.mtp_num_layers > 0) && st.first && !st.last)
    for (auto& p : params_)
      if (p.name == "embedding.word_embeddings.weight") p.pipeline_tied = true;
}

CausalLm::~CausalLm() = default;

void CausalLm::keep_context(std::unique_ptr<lf::dist::ParallelContext> c) {
  if (c) owned_contexts_.push_back(std::move(c));
}

const std::string& CausalLm::type() const { return kType; }

std::vector<Parameter> causal_lm_parameter_specs(const DecoderConfig& config) {
  ParamBuilder b = ParamBuilder::records_only();
  Decoder foundation(config, lf::backend::cpu_backend(), b, PipelineStage{}, 0, 0, 0);
  LmHead head(head_config(config, 1), lf::backend::cpu_backend(), b, &foundation.embedding_weight(),
              foundation.initial_embedding());
  foundation.add_mtp(b);
  return b.take();
}

std::map<std::string, lf::parallel::Sharding> causal_lm_shardings(const DecoderConfig& config) {
  std::map<std::string, lf::parallel::Sharding> out;
  for (const auto& p : causal_lm_parameter_specs(config)) out[p.name] = p.sharding;
  return out;
}

void CausalLm::add_lora(const LoraSpec& spec, uint64_t seed) {
  LF_CHECK(!lora_.enabled(), "CausalLm::add_lora: the model has LoRA adapters already");
  if (!spec.enabled()) return;
  LF_CHECK(!config().dsa_indexer_warmup, "LoRA adapters with DSA's warm-up stage (model.foundation.dsa_indexer_warmup), "
           "which trains the indexers only", lf::hint("drop --lora-rank or --dsa-indexer-warmup"));
  LF_CHECK(!params_.empty(), "CausalLm::add_lora: no parameters on this rank");
  ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(component_seed(seed, "lora")),
                 params_.front().tensor.scalar_type(), backend_.device(), foundation_.tp(), true);
  foundation_.add_lora(b, spec);
  lora_params_ = b.take();
  lora_ = spec;
  // The base is frozen: its tensors (shared with the layers) stop requiring grad.
  for (auto& p : params_) p.tensor.set_requires_grad(false);
  trainable_ = false;
}

std::vector<ParameterGroup> CausalLm::parameter_groups() const {
  // Model state (MoE expert biases) travels as a frozen group: saved and loaded, never trained.
  // Expert-parallel expert weights on the experts' own layout (reduced over expert-DP, files named
  // by the expert-parallel rank).
  // DSA warm-up: the indexers are the only trainable group.
  const bool warmup = config().dsa_indexer_warmup;
  ParameterGroup weights{"model", {}, parallel_, trainable_ && !warmup},
      experts{"experts", {}, experts_.context, trainable_ && !warmup}, state{"model_state", {}, parallel_, false},
      indexers{"dsa_indexer", {}, parallel_, trainable_};
  for (const auto& p : params_)
    (p.state ? state : p.expert ? experts : warmup && is_dsa_indexer(p.name) ? indexers : weights).params.push_back(p);
  std::vector<ParameterGroup> out{weights};
  if (!experts.params.empty()) out.push_back(experts);
  if (!state.params.empty()) out.push_back(state);
  if (!indexers.params.empty()) out.push_back(indexers);
  // LoRA adapters: the only trainable group; they follow the dense layers' layout.
  if (lora_.enabled()) {
    for (auto& g : out) g.base = true;
    out.push_back({"lora", lora_params_, parallel_, true});
  }
  return out;
}

at::Tensor CausalLm::expert_load() const {
  if (foundation_.num_moe_layers() == 0) return {};
  const auto& load = foundation_.moe_step().load();
  if (load.defined()) return load.clone();
  const auto& c = config();
  return at::zeros({static_cast<int64_t>(foundation_.num_moe_layers()), c.num_experts}, at::kFloat);
}

void CausalLm::end_step(const at::Tensor& global_expert_load) {
  // A frozen model (and DSA's warm-up, which freezes all but the indexers) keeps its expert biases.
  if (global_expert_load.defined() && trainable_ && !config().dsa_indexer_warmup)
    foundation_.update_expert_bias(global_expert_load);
  foundation_.moe_step().clear();
}

std::vector<std::string> CausalLm::batch_fields() const {
  return {"tokens", "labels", "loss_mask", "position_ids (optional)", "document_ids (optional)"};
}

double CausalLm::flops_per_sample(int64_t seq) const {
  return config().flops_per_token(seq) * static_cast<double>(seq);
}

std::map<std::string, at::Tensor> CausalLm::rng_state() const { return foundation_.rng().state(); }

void CausalLm::set_rng_state(const std::map<std::string, at::Tensor>& state) { foundation_.rng().set_state(state); }

namespace {
// The tokens whose loss counts: loss_mask (default: all) where the label is not ignored.
at::Tensor counted(const Batch& batch) {
  const at::Tensor& labels = batch.at("labels");
  at::Tensor keep = labels.ge(0).to(at::kFloat);
  if (const at::Tensor* mask = batch.find("loss_mask")) keep = keep * mask->to(at::kFloat);
  return keep;  // [b, s]
}
}  // namespace

std::map<std::string, double> CausalLm::loss_counts(const Batch& batch) const {
  std::map<std::string, double> counts{{"lm loss", counted(batch).sum().item<double>()}};
  // MoE auxiliary losses: each micro-batch's value is a mean over its tokens, so one unit each
  // (the step's value: the mean over micro-batches and data-parallel ranks).
  const auto& c = config();
  if (c.is_moe() && c.moe_router_load_balancing_type != "none" && c.moe_aux_loss_coeff > 0)
    counts[MoeStep::kLoadBalancingLoss] = 1;
  if (c.is_moe() && c.moe_z_loss_coeff > 0) counts[MoeStep::kZLoss] = 1;
  if (c.dsa() && c.dsa_indexer_loss_coeff > 0) counts[MoeStep::kIndexerLoss] = 1;  // DSA: a mean over queries
  // MTP: normalised by the main loss's tokens (Megatron with per-token loss).
  if (c.mtp_num_layers > 0) counts[kMtpLoss] = counts["lm loss"];
  return counts;
}

DecoderInputs CausalLm::inputs_of(const Batch& batch, int64_t seq) const {
  DecoderInputs in;
  in.seq = seq;
  if (const at::Tensor* p = batch.find("position_ids")) in.position_ids = *p;
  if (const at::Tensor* d = batch.find("document_ids")) in.document_ids = *d;
  if (cp_.on()) {
    in.cp = &cp_;
    // This rank's tokens sit at the CP layout's positions of the whole sequence.
    if (!in.position_ids.defined())
      in.position_ids = lf::parallel::cp_positions(seq * cp_.size(), cp_.size(), cp_.rank()).to(backend_.device());
  }
  return in;
}

void CausalLm::set_context_parallel(lf::parallel::CpCommType comm) {
  LF_CHECK(parallel_ && parallel_->cp_size() > 1, "set_context_parallel: the model's context has no context-parallel "
           "group (cp 1)");
  LF_CHECK(foundation_.num_mtp_layers() == 0, "context parallelism is built for models without multi-token prediction",
           lf::hint("set --context-parallel-size 1 for MTP models"));
  cp_.group = &parallel_->cp();
  if (parallel_->tp_size() > 1) cp_.with_tp = &parallel_->tp_cp();
  cp_.comm = comm;
}

Batch CausalLm::context_slice(const Batch& batch) const {
  const int n = cp_.size(), r = cp_.rank();
  Batch out;
  out.sample_indices = batch.sample_indices;
  for (const auto& [name, t] : batch.fields().items()) {
    const int64_t dim = batch.sequence_dim(name);
    // Per-token fields in the CP layout; document ids (attention needs the whole sequence's) and
    // per-sample fields (media) whole.
    if (dim >= 0 && name != "document_ids")
      out.set(name, lf::parallel::cp_slice(t, dim, n, r), dim);
    else
      out.set(name, t, dim);
  }
  LF_CHECK(out.at("tokens").size(1) * n == batch.at("tokens").size(1),
           "context parallelism: the batch's tokens are not marked as a sequence field",
           lf::hint("internal: the data source must set tokens with sequence dim 1"));
  return out;
}

at::Tensor CausalLm::context_share(const at::Tensor& x) const {
  return cp_.on() ? lf::parallel::cp_slice(x, 0, cp_.size(), cp_.rank()) : x;
}

HiddenInjection CausalLm::context_share(const HiddenInjection& injection) const {
  if (!cp_.on()) return injection;
  // The rows of `values` follow the mask's true entries in (sample, position) order; keep those at
  // this rank's positions, in the same order over the sliced mask.
  const at::Tensor mask = injection.mask.to(at::kCPU, at::kBool);
  const at::Tensor row = (mask.reshape({-1}).to(at::kLong).cumsum(0) - 1).view(mask.sizes());
  const at::Tensor local = lf::parallel::cp_slice(mask, 1, cp_.size(), cp_.rank());
  const at::Tensor rows = lf::parallel::cp_slice(row, 1, cp_.size(), cp_.rank()).masked_select(local);
  return {injection.layer, local.to(injection.mask.device()),
          injection.values.index_select(0, rows.to(injection.values.device()))};
}

at::Tensor CausalLm::embed_inputs(const Batch& batch) const {
  const at::Tensor& tokens = batch.at("tokens");
  return foundation_.embed(cp_.on() ? lf::parallel::cp_slice(tokens, 1, cp_.size(), cp_.rank()) : tokens, 0);
}

namespace {
// [b, s] -> [b, s]: every row moved one position left, `fill` at the end (Megatron's roll_tensor).
at::Tensor shift_left(const at::Tensor& t, double fill) {
  const int64_t s = t.size(1);
  return at::cat({t.narrow(1, 1, s - 1), at::full({t.size(0), 1}, fill, t.options())}, 1);
}
}  // namespace

at::Tensor CausalLm::mtp_loss_sum(const at::Tensor& x, const Batch& batch) const {
  LF_CHECK(!batch.contains("position_ids") && !batch.contains("document_ids"),
           "multi-token prediction shifts tokens across the whole row; packed documents (--reset-position-ids, "
           "--reset-attention-mask) would let it predict across document boundaries",
           lf::hint("drop --reset-position-ids / --reset-attention-mask, or --mtp-num-layers"));
  const auto& c = config();
  const int64_t depth = static_cast<int64_t>(foundation_.num_mtp_layers()), s = batch.at("tokens").size(1);
  // Layer k sees the tokens k + 1 ahead and predicts the labels k + 1 ahead; the last k + 1
  // positions have no target. Each layer's token losses weigh factor / depth.
  const double w = c.mtp_loss_scaling_factor / static_cast<double>(depth);
  at::Tensor tokens = batch.at("tokens"), labels = batch.at("labels"), mask = counted(batch);
  at::Tensor h = x, total;
  for (int64_t k = 0; k < depth; ++k) {
    tokens = shift_left(tokens, 0);
    labels = shift_left(labels, -100);
    mask = shift_left(mask, 0);
    h = foundation_.mtp_forward(static_cast<size_t>(k), h, tokens.to(backend_.device()), inputs_of(batch, s));
    at::Tensor weight = mask.to(backend_.device()).t().reshape({-1}) * w;
    at::Tensor term = head_.loss_sum(foundation_.mtp_final_norm(static_cast<size_t>(k), h), labels, weight, kMtpLoss);
    total = total.defined() ? total + term : term;
  }
  return total;
}

std::vector<at::Tensor> CausalLm::mtp_logits(const at::Tensor& tokens) const {
  check_whole_model("mtp_logits");
  LF_CHECK(!sequence_parallel(), "mtp_logits with sequence parallelism",
           lf::hint("build the model for inference without sequence_parallel"));
  const int64_t s = tokens.size(1);
  DecoderInputs in;
  in.seq = s;
  at::Tensor t = tokens.to(backend_.device());
  at::Tensor h = foundation_.run_layers(foundation_.embed(t, 0), in);
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < foundation_.num_mtp_layers(); ++k) {
    t = shift_left(t, 0);
    h = foundation_.mtp_forward(k, h, t, in);
    out.push_back(head_.full_logits(head_.local_logits(foundation_.mtp_final_norm(k, h))));
  }
  return out;
}

StageOutput CausalLm::head_output(const at::Tensor& x, const Batch& batch, Pass pass) const {
  StageOutput out;
  const at::Tensor& labels = batch.at("labels");
  const at::Tensor keep = counted(batch).to(backend_.device()).t().reshape({-1});  // [s b]
  if (pass == Pass::train) {
    out.losses.push_back({"lm loss", head_.loss_sum(foundation_.final_norm(x), labels, keep)});
    if (foundation_.num_mtp_layers() > 0) out.losses.push_back({kMtpLoss, mtp_loss_sum(x, batch)});
    return out;
  }
  auto logits = head_.local_logits(foundation_.final_norm(x));  // [s, b, v_pad / tp]
  auto full = head_.full_logits(logits);  // [s, b, v]
  auto target = labels.t().reshape({-1}).to(backend_.device());
  auto flat = full.reshape({-1, full.size(-1)});
  const double tokens = keep.sum().item<double>();
  out.metrics["lm loss"] = {(lf::ops::softmax_cross_entropy(backend_, flat, target) * keep).sum().item<double>(), tokens};
  out.metrics["accuracy"] = {(flat.argmax(-1).eq(target).to(at::kFloat) * keep).sum().item<double>(), tokens};
  return out;
}

StageOutput CausalLm::stage_forward(const Batch& whole, const TensorMap& input, int64_t chunk, Pass pass) {
  const Batch local = cp_.on() ? context_slice(whole) : Batch();
  const Batch& batch = cp_.on() ? local : whole;
  const auto& st = foundation_.stage();
  const auto [lo, hi] = foundation_.chunk_layers(chunk);
  const bool embeds = st.first && chunk == 0, heads = st.last && chunk == st.num_chunks() - 1;
  const int64_t s = batch.at("tokens").size(1);
  at::Tensor x = embeds ? embed_inputs(whole) : input.at("hidden_states");
  x = foundation_.run_layers(x, inputs_of(batch, s), lo, hi);
  if (!heads) {
    StageOutput out;
    out.activations.set("hidden_states", x);
    return out;
  }
  return head_output(x, batch, pass);
}

StageOutput CausalLm::chunk_forward(const Batch& whole, const TensorMap& input, int64_t start, ChunkAttention& kv,
                                    bool with_head, Pass pass) {
  // Under context parallelism each chunk is split over the CP ranks like a sequence (its keys and
  // values gathered in attention).
  const Batch local = cp_.on() ? context_slice(whole) : Batch();
  const Batch& chunk = cp_.on() ? local : whole;
  const auto& st = foundation_.stage();
  LF_CHECK(st.num_chunks() == 1, "ChunkPipe runs one model chunk per pipeline rank; this stage has ", describe_stage(),
           lf::hint("drop --num-layers-per-virtual-pipeline-stage with --chunkpipe-chunk-size"));
  LF_CHECK(!chunk.contains("position_ids") && !chunk.contains("document_ids"),
           "ChunkPipe chunks keep the positions of one sequence: per-sample position ids and document masks "
           "(--reset-position-ids, --reset-attention-mask) are not supported with it",
           lf::hint("drop --reset-position-ids / --reset-attention-mask, or --chunkpipe-chunk-size"));
  const int64_t c = chunk.at("tokens").size(1);
  at::Tensor x = st.first ? foundation_.embed(chunk.at("tokens"), start) : input.at("hidden_states");
  DecoderInputs in;
  in.start = start;
  in.seq = c;
  in.chunk = &kv;
  if (cp_.on()) {
    in.cp = &cp_;
    const int64_t chunk_len = whole.at("tokens").size(1);
    in.position_ids = (lf::parallel::cp_positions(chunk_len, cp_.size(), cp_.rank()) + start).to(backend_.device());
  }
  x = foundation_.run_layers(x, in);
  if (!st.last || !with_head) {
    StageOutput out;
    out.activations.set("hidden_states", x);
    return out;
  }
  return head_output(x, chunk, pass);
}

// --- token-tensor calls ---------------------------------------------------------------------

void CausalLm::check_whole_model(const char* what) const {
  const auto& st = foundation_.stage();
  LF_CHECK(st.first && st.last && st.num_chunks() == 1, what, " needs the whole model; this one is a pipeline stage with ",
           describe_stage(), lf::hint("run a pipeline stage with stage_forward() under a pipeline schedule"));
}

at::Tensor CausalLm::local_logits(const at::Tensor& tokens, KvCache* cache) const {
  LF_CHECK(tokens.dim() == 2, "tokens must be [batch, seq], got ", tokens.sizes());
  LF_CHECK(!cache || !sequence_parallel(), "incremental decoding with sequence parallelism",
           lf::hint("build the model for generation without sequence_parallel"));
  const int64_t s = tokens.size(1), start = cache ? cache->length : 0;
  DecoderInputs in;
  in.start = start;
  in.seq = s;
  in.cache = cache;
  return head_.local_logits(foundation_.final_norm(foundation_.run_layers(foundation_.embed(tokens, start), in)));
}

at::Tensor CausalLm::forward(const at::Tensor& tokens) const {
  check_whole_model("CausalLm::forward");
  return head_.full_logits(local_logits(tokens, nullptr));
}

at::Tensor CausalLm::forward(const at::Tensor& tokens, KvCache& cache) const {
  check_whole_model("CausalLm::forward with a KV cache");
  at::NoGradGuard no_grad;
  return head_.full_logits(local_logits(tokens, &cache));
}

at::Tensor CausalLm::loss(const at::Tensor& tokens, const at::Tensor& labels) const {
  check_whole_model("CausalLm::loss");
  return head_.loss(local_logits(tokens, nullptr), labels);
}

at::Tensor CausalLm::stage_forward(const at::Tensor& input, const at::Tensor& labels, int64_t chunk) const {
  LF_CHECK(input.defined(), "pipeline stage with ", describe_stage(), ": no input");
  const auto& st = foundation_.stage();
  const auto [lo, hi] = foundation_.chunk_layers(chunk);
  const bool embeds = st.first && chunk == 0, heads = st.last && chunk == st.num_chunks() - 1;
  const auto& c = config();
  at::Tensor x;
  DecoderInputs in;
  if (embeds) {
    in.seq = input.size(-1);
    x = foundation_.embed(input, 0);
  } else {
    LF_CHECK(input.dim() == 3 && input.size(2) == c.hidden_size, "pipeline stage with ", describe_stage(),
             ": hidden states must be [s, b, ", c.hidden_size, "], got ", input.sizes());
    // Under SP the stages exchange sequence chunks [s / tp, b, h].
    in.seq = input.size(0) * (sequence_parallel() ? tp_size() : 1);
    x = input;
  }
  x = foundation_.run_layers(x, in, lo, hi);
  if (!heads) return x;
  auto logits = head_.local_logits(foundation_.final_norm(x));
  return labels.defined() ? head_.loss(logits, labels) : head_.full_logits(logits);
}

at::Tensor CausalLm::stage_forward_chunk(const at::Tensor& input, const at::Tensor& labels, int64_t start,
                                         ChunkAttention& kv, bool with_head) const {
  const auto& st = foundation_.stage();
  LF_CHECK(st.num_chunks() == 1, "ChunkPipe runs one model chunk per pipeline rank; this stage has ", describe_stage(),
           lf::hint("drop --num-layers-per-virtual-pipeline-stage with --chunkpipe-chunk-size"));
  LF_CHECK(input.defined(), "pipeline stage with ", describe_stage(), ": no input");
  DecoderInputs in;
  in.start = start;
  in.chunk = &kv;
  at::Tensor x;
  if (st.first) {
    in.seq = input.size(-1);
    x = foundation_.embed(input, start);
  } else {
    in.seq = input.size(0) * (sequence_parallel() ? tp_size() : 1);
    x = input;
  }
  x = foundation_.run_layers(x, in);
  if (!st.last || !with_head) return x;
  auto logits = head_.local_logits(foundation_.final_norm(x));
  return labels.defined() ? head_.loss(logits, labels) : head_.full_logits(logits);
}

void CausalLm::load_full_lora(const std::map<std::string, at::Tensor>& full) {
  at::NoGradGuard no_grad;
  LF_CHECK(lora_.enabled(), "load_full_lora: the model has no LoRA adapters",
           lf::hint("build it with add_lora (the adapter's rank and target modules) first"));
  std::set<std::string> mine;
  for (auto& p : lora_params_) {
    mine.insert(p.name);
    auto it = full.find(p.name);
    LF_CHECK(it != full.end(), "LoRA adapter tensor ", p.name, " is missing",
             lf::hint("the adapter was trained with other target modules or layers"));
    const auto want = p.full_shape();
    LF_CHECK(it->second.sizes().vec() == want, "LoRA adapter tensor ", p.name, " has shape ", it->second.sizes(),
             ", the model needs ", c10::IntArrayRef(want),
             lf::hint("the adapter's rank or the base model's sizes differ"));
    p.tensor.copy_(p.sharding.shard(it->second, p.tp_rank, p.tp_size));
  }
  for (const auto& [name, t] : full) {
    if (mine.count(name)) continue;
    const std::string layers = "decoder.layers.";
    bool other_stage = false;
    if (name.rfind(layers, 0) == 0) {
      const int64_t i = std::atoll(name.c_str() + layers.size());
      bool here = false;
      for (const auto& r : foundation_.stage().chunks) here = here || (i >= r.begin && i < r.end);
      other_stage = !here && i < config().num_layers;
    }
    LF_CHECK(other_stage, "LoRA adapter tensor ", name, " has no place in this model",
             lf::hint("the adapter targets modules this run does not (--lora-target-modules) or another model"));
  }
}

void CausalLm::load_full_parameters(const std::map<std::string, at::Tensor>& full) {
  at::NoGradGuard no_grad;
  const auto& c = config();
  std::vector<std::string> missing;
  for (auto& p : params_) {
    auto it = full.find(p.name);
    if (it == full.end()) {
      missing.push_back(p.name);
      continue;
    }
    at::Tensor t = it->second;
    const int64_t v_pad = c.padded_vocab_size(p.tp_size);
    if (p.sharding.vocab && t.dim() == 2 && t.size(0) != v_pad && t.size(0) >= c.vocab_size) {
      // Real rows only (HF), or padded for another TP size: keep the real rows, pad with zeros.
      t = t.narrow(0, 0, c.vocab_size);
      t = at::cat({t, at::zeros({v_pad - c.vocab_size, t.size(1)}, t.options())}, 0);
    }
    const auto want = p.full_shape();
    LF_CHECK(t.sizes().vec() == want, "parameter ", p.name, ": the given tensor has shape ", t.sizes(),
             ", the model needs ", c10::IntArrayRef(want),
             lf::hint("the weights belong to a model with a different configuration"));
    p.tensor.copy_(p.sharding.shard(t, p.tp_rank, p.tp_size));
  }
  LF_CHECK(missing.empty(), missing.size(), " parameters missing, first: ", missing.empty() ? "" : missing[0],
           lf::hint("the weights belong to a different model family or configuration"));
  if (full.size() == params_.size()) return;
  const auto& st = foundation_.stage();
  const bool whole = st.first && st.last;
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
                std::stoll(idx) < c.num_layers;
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

}  // namespace lf::models

#include "causal_lm_plan.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/parallel/context/context_parallel.h"
#include "loongforge/parallel/pipeline/schedules.h"
#include "plan_text.h"

namespace lf::models {

CausalLmPlan::CausalLmPlan(std::shared_ptr<const ModelConfig> config, const PlanArgs& args,
                           lf::config::ErrorList& errors)
    : config_(std::move(config)), job_(*args.job), layout_(*args.layout),
      foundation_(config_->fields<DecoderConfig>("foundation")),
      frozen_(config_->component("foundation").settings.freeze) {
  foundation_.validate_layout(*args.resolved, layout_.size(lf::dist::Axis::tp), job_.parallel.sequence_parallel,
                              job_.training.seq_length, errors);
  {
    const auto origin = [&](const std::string& path) {
      const auto* n = args.resolved->find_path(path);
      return n ? n->origin() : lf::config::Origin::from_default();
    };
    const int ep = layout_.size(lf::dist::Axis::ep), tp = layout_.size(lf::dist::Axis::tp);
    const int etp = layout_.expert_tp_size();
    const bool given_etp = job_.parallel.expert_tensor_parallel_size.has_value();
    expert_parallel_ = foundation_.is_moe() && (ep > 1 || (etp == 1 && tp > 1));
    if (!foundation_.is_moe() && (ep > 1 || given_etp))
      errors.add(ep > 1 ? "parallel.expert_model_parallel_size" : "parallel.expert_tensor_parallel_size",
                 origin(ep > 1 ? "parallel.expert_model_parallel_size" : "parallel.expert_tensor_parallel_size"),
                 "this model has no experts (model.foundation.num_experts 0): expert parallel sizes would do nothing",
                 "drop --expert-model-parallel-size / --expert-tensor-parallel-size, or choose a MoE model");
    if (expert_parallel_ && foundation_.num_experts % ep != 0)
      errors.add("parallel.expert_model_parallel_size", origin("parallel.expert_model_parallel_size"),
                 std::to_string(foundation_.num_experts) + " experts (model.foundation.num_experts) do not split over " +
                     std::to_string(ep) + " expert-parallel ranks",
                 "choose --expert-model-parallel-size dividing the number of experts");
    if (expert_parallel_ && tp > 1 && etp == 1 && !job_.parallel.sequence_parallel)
      errors.add("parallel.sequence_parallel", origin("parallel.sequence_parallel"),
                 "with expert tensor-parallel size 1 under tensor parallelism each TP rank routes its own chunk of the "
                 "sequence (as Megatron requires for MoE with TP): sequence parallelism must be on",
                 "add --sequence-parallel");
    if (expert_parallel_ && tp > 1 && etp == 1 && foundation_.moe_expert_capacity_factor > 0)
      errors.add("model.foundation.moe_expert_capacity_factor", origin("model.foundation.moe_expert_capacity_factor"),
                 "the capacity limit counts a rank's tokens; with expert TP 1 under TP a rank holds a chunk of the "
                 "sequence, so which tokens drop would depend on the TP size",
                 "drop the capacity factor (dropless), or leave --expert-tensor-parallel-size unset");
    if (const std::string problem = layout_.expert_layout_problem(); expert_parallel_ && !problem.empty())
      errors.add("parallel.order", origin("parallel.order"), problem,
                 "use an order with tp then ep (e.g. tp-cp-ep-dp-pp), or --expert-tensor-parallel-size 1");
    const auto& par = job_.parallel;
    if (par.overlap_moe_expert_parallel_comm && (!expert_parallel_ || ep == 1 || par.moe_token_dispatcher_type != "alltoall"))
      errors.add("parallel.overlap_moe_expert_parallel_comm", origin("parallel.overlap_moe_expert_parallel_comm"),
                 "the MoE communication overlap hides the expert-parallel all-to-all, and this job has " +
                     std::string(!expert_parallel_ || ep == 1 ? "no expert parallelism (ep 1)" : "the all-gather dispatcher"),
                 "use --expert-model-parallel-size N (N > 1) with --moe-token-dispatcher-type alltoall, or drop "
                 "--overlap-moe-expert-parallel-comm");
    if (par.delay_wgrad_compute && !par.overlap_moe_expert_parallel_comm)
      errors.add("parallel.delay_wgrad_compute", origin("parallel.delay_wgrad_compute"),
                 "--delay-wgrad-compute reorders the overlapped MoE backward (as in Megatron, it needs the all-to-all "
                 "overlap), and the overlap is off",
                 "add --overlap-moe-expert-parallel-comm (with --expert-model-parallel-size N > 1), or drop "
                 "--delay-wgrad-compute");
    // Values that differ from the defaults (a checkpoint's config.yaml, which writes every key, runs
    // again as a job file).
    const lf::config::ParallelConfig defaults;
    if (par.moe_overlap_micro_batches != defaults.moe_overlap_micro_batches && !par.overlap_moe_expert_parallel_comm)
      errors.add("parallel.moe_overlap_micro_batches", origin("parallel.moe_overlap_micro_batches"),
                 "parallel.moe_overlap_micro_batches is set but the MoE communication overlap is off",
                 "add --overlap-moe-expert-parallel-comm, or drop parallel.moe_overlap_micro_batches");
    if (par.overlap_moe_expert_parallel_comm && par.moe_overlap_num_chunks == 1 && !pairs_micro_batches()) {
      // One chunk overlaps only with the other micro-batch of a pair.
      const int64_t micro_batches = micro_batches_per_step();
      errors.add("parallel.moe_overlap_num_chunks", origin("parallel.moe_overlap_num_chunks"),
                 "one chunk overlaps the all-to-all only with the other micro-batch of a forward/backward pair, "
                 "and this job pairs none (" +
                     std::string(!par.moe_overlap_micro_batches
                                     ? "the overlap across micro-batches is off"
                                     : std::to_string(micro_batches) + " micro-batch(es) a step, not more than pp " +
                                           std::to_string(layout_.size(lf::dist::Axis::pp))) +
                     ")",
                 "use --moe-overlap-num-chunks 2 or more, or more micro-batches a step than pipeline stages");
    }
    if (par.moe_overlap_num_chunks && !par.overlap_moe_expert_parallel_comm)
      errors.add("parallel.moe_overlap_num_chunks", origin("parallel.moe_overlap_num_chunks"),
                 "--moe-overlap-num-chunks is set but the MoE communication overlap is off",
                 "add --overlap-moe-expert-parallel-comm, or drop --moe-overlap-num-chunks");
    if (!expert_parallel_ && par.moe_token_dispatcher_type != defaults.moe_token_dispatcher_type)
      errors.add("parallel.moe_token_dispatcher_type", origin("parallel.moe_token_dispatcher_type"),
                 "no tokens are dispatched: every rank holds every expert (expert parallelism is off)",
                 "drop --moe-token-dispatcher-type, or add --expert-model-parallel-size N");
    if (foundation_.mtp_num_layers > 0) {
      const std::string key = "model.foundation.mtp_num_layers";
      if (job_.parallel.chunkpipe_chunk_size)
        errors.add(key, origin(key), "multi-token prediction needs the tokens ahead of each chunk: not with ChunkPipe",
                   "drop --chunkpipe-chunk-size or --mtp-num-layers");
      if (job_.data.reset_position_ids || job_.data.reset_attention_mask || job_.data.packing_sft_data)
        errors.add(key, origin(key),
                   "multi-token prediction shifts tokens across the whole row; with packed documents "
                   "(--reset-position-ids / --reset-attention-mask / --packing-sft-data) it would predict across "
                 "document boundaries",
                   "drop --reset-position-ids / --reset-attention-mask / --packing-sft-data, or --mtp-num-layers");
    }
    if (job_.lora.rank > 0) {
      const auto spec = lora_spec();
      const std::string key = "lora.target_modules";
      for (LoraModule m : spec.targets) {
        if (is_attention_module(m) && foundation_.multi_latent_attention)
          errors.add(key, origin(key),
                     std::string("LoRA target ") + lora_module_name(m) +
                         ": this model uses multi-latent attention, whose projections are not q/k/v/o_proj",
                     "target the MLP modules only, e.g. --lora-target-modules gate_proj up_proj down_proj");
        if (!is_attention_module(m) && (foundation_.is_moe() || !foundation_.swiglu))
          errors.add(key, origin(key),
                     std::string("LoRA target ") + lora_module_name(m) + ": this model's MLP is " +
                         (foundation_.is_moe() ? "a mixture of experts" : "a GELU MLP") +
                         ", not gate/up/down projections",
                     "target the attention modules only, e.g. --lora-target-modules q_proj k_proj v_proj o_proj");
      }
    }
    if (const int cp = layout_.size(lf::dist::Axis::cp); cp > 1) {
      const std::string key = "parallel.context_parallel_size";
      if (foundation_.mtp_num_layers > 0)
        errors.add(key, origin(key),
                   "context parallelism with multi-token prediction (model.foundation.mtp_num_layers) is not built: "
                   "its shifted tokens cross the context-parallel chunks",
                   "set --context-parallel-size 1, or model.foundation.mtp_num_layers 0");
      if (foundation_.is_moe() && foundation_.moe_expert_capacity_factor > 0)
        errors.add("model.foundation.moe_expert_capacity_factor", origin("model.foundation.moe_expert_capacity_factor"),
                   "the capacity limit counts a rank's tokens; under context parallelism a rank holds 1/cp of each "
                   "sequence, so which tokens drop would depend on the CP size",
                   "drop the capacity factor (dropless) with --context-parallel-size > 1");
      const int64_t heads = foundation_.num_attention_heads / tp;
      if (job_.parallel.cp_comm_type == "a2a" && heads % cp != 0)
        errors.add("parallel.cp_comm_type", origin("parallel.cp_comm_type"),
                   "a2a (Ulysses) gives each context-parallel rank 1/cp of the attention heads: " +
                       std::to_string(heads) + " heads per tensor-parallel rank do not divide by cp " + std::to_string(cp),
                   "use --cp-comm-type p2p, or a CP size dividing " + std::to_string(heads));
    }
    if (foundation_.is_moe() && job_.parallel.chunkpipe_chunk_size)
      errors.add("parallel.chunkpipe_chunk_size", origin("parallel.chunkpipe_chunk_size"),
                 "ChunkPipe would route each chunk of a sequence on its own, which changes the per-sequence and "
                 "per-batch load-balancing losses; MoE models train on whole sequences",
                 "drop --chunkpipe-chunk-size");
  }
  // The pipeline split (layers not divisible by pp, bad first/last stage sizes, virtual stages:
  // errors naming the values), and the interleaved schedule's micro-batch count.
  const auto counts = stage_counts();
  LF_CHECK(counts.front().chunks.size() == 1 || !job_.parallel.chunkpipe_chunk_size,
           "ChunkPipe runs one model chunk per pipeline rank, parallel.pipeline_model_parallel_layout '",
           job_.parallel.pipeline_model_parallel_layout.value_or(""), "' gives ", counts.front().chunks.size(),
           lf::hint("list exactly pp stages in the layout with --chunkpipe-chunk-size"));
  const int pp = layout_.size(lf::dist::Axis::pp);
  if (counts.front().chunks.size() > 1)
    lf::parallel::pipeline::interleaved_1f1b_order(0, pp, static_cast<int>(counts.front().chunks.size()),
                                                   micro_batches_per_step());
}

double CausalLmPlan::lora_parameters_per_rank(int64_t layers) const {
  const auto spec = lora_spec();
  if (!spec.enabled()) return 0;
  const auto& m = foundation_;
  const double tp = layout_.size(lf::dist::Axis::tp), r = static_cast<double>(spec.rank),
               h = static_cast<double>(m.hidden_size), q = static_cast<double>(m.num_attention_heads * m.head_dim()),
               kv = static_cast<double>(m.query_groups() * m.head_dim()), f = static_cast<double>(m.ffn_hidden_size);
  double per_layer = 0;
  // Column adapters: A [r, in] replicated, B [out, r] split; row adapters: A split, B replicated.
  for (LoraModule mod : spec.targets) {
    switch (mod) {
      case LoraModule::q_proj: per_layer += r * h + q * r / tp; break;
      case LoraModule::k_proj:
      case LoraModule::v_proj: per_layer += r * h + kv * r / tp; break;
      case LoraModule::o_proj: per_layer += r * q / tp + h * r; break;
      case LoraModule::gate_proj:
      case LoraModule::up_proj: per_layer += r * h + f * r / tp; break;
      case LoraModule::down_proj: per_layer += r * f / tp + h * r; break;
    }
  }
  return per_layer * static_cast<double>(layers);
}

LoraSpec CausalLmPlan::lora_spec() const {
  const auto& l = job_.lora;
  if (l.rank == 0) return {};
  return LoraSpec::from(l.rank, l.alpha, l.dropout, l.use_rslora, l.target_modules);
}

lf::parallel::pipeline::StageSplit CausalLmPlan::stage_split() const {
  lf::parallel::pipeline::StageSplit s;
  s.first_stage_layers = job_.parallel.decoder_first_pipeline_num_layers;
  s.last_stage_layers = job_.parallel.decoder_last_pipeline_num_layers;
  if (layout_.size(lf::dist::Axis::pp) > 1) s.layers_per_virtual_stage = job_.parallel.num_layers_per_virtual_pipeline_stage;
  s.layout = job_.parallel.pipeline_model_parallel_layout;
  return s;
}

int64_t CausalLmPlan::num_parameters() const { return foundation_.num_parameters(); }

std::string CausalLmPlan::summary() const {
  std::ostringstream os;
  os << config_->type << ": " << num_parameters() << " parameters, " << foundation_.num_layers << " layers, hidden "
     << foundation_.hidden_size;
  return os.str();
}

DataNeeds CausalLmPlan::data_needs() const {
  DataNeeds d;
  d.vocab_size = foundation_.vocab_size;
  return d;
}

std::unique_ptr<Model> CausalLmPlan::build(const BuildArgs& args) const {
  const auto& ctx = *args.context;
  const auto stage = lf::parallel::pipeline::pipeline_stage(foundation_.num_layers, ctx.pp_size(), ctx.pp_rank(), stage_split());
  auto experts = make_expert_context(args);
  auto model = std::make_unique<CausalLm>(foundation_, *args.backend, args.seed, args.dtype, &ctx,
                                          job_.parallel.sequence_parallel, stage, !frozen_,
                                          ExpertPlacement{experts.get(), job_.parallel.moe_token_dispatcher_type == "allgather",
                                                          overlap_chunks(),
                                                          job_.parallel.delay_wgrad_compute, pairs_micro_batches(),
                                                          expert_parallel_ && layout_.expert_tp_size() > 1});
  model->keep_context(std::move(experts));
  apply_context_parallel(*model, ctx);
  model->add_lora(lora_spec(), args.seed);
  return model;
}

void CausalLmPlan::apply_context_parallel(CausalLm& model, const lf::dist::ParallelContext& ctx) const {
  if (ctx.cp_size() > 1) model.set_context_parallel(lf::parallel::parse_cp_comm_type(job_.parallel.cp_comm_type));
}

int64_t CausalLmPlan::micro_batches_per_step() const {
  const int64_t per_step = job_.training.micro_batch_size * layout_.size(lf::dist::Axis::dp);
  return job_.training.global_batch_size.value_or(per_step) / per_step;
}

// The model carries the answer (ExpertPlacement::pair_micro_batches), the trainer asks it: more
// micro-batches than stages, so that every stage has pairs in its steady state.
bool CausalLmPlan::pairs_micro_batches() const {
  const auto& par = job_.parallel;
  return par.overlap_moe_expert_parallel_comm && par.moe_overlap_micro_batches &&
         micro_batches_per_step() > layout_.size(lf::dist::Axis::pp) && !par.chunkpipe_chunk_size;
}

int CausalLmPlan::overlap_chunks() const {
  if (!job_.parallel.overlap_moe_expert_parallel_comm) return 0;
  return static_cast<int>(job_.parallel.moe_overlap_num_chunks.value_or(pairs_micro_batches() ? 1 : 2));
}

std::unique_ptr<lf::dist::ParallelContext> CausalLmPlan::make_expert_context(const BuildArgs& args) const {
  if (!expert_parallel_) return nullptr;
  LF_CHECK(args.make_context != nullptr, "expert parallelism needs BuildArgs::make_context",
           lf::hint("internal: the caller must be able to build the experts' context"));
  std::vector<int> ranks(static_cast<size_t>(layout_.world_size()));
  for (int r = 0; r < layout_.world_size(); ++r) ranks[static_cast<size_t>(r)] = r;
  return args.make_context("experts", layout_.expert_layout(), ranks);
}

std::vector<CausalLmPlan::StageCount> CausalLmPlan::stage_counts() const {
  const auto& m = foundation_;
  const int pp = layout_.size(lf::dist::Axis::pp);
  // num_parameters() = vocab table(s) + layers + final norm; every layer has the same count.
  const int64_t h = m.hidden_size, vocab = m.padded_vocab_size() * h;
  const int64_t final_norm = m.normalization == "LayerNorm" ? 2 * h : h;
  std::vector<StageCount> out;
  for (int k = 0; k < pp; ++k) {
    const auto stage = lf::parallel::pipeline::pipeline_stage(m.num_layers, pp, k, stage_split());
    StageCount c{stage.chunks, 0, 0, 0, ""};
    for (const auto& r : stage.chunks) {
      c.layers += r.size();
      for (int64_t i = r.begin; i < r.end; ++i) c.params += m.layer_parameters(i), c.experts += m.routed_expert_parameters(i);
    }
    if (k == 0) c.params += vocab, c.extra += " + embedding";
    if (k == pp - 1) {
      c.params += final_norm + m.mtp_parameters();
      c.experts += m.mtp_num_layers * m.routed_experts_per_moe_layer();
      if (m.mtp_num_layers > 0) c.extra += " + " + std::to_string(m.mtp_num_layers) + " MTP layer(s)";
      // Tied embeddings over several stages: the last stage holds a copy as its output layer.
      if (m.untie_embeddings_and_output_weights || pp > 1) c.params += vocab;
      if (m.mtp_num_layers > 0 && pp > 1 && m.untie_embeddings_and_output_weights)
        c.params += vocab, c.extra += " + the MTP layers' embedding copy";
      c.extra += m.untie_embeddings_and_output_weights ? " + final norm + output layer"
                                                       : (pp > 1 ? " + final norm + tied output copy" : " + final norm");
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::string CausalLmPlan::stage_assignment() const {
  const int tp = layout_.size(lf::dist::Axis::tp), pp = layout_.size(lf::dist::Axis::pp);
  std::ostringstream os;
  os << "pipeline stages (" << pp << "):\n";
  const auto counts = stage_counts();
  for (size_t k = 0; k < counts.size(); ++k) {
    const auto& c = counts[k];
    os << "  stage " << k << ": layers ";
    for (size_t j = 0; j < c.chunks.size(); ++j) {
      os << (j ? " + " : "");
      if (c.chunks[j].size() == 0)
        os << "none";  // an empty model chunk (a layout string's embedding- or loss-only stage)
      else
        os << c.chunks[j].begin << ".." << c.chunks[j].end - 1;
    }
    os << " (" << c.layers << (c.chunks.size() > 1 ? " in " + std::to_string(c.chunks.size()) + " model chunks" : "")
       << ")" << c.extra << " | " << c.params << " parameters ("
       << (c.params - c.experts) / tp + c.experts / (expert_parallel_ ? layout_.size(lf::dist::Axis::ep) : tp)
       << " per rank, / tp " << tp << (expert_parallel_ ? ", experts / ep " + std::to_string(layout_.size(lf::dist::Axis::ep)) : "")
       << ")\n";
  }
  return os.str();
}

// Per-rank estimates from the stage's parameter count and Megatron's activation formula for a
// layer, 34*s*b*h bytes in 16-bit (/tp; doubled in fp32) for the s tokens a rank holds (s / cp
// under context parallelism). Megatron's 5*a*s^2*b term (scores, softmax, dropout mask) is not
// held here: attention saves q, k, v, its output and the logsumexp, and recomputes the scores
// in backward. Full recomputation keeps only the input of a recomputed layer group ([s, b, h])
// plus one group's activations while it is recomputed. Under 1F1B stage k holds the
// activations of up to pp - k micro-batches at once (pp - k + 1 when the MoE overlap pairs
// micro-batches); interleaved, up to its warm-up forwards + 1 model chunks' worth.
std::string CausalLmPlan::estimates() const {
  const auto& m = foundation_;
  const auto& job = job_;
  const int tp = layout_.size(lf::dist::Axis::tp), pp = layout_.size(lf::dist::Axis::pp),
            dp = layout_.size(lf::dist::Axis::dp);
  const bool half = job.training.bf16 || job.training.fp16;
  const double s = job.training.seq_length, b = job.training.micro_batch_size, h = m.hidden_size;
  const int cp = layout_.size(lf::dist::Axis::cp);
  const double tokens = s / cp;  // this rank's tokens of a sample
  const double act_per_layer = tokens * b * h * 34 / tp * (half ? 1 : 2);
  const double layer_input = tokens * b * h / (job.parallel.sequence_parallel ? tp : 1) * (half ? 2 : 4);
  // Full recomputation: the bytes a stage holds for `layers` layers of one micro-batch.
  const auto& t = job.training;
  auto held = [&](int64_t layers) {
    const double l = static_cast<double>(layers);
    if (t.recompute_granularity.value_or("") != "full" || !t.recompute_num_layers || layers == 0)
      return act_per_layer * l;
    const double n = std::min<double>(static_cast<double>(*t.recompute_num_layers), l);
    if (t.recompute_method.value_or("uniform") == "uniform")
      return std::ceil(l / n) * layer_input + n * act_per_layer;  // group inputs + one group recomputing
    return n * layer_input + (l - n) * act_per_layer + act_per_layer;  // block: the first n layers
  };
  const int64_t micro_batches = micro_batches_per_step();
  std::ostringstream os;
  os << "per-rank estimates" << (pp > 1 ? " by pipeline stage" : "") << " (every rank of a pipeline stage is alike):\n";
  const auto counts = stage_counts();
  for (size_t k = 0; k < counts.size(); ++k) {
    // Dense weights split over tp (ZeRO-1: optimizer over dp); routed experts over ep under expert
    // parallelism (ZeRO-1: over expert-DP), else over tp like the dense MLP.
    const int ep = layout_.size(lf::dist::Axis::ep), edp = layout_.expert_dp_size();
    const double expert_split = expert_parallel_ ? ep * layout_.expert_tp_size() : tp;
    const double dense = static_cast<double>(counts[k].params - counts[k].experts) / tp;
    const double experts = static_cast<double>(counts[k].experts) / expert_split;
    // LoRA: the base is frozen (weights only); the adapters are the trainable parameters.
    const double adapters = lora_parameters_per_rank(static_cast<int64_t>(counts[k].layers));
    const double params = dense + experts + adapters;
    const bool base_frozen = frozen_ || adapters > 0;
    const double trainable = base_frozen ? adapters : params;
    const double weight_bytes = params * (half ? 2 : 4);
    const double grad_bytes = trainable * 4;  // fp32 main gradients
    const double per_param = 8 + (half ? 4 : 0);  // Adam m, v (+ fp32 master)
    double optim_bytes = job.optimizer.use_distributed_optimizer
                             ? per_param * (base_frozen ? adapters / dp : dense / dp + experts / (expert_parallel_ ? edp : dp))
                             : per_param * trainable;
    const auto& c = counts[k];
    const int64_t v = static_cast<int64_t>(c.chunks.size());
    int64_t chunk_layers = 0;  // the largest model chunk (a layout may make them uneven)
    for (const auto& r : c.chunks) chunk_layers = std::max(chunk_layers, r.size());
    int64_t in_flight = pp > 1 ? std::min<int64_t>(pp - static_cast<int64_t>(k), micro_batches) : 1;
    // The MoE overlap across micro-batches: one more (a pair's forward beside the backward).
    if (pairs_micro_batches()) in_flight = std::min<int64_t>(pp - static_cast<int64_t>(k) + 1, micro_batches);
    double act = held(c.layers) * static_cast<double>(in_flight);
    if (v > 1 && micro_batches % pp == 0) {  // interleaved: chunk-micro-batches in flight
      const auto order =
          lf::parallel::pipeline::interleaved_1f1b_order(static_cast<int>(k), pp, static_cast<int>(v), micro_batches,
                                                         pairs_micro_batches());
      int64_t live = 0, most = 0;
      for (const auto& op : order) most = std::max(most, live += op.kind == 'F' ? 1 : -1);
      in_flight = most;
      act = held(chunk_layers) * static_cast<double>(most);
    }
    std::string act_note = std::to_string(in_flight) + (v > 1 ? " model-chunk micro-batch" : " micro-batch") +
                           (in_flight > 1 ? "es" : "") + " in flight" +
                           (cp > 1 ? ", " + std::to_string(static_cast<int64_t>(tokens)) + " tokens per CP rank" : "") +
                           (t.recompute_granularity.value_or("") == "full" ? ", full recomputation" : "");
    if (const auto chunk = job.parallel.chunkpipe_chunk_size) {
      // ChunkPipe: one chunk's activations (attention over the whole prefix is flash: O(chunk)),
      // plus the kept keys/values of the sequence with their gradients (x 3 with the transient
      // prefix gradient) and, past the first stage, the stage's inputs.
      const double cs = static_cast<double>(*chunk) / cp;  // a CP rank's part of each chunk; the keys/values whole
      const double kv = s * b * 2.0 * static_cast<double>(m.query_groups() * m.head_dim()) / tp * (half ? 2 : 4);
      act = cs * b * h * 34 / tp * (half ? 1 : 2) * static_cast<double>(c.layers) + 3 * kv * static_cast<double>(c.layers) +
            (k > 0 ? s * b * h / tp * (half ? 2 : 4) : 0.0);
      act_note = "one chunk of " + std::to_string(*chunk) + " tokens" +
                 (cp > 1 ? " (" + std::to_string(*chunk / cp) + " per CP rank)" : "") + " + the sequence's keys/values";
    }
    const ComponentEstimate e = component_estimate(k, micro_batches);
    const std::string pad = pp > 1 ? "    " : "  ";
    if (pp > 1) os << "  stage " << k << ":\n";
    os << pad << "parameters      " << static_cast<int64_t>(params) << " of " << m.num_parameters() << " (/ tp " << tp
       << (expert_parallel_ ? "; routed experts " + std::to_string(static_cast<int64_t>(experts)) + ", / ep " +
                                  std::to_string(ep) +
                                  (layout_.expert_tp_size() > 1 ? " x tp " + std::to_string(layout_.expert_tp_size()) : "")
                            : std::string())
       << (pp > 1 ? ", this stage's layers" : "") << ")\n"
       << pad << "weights         " << human_bytes(weight_bytes) << "\n"
       << (adapters > 0 ? pad + "LoRA adapters   " + std::to_string(static_cast<int64_t>(adapters)) +
                              " parameters (rank " + std::to_string(job.lora.rank) + "; the base is frozen)\n"
                        : std::string())
       << pad << "gradients       " << human_bytes(grad_bytes) << " (fp32"
       << (adapters > 0 ? ", adapters only" : frozen_ ? ", frozen: none" : "") << ")\n"
       << pad << "optimizer       " << human_bytes(optim_bytes)
       << (job.optimizer.use_distributed_optimizer
               ? (expert_parallel_ ? " (sharded over dp; experts over expert-dp " + std::to_string(edp) + ")"
                                   : std::string(" (sharded over dp)"))
               : std::string())
       << "\n"
       << pad << "activations     " << human_bytes(act) << " (" << act_note << ")\n";
    if (!e.what.empty())
      os << pad << e.what << std::string(e.what.size() < 16 ? 16 - e.what.size() : 1, ' ')
         << static_cast<int64_t>(e.params) << " parameters: weights "
         << human_bytes(e.weights) << ", gradients " << human_bytes(e.grads) << ", optimizer " << human_bytes(e.optimizer)
         << ", activations " << human_bytes(e.activations) << " (" << e.note << ")\n";
    os << pad << "total           "
       << human_bytes(weight_bytes + grad_bytes + optim_bytes + act + e.weights + e.grads + e.optimizer + e.activations)
       << "\n";
  }
  os << "  model FLOPs     " << std::setprecision(4) << m.flops_per_token(job.training.seq_length)
     << " per token (training)\n";
  return os.str();
}

std::string CausalLmPlan::describe_components() const { return ""; }

CausalLmPlan::ComponentEstimate CausalLmPlan::component_estimate(size_t, int64_t) const { return {}; }

std::string CausalLmPlan::describe() const {
  std::ostringstream os;
  const int tp = layout_.size(lf::dist::Axis::tp), pp = layout_.size(lf::dist::Axis::pp),
            dp = layout_.size(lf::dist::Axis::dp);
  os << "model: " << config_->type << "\n"
     << "  foundation     " << config_->component("foundation").type << ", " << foundation_.num_parameters()
     << " parameters"
     << (foundation_.is_moe() ? " (" + std::to_string(foundation_.num_active_parameters()) + " active per token)" : "")
     << " | tp " << tp << ", pp " << pp << ", dp " << dp
     << (expert_parallel_ ? ", experts: ep " + std::to_string(layout_.size(lf::dist::Axis::ep)) + " x expert-dp " +
                                std::to_string(layout_.expert_dp_size()) + " (expert TP " +
                                std::to_string(layout_.expert_tp_size()) + ")"
                          : std::string())
     << " (the job's layout)"
     << (frozen_ ? " | frozen" : "") << "\n"
     << describe_components() << stage_assignment() << estimates();
  return os.str();
}

namespace {
std::unique_ptr<ModelPlan> plan_causal_lm(std::shared_ptr<const ModelConfig> c, const PlanArgs& a,
                                          lf::config::ErrorList& e) {
  return std::make_unique<CausalLmPlan>(std::move(c), a, e);
}
}  // namespace

void register_causal_lm(Registry& r) {
  CompositeType t;
  t.name = "causal_lm";
  t.description = "A decoder foundation with an LM head: next-token loss on labels where loss_mask is 1";
  t.slots = {{"foundation", "foundation", "decoder", true}};
  t.plan = plan_causal_lm;
  r.add(std::move(t));
}

}  // namespace lf::models

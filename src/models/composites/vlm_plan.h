// The plans of the Qwen-VL composites (qwen2_5_vl, qwen3_vl): the vision tower at TP 1 on the first
// pipeline stage, one replica per foundation TP rank (its share axis cp: the ranks that encode the
// same media, each contributing 1 / TP of the gradient; its DP the foundation's); the checks every
// such composite makes (tower TP, merger width, placeholder ids inside the vocabulary, no context or
// expert parallelism, no LoRA, no ChunkPipe); --mock-data's images; --dry-run's line. A subclass
// adds its foundation's checks (M-RoPE layout, DeepStack stages), its data needs and build().
// Internal to src/models/composites.
#pragma once

#include <ATen/Functions.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "causal_lm_plan.h"
#include "loongforge/models/composites/internvl.h"

namespace lf::models {

// What the plan reads of a tower's and a composite's fields, whatever their names.
template <class V>
int64_t vision_merge(const V& v) { return v.spatial_merge_size; }
inline int64_t vision_merge(const InternVisionConfig& v) { return v.merge(); }
template <class V>
int64_t vision_depth(const V& v) { return v.depth; }
inline int64_t vision_depth(const InternVisionConfig& v) { return v.num_hidden_layers; }
template <class O>
std::vector<std::pair<std::string, int64_t>> media_token_ids(const O& o) {
  return {{"image_token_id", o.image_token_id}, {"video_token_id", o.video_token_id}};
}
inline std::vector<std::pair<std::string, int64_t>> media_token_ids(const InternVlConfig& o) {
  return {{"image_token_id", o.image_token_id}};
}

template <class Vision, class Own>
class VlmPlan : public CausalLmPlan {
 public:
  VlmPlan(std::shared_ptr<const ModelConfig> config, const PlanArgs& args, lf::config::ErrorList& errors,
          std::string type)
      : CausalLmPlan(config, args, errors),
        type_(std::move(type)),
        vision_(config->fields<Vision>("vision_encoder")),
        own_(config->own_fields<Own>()),
        vision_frozen_(config->component("vision_encoder").settings.freeze) {
    if (vision_.out_hidden_size == 0) vision_.out_hidden_size = foundation_.hidden_size;
    const auto& enc = config->component("vision_encoder");
    if (enc.settings.tensor_model_parallel_size.value_or(1) != 1)
      errors.add("model.vision_encoder.tensor_model_parallel_size",
                 origin(args, "model.vision_encoder.tensor_model_parallel_size"),
                 type_ + " runs its vision tower at TP 1 (every rank of the first stage encodes the micro-batch's "
                         "media)",
                 "set model.vision_encoder.tensor_model_parallel_size 1");
    if (vision_.out_hidden_size != foundation_.hidden_size)
      errors.add("model.vision_encoder.out_hidden_size", origin(args, "model.vision_encoder.out_hidden_size"),
                 "the merger's out_hidden_size " + std::to_string(vision_.out_hidden_size) +
                     " differs from the foundation's hidden_size " + std::to_string(foundation_.hidden_size),
                 "leave out_hidden_size at 0 (the foundation's width)");
    for (const auto& [field, id] : media_token_ids(own_))
      if (id >= foundation_.vocab_size)
        errors.add("model." + field, origin(args, "model." + field),
                   "model." + field + " " + std::to_string(id) + " is outside the vocabulary of " +
                       std::to_string(foundation_.vocab_size) + " tokens");
    if (expert_parallel() || layout_.size(lf::dist::Axis::ep) > 1)
      errors.add("parallel.expert_model_parallel_size", origin(args, "parallel.expert_model_parallel_size"),
                 type_ + " is built for TP, PP, CP and DP of its foundation; expert parallelism is not combined "
                         "with it yet",
                 "set --expert-model-parallel-size 1 (and leave --expert-tensor-parallel-size unset)");
    if (layout_.size(lf::dist::Axis::cp) > 1 && job_.parallel.enable_encoder_hetero_dp)
      errors.add("parallel.enable_encoder_hetero_dp", origin(args, "parallel.enable_encoder_hetero_dp"),
                 "--enable-encoder-hetero-dp spreads the media over the foundation's TP group, whose ranks compute "
                 "the same loss; with context parallelism the ranks' losses differ and the gathered features' "
                 "gradients would have to be summed: not built",
                 "drop --enable-encoder-hetero-dp, or set --context-parallel-size 1");
    if (args.job->lora.rank > 0)
      errors.add("lora.rank", origin(args, "lora.rank"), "LoRA adapters are built for the causal_lm composite",
                 "drop --lora-rank, or freeze components with `freeze: true`");
    if (job_.parallel.chunkpipe_chunk_size)
      errors.add("parallel.chunkpipe_chunk_size", origin(args, "parallel.chunkpipe_chunk_size"),
                 type_ + " does not run under ChunkPipe (its vision tower splices whole sequences)",
                 "drop --chunkpipe-chunk-size");
    if (job_.parallel.use_vit_dp_balance && job_.parallel.enable_encoder_hetero_dp)
      errors.add("parallel.use_vit_dp_balance", origin(args, "parallel.use_vit_dp_balance"),
                 "--use-vit-dp-balance (media spread over the DP ranks) and --enable-encoder-hetero-dp (media spread "
                 "over the TP group) are not combined",
                 "drop one of them");
    else if (job_.parallel.use_vit_dp_balance && layout_.size(lf::dist::Axis::dp) == 1)
      errors.add("parallel.use_vit_dp_balance", origin(args, "parallel.use_vit_dp_balance"),
                 "--use-vit-dp-balance spreads the vision tower's media over the data-parallel ranks, but the "
                 "data-parallel size is 1: it would do nothing",
                 "drop --use-vit-dp-balance, or run with more ranks than tensor x pipeline x context parallel");
    const bool full = job_.parallel.enable_full_hetero_dp;
    if (full && job_.parallel.enable_encoder_hetero_dp)
      errors.add("parallel.enable_full_hetero_dp", origin(args, "parallel.enable_full_hetero_dp"),
                 "--enable-full-hetero-dp spreads the vision tower over the foundation's TP x PP ranks, which includes "
                 "--enable-encoder-hetero-dp's TP group; the two are not combined",
                 "drop --enable-encoder-hetero-dp");
    if (full && job_.parallel.use_vit_dp_balance)
      errors.add("parallel.enable_full_hetero_dp", origin(args, "parallel.enable_full_hetero_dp"),
                 "--enable-full-hetero-dp (the step's media spread over the TP x PP ranks of each DP index) and "
                 "--use-vit-dp-balance (each micro-batch's media spread over the DP ranks) are not combined",
                 "drop one of them");
    if (full && layout_.size(lf::dist::Axis::tp) * layout_.size(lf::dist::Axis::pp) * layout_.size(lf::dist::Axis::cp) == 1)
      errors.add("parallel.enable_full_hetero_dp", origin(args, "parallel.enable_full_hetero_dp"),
                 "--enable-full-hetero-dp spreads the vision tower over the foundation's TP x PP (x CP) ranks, but "
                 "tensor, pipeline and context parallel sizes are all 1: it would do nothing",
                 "drop --enable-full-hetero-dp, or use --tensor-model-parallel-size or "
                 "--pipeline-model-parallel-size > 1");
    if (job_.parallel.enable_encoder_hetero_dp && layout_.size(lf::dist::Axis::tp) == 1)
      errors.add("parallel.enable_encoder_hetero_dp", origin(args, "parallel.enable_encoder_hetero_dp"),
                 "--enable-encoder-hetero-dp spreads the vision tower's media over the foundation's TP group, but "
                 "tensor_model_parallel_size is 1: it would do nothing",
                 "drop --enable-encoder-hetero-dp, or use --tensor-model-parallel-size > 1");
    // The tower's ranks ordered (foundation DP index, PP stage, CP index, TP index): its share groups
    // (cp) are the foundation's TP x CP groups of the first stage, its DP the foundation's; with
    // --enable-full-hetero-dp every stage's, the first stage's ranks first in each share group.
    const int tp = layout_.size(lf::dist::Axis::tp), cp = layout_.size(lf::dist::Axis::cp);
    std::vector<std::pair<std::pair<int, int>, int>> ranks;
    for (int r = 0; r < layout_.world_size(); ++r) {
      const auto c = layout_.coords(r);
      if (c.pp == 0 || full) ranks.push_back({{c.dp, (c.pp * cp + c.cp) * tp + c.tp}, r});
    }
    std::sort(ranks.begin(), ranks.end());
    for (const auto& f : ranks) vision_ranks_.push_back(f.second);
    first_stage_shares_ = tp * cp;
    shares_ = first_stage_shares_ * (full ? layout_.size(lf::dist::Axis::pp) : 1);
  }

  std::string summary() const override {
    return CausalLmPlan::summary() + " + vision_encoder " + std::to_string(vision_.num_parameters()) + " parameters";
  }
  int64_t num_parameters() const override { return CausalLmPlan::num_parameters() + vision_.num_parameters(); }

  // Each sample's first tokens become the placeholders of one random image of mock_side() x
  // mock_side() patches, drawn from (seed, sample index); the loss skips predicting them.
  void add_mock_fields(Batch& batch, uint64_t seed) const override {
    at::Tensor tokens = batch.at("tokens").clone(), labels = batch.at("labels").clone();
    at::Tensor mask = batch.find("loss_mask") ? batch.at("loss_mask").clone() : at::ones(tokens.sizes(), at::kFloat);
    const int64_t m = vision_merge(vision_), side = mock_side();
    LF_CHECK(side % m == 0, "model.mock_image_patches ", side, " is not a multiple of spatial_merge_size ", m);
    const int64_t n = (side / m) * (side / m), id = own_.image_token_id;
    LF_CHECK(tokens.size(1) > n, "training.seq_length ", tokens.size(1), " leaves no text after ", n, " placeholders");
    for (const auto& [field, special] : media_token_ids(own_)) {
      tokens.masked_fill_(tokens.eq(special), (special + 2) % foundation_.vocab_size);
      labels.masked_fill_(labels.eq(special), (special + 2) % foundation_.vocab_size);
    }
    tokens.narrow(1, 0, n).fill_(id);
    labels.narrow(1, 0, n - 1).fill_(id);
    mask.narrow(1, 0, n - 1).fill_(0);
    std::vector<at::Tensor> pixels;
    for (int64_t i = 0; i < tokens.size(0); ++i) {
      const int64_t index =
          i < static_cast<int64_t>(batch.sample_indices.size()) ? batch.sample_indices[static_cast<size_t>(i)] : i;
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + static_cast<uint64_t>(index) + 29);
      pixels.push_back(at::normal(0.0, 1.0, {side * side, vision_.patch_dim()}, gen, at::kFloat));
    }
    batch.set("tokens", tokens, 1);
    batch.set("labels", labels, 1);
    batch.set("loss_mask", mask, 1);
    batch.set("pixel_values", at::cat(pixels), -1);
    batch.set("image_grid_thw", at::tensor({int64_t{1}, side, side}, at::kLong).repeat({tokens.size(0), 1}), -1);
  }

 protected:
  // The composite M on this rank: the tower's context on the stages that hold it (every stage with
  // --enable-full-hetero-dp), the tower's modes, context parallelism.
  template <class M>
  std::unique_ptr<Model> build_vlm(const BuildArgs& args) const {
    const auto& ctx = *args.context;
    const auto stage =
        lf::parallel::pipeline::pipeline_stage(foundation_.num_layers, ctx.pp_size(), ctx.pp_rank(), stage_split());
    std::unique_ptr<lf::dist::ParallelContext> enc;
    if (stage.first || job_.parallel.enable_full_hetero_dp)
      enc = args.make_context("vision_encoder", vision_layout(), vision_ranks_);
    auto model = std::make_unique<M>(foundation_, vision_, own_, *args.backend, args.seed, args.dtype, &ctx,
                                     job_.parallel.sequence_parallel, stage, !frozen_, std::move(enc), !vision_frozen_);
    model->set_encoder_data_parallel(job_.parallel.enable_encoder_hetero_dp);
    model->set_vision_balance(job_.parallel.use_vit_dp_balance);
    if (job_.parallel.enable_full_hetero_dp) model->set_full_hetero_dp(first_stage_shares_);
    apply_context_parallel(*model, ctx);
    return model;
  }

  static lf::config::Origin origin(const PlanArgs& args, const std::string& path) {
    const auto* n = args.resolved->find_path(path);
    return n ? n->origin() : lf::config::Origin::from_default();
  }
  // What a tower fed from a multimodal store needs of the data (the store's patch geometry checked
  // against the tower's; the media placeholders' ids). Towers with Qwen's patch fields only.
  DataNeeds store_media_needs() const {
    DataNeeds d = CausalLmPlan::data_needs();
    d.media = true;
    d.vision_tower = true;
    d.patch_size = vision_.patch_size;
    d.temporal_patch_size = vision_.temporal_patch_size;
    d.merge_size = vision_.spatial_merge_size;
    d.image_token_id = own_.image_token_id;
    d.video_token_id = own_.video_token_id;
    return d;
  }
  // --mock-data's image side in patches (default 2 x merge: 4 merged tokens).
  virtual int64_t mock_side() const { return 2 * vision_merge(vision_); }
  // TP 1; each foundation TP group's ranks are one share group (cp), the foundation's DP the tower's.
  lf::dist::ParallelLayout vision_layout() const {
    lf::dist::ParallelSizes s;
    s.tp = 1;
    s.cp = shares_;
    return lf::dist::ParallelLayout(static_cast<int>(vision_ranks_.size()), s);
  }
  // The tower's weights, gradients, optimizer state and activations on a rank of stage k: its
  // parameters whole (TP 1) wherever it has a replica; ZeRO-1 shards its optimizer over all of
  // its ranks (dp x share axis). Activations by Megatron's 34 bytes per patch and width unit per
  // block (16-bit; doubled in fp32) over the patches a rank holds: --mock-data's images exactly,
  // else at most seq_length x merge^2 patches a sample (every token a placeholder). Held for the
  // micro-batches in flight on the first stage; with --enable-full-hetero-dp for the whole step's
  // media, spread over the share group, on every stage.
  ComponentEstimate component_estimate(size_t stage, int64_t micro_batches) const override {
    const bool full = job_.parallel.enable_full_hetero_dp;
    ComponentEstimate e;
    if (stage != 0 && !full) return e;
    const bool half = job_.training.bf16 || job_.training.fp16;
    const double p = static_cast<double>(vision_.num_parameters()), b = job_.training.micro_batch_size;
    const int pp = layout_.size(lf::dist::Axis::pp);
    e.what = "vision_encoder";
    e.params = p;
    e.weights = p * (half ? 2 : 4);
    if (!vision_frozen_) {
      e.grads = p * 4;
      const double per_param = 8 + (half ? 4 : 0);
      e.optimizer = per_param * p / (job_.optimizer.use_distributed_optimizer ? static_cast<double>(vision_ranks_.size()) : 1.0);
    }
    const int64_t m = vision_merge(vision_);
    const double patches = job_.data.mock_data ? b * static_cast<double>(mock_side() * mock_side())
                                               : b * static_cast<double>(job_.training.seq_length * m * m);
    const double per_patch = static_cast<double>(vision_depth(vision_) * vision_.hidden_size) * 34 * (half ? 1 : 2);
    const std::string which = job_.data.mock_data ? "--mock-data's images" : "at most seq_length x merge^2 patches a sample";
    if (full) {
      e.activations = per_patch * patches * static_cast<double>(micro_batches) / shares_;
      e.note = "the step's " + std::to_string(micro_batches) + " micro-batches' media / " + std::to_string(shares_) +
               " ranks, " + which;
    } else {
      const int64_t in_flight = pp > 1 ? std::min<int64_t>(pp, micro_batches) : 1;
      const double split = job_.parallel.enable_encoder_hetero_dp ? layout_.size(lf::dist::Axis::tp) : 1;
      e.activations = per_patch * patches * static_cast<double>(in_flight) / split;
      e.note = std::to_string(in_flight) + " micro-batch(es) in flight" +
               (split > 1 ? ", / " + std::to_string(static_cast<int>(split)) + " TP ranks" : std::string()) + ", " + which;
    }
    return e;
  }

  std::string describe_components() const override {
    std::ostringstream os;
    os << "  vision_encoder  " << config_->component("vision_encoder").type << ", " << vision_.num_parameters()
       << " parameters | tp 1, ";
    if (job_.parallel.enable_full_hetero_dp) {
      os << shares_ << " replica(s) per foundation DP rank, one on every rank of its TP x PP"
         << (layout_.size(lf::dist::Axis::cp) > 1 ? " x CP" : "")
         << " group (data-parallel over them: the step's media scattered before the pipeline runs, the features "
            "sent to the first stage), over all "
         << vision_ranks_.size() << " ranks" << (vision_frozen_ ? " | frozen" : "") << "\n";
      return os.str();
    }
    os << shares_ << " replica(s) per foundation TP" << (layout_.size(lf::dist::Axis::cp) > 1 ? " x CP" : "")
       << " group ";
    if (job_.parallel.enable_encoder_hetero_dp)
      os << "(data-parallel: each encodes its share of the media, features all-gathered)";
    else if (layout_.size(lf::dist::Axis::cp) > 1)
      os << "(same media; each CP rank's tokens' gradient, 1 / " << layout_.size(lf::dist::Axis::tp) << " per TP replica)";
    else
      os << "(same media, 1 / " << shares_ << " of the gradient each)";
    if (job_.parallel.use_vit_dp_balance) os << ", media balanced over the DP ranks before it";
    os << ", over the " << vision_ranks_.size() << " ranks of pipeline stage 0" << (vision_frozen_ ? " | frozen" : "")
       << "\n";
    return os.str();
  }

  std::string type_;
  Vision vision_;
  Own own_;
  bool vision_frozen_;
  std::vector<int> vision_ranks_;
  int shares_ = 1;             // the tower's share group: ranks of one foundation DP index encoding its media
  int first_stage_shares_ = 1; // of those, the first pipeline stage's (the first in the group)
};

}  // namespace lf::models

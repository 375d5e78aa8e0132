#include "loongforge/models/composites/flow_matching.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>
#include <sstream>

#include "unused_settings.h"
#include "loongforge/core/config/config_error.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/registry.h"

namespace lf::models {
namespace {
const std::string kType = "flow_matching";

// The trained index range [first, end) of N timesteps for boundaries (lo, hi), as DiffSynth's
// int(boundary * N).
int64_t boundary_index(double fraction, int64_t n) {
  return static_cast<int64_t>(std::floor(fraction * static_cast<double>(n) + 1e-9));
}
}  // namespace

void FlowMatchingConfig::validate(const lf::config::Node& tree, const std::string& prefix,
                                  lf::config::ErrorList& errors) const {
  auto origin = [&](const char* k) {
    const auto* n = tree.find(k);
    return n ? n->origin() : lf::config::Origin::from_default();
  };
  if (boundary_index(min_timestep_boundary, num_train_timesteps) >=
      boundary_index(max_timestep_boundary, num_train_timesteps))
    errors.add(prefix + ".max_timestep_boundary", origin("max_timestep_boundary"),
               "the timestep range [min_timestep_boundary, max_timestep_boundary) = [" +
                   std::to_string(min_timestep_boundary) + ", " + std::to_string(max_timestep_boundary) +
                   ") holds no training timestep",
               "the high-noise expert of Wan 2.2 A14B: --max-timestep-boundary 0.358; the low-noise one: "
               "--min-timestep-boundary 0.358");
  if (mock_latent_shape.size() != 3 || mock_latent_shape[0] < 1 || mock_latent_shape[1] < 1 || mock_latent_shape[2] < 1)
    errors.add(prefix + ".mock_latent_shape", origin("mock_latent_shape"),
               "mock_latent_shape must be three positive sizes (frames, height, width)");
}

FlowMatchingSchedule::FlowMatchingSchedule(const FlowMatchingConfig& c) {
  const int64_t n = c.num_train_timesteps;
  // Sigmas as torch.linspace(1, 0, N + 1)[:-1] in fp32 (DiffSynth's extra_one_step grid), shifted.
  auto lin = at::linspace(1.0, 0.0, n + 1, at::kFloat).narrow(0, 0, n);
  auto sig = (c.shift * lin / (1 + (c.shift - 1) * lin)).contiguous();
  auto ts = (sig * static_cast<double>(n)).contiguous();
  auto y = at::exp(-2 * at::pow((ts - n / 2.0) / static_cast<double>(n), 2));
  y = y - y.min();
  auto w = (y * (static_cast<double>(n) / y.sum())).contiguous();
  for (int64_t k = 0; k < n; ++k) {
    sigmas.push_back(sig[k].item<float>());
    timesteps.push_back(ts[k].item<float>());
    weights.push_back(c.loss_weighting == "wan" ? w[k].item<float>() : 1.0);
  }
  first_id = boundary_index(c.min_timestep_boundary, n);
  end_id = boundary_index(c.max_timestep_boundary, n);
}

FlowMatching::FlowMatching(const WanConfig& foundation, const FlowMatchingConfig& config,
                           const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
                           const lf::dist::ParallelContext* parallel, bool trainable, bool sequence_parallel)
    : FlowMatching(foundation, config, backend, seed, parallel, trainable,
                   ParamBuilder(at::make_generator<at::CPUGeneratorImpl>(seed), dtype, backend.device(),
                                tensor_parallel_of(parallel, sequence_parallel), trainable)) {}

FlowMatching::FlowMatching(const WanConfig& foundation, const FlowMatchingConfig& config,
                           const lf::backend::DeviceBackend& backend, uint64_t seed,
                           const lf::dist::ParallelContext* parallel, bool trainable, ParamBuilder b)
    : backend_(backend), parallel_(parallel), trainable_(trainable), config_(config), schedule_(config), seed_(seed),
      dit_(foundation, backend, b, seed, parallel ? parallel->tp_rank() : 0) {
  if (parallel && parallel->cp_size() > 1) dit_.set_context_parallel(&parallel->cp());
  LF_CHECK(config.first_frame_conditioning == false || foundation.patch_size[0] == 1,
           "flow_matching: first_frame_conditioning needs a patch of one frame (patch_size [1, ., .])");
  params_ = b.take();
}

const std::string& FlowMatching::type() const { return kType; }

std::vector<ParameterGroup> FlowMatching::parameter_groups() const {
  return {ParameterGroup{"model", params_, parallel_, trainable_}};
}

std::vector<std::string> FlowMatching::batch_fields() const {
  if (dit_.config().image_dim > 0) return {"latents", "text_embeddings", "image_embeddings"};
  return {"latents", "text_embeddings"};
}

std::map<std::string, double> FlowMatching::loss_counts(const Batch& batch) const {
  return {{kLoss, static_cast<double>(batch.at("latents").size(0))}};
}

WanInputs FlowMatching::inputs_of(const Batch& batch) const {
  WanInputs in;
  const auto dev = backend_.device();
  in.latents = batch.at("latents").to(dev, at::kFloat);
  in.text = batch.at("text_embeddings").to(dev);
  if (dit_.config().image_dim > 0) {
    LF_CHECK(batch.contains("image_embeddings"), "flow_matching: the I2V model (image_dim ", dit_.config().image_dim,
             ") needs the batch field image_embeddings");
    in.image = batch.at("image_embeddings").to(dev);
  }
  return in;
}

at::Tensor FlowMatching::sample_losses(const WanInputs& clean, const at::Tensor& noise, const at::Tensor& ids) const {
  const at::Tensor& x0 = clean.latents;
  const int64_t b = x0.size(0), n = config_.num_train_timesteps;
  LF_CHECK(noise.sizes() == x0.sizes(), "flow_matching: noise ", noise.sizes(), " does not match the latents ",
           x0.sizes());
  LF_CHECK(ids.dim() == 1 && ids.size(0) == b, "flow_matching: one timestep index per sample, got ", ids.sizes());
  auto idc = ids.to(at::kCPU, at::kLong).contiguous();
  std::vector<float> sig(b), ts(b), w(b);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t k = idc.data_ptr<int64_t>()[i];
    LF_CHECK(k >= 0 && k < n, "flow_matching: timestep index ", k, " outside [0, ", n, ")");
    sig[i] = static_cast<float>(schedule_.sigmas[k]);
    ts[i] = static_cast<float>(schedule_.timesteps[k]);
    w[i] = static_cast<float>(schedule_.weights[k]);
  }
  const auto opts = x0.options().dtype(at::kFloat);
  auto sigma = at::tensor(sig).to(x0.device()).view({b, 1, 1, 1, 1});
  auto x0f = x0.to(at::kFloat), eps = noise.to(x0.device(), at::kFloat);
  at::Tensor xt = (1 - sigma) * x0f + sigma * eps;
  at::Tensor target = eps - x0f;
  WanInputs in = clean;
  at::Tensor timestep = at::tensor(ts).to(x0.device());
  const bool first = config_.first_frame_conditioning;
  if (first) {
    // Wan 2.2 TI2V: the first latent frame is the clean condition, timestep 0 on its tokens.
    LF_CHECK(x0.size(2) > 1, "flow_matching: first_frame_conditioning needs latents of more than one frame, got ",
             x0.sizes(), lf::hint("an image (one latent frame) trains without it: model.first_frame_conditioning=false"));
    xt = at::cat({x0f.narrow(2, 0, 1), xt.narrow(2, 1, xt.size(2) - 1)}, 2);
    const auto& ps = dit_.config().patch_size;
    const int64_t per_frame = (x0.size(3) / ps[1]) * (x0.size(4) / ps[2]), frames = x0.size(2);
    auto mask = at::ones({frames, per_frame}, opts);
    mask.narrow(0, 0, 1).zero_();
    timestep = (timestep.view({b, 1}) * mask.reshape({1, -1}));
  }
  in.latents = xt;
  in.timestep = timestep;
  // In token space: this rank's tokens (all of them without context parallelism); the per-sample
  // mean is over the sample's whole latent (the CP ranks' partial sums add up to it).
  WanTokens out = dit_.forward_tokens(in);
  const auto idx = out.positions.to(x0.device());
  at::Tensor tgt = dit_.patchify_like_output(target).index_select(0, idx);  // [s_r, b, pv c]
  at::Tensor err = at::mse_loss(out.tokens.to(at::kFloat), tgt, at::Reduction::None);
  int64_t counted = x0[0].numel();
  if (first) {
    // Tokens of the first latent frame (patch_size[0] = 1: the first per_frame tokens) are not in the loss.
    const auto& ps = dit_.config().patch_size;
    const int64_t per_frame = (x0.size(3) / ps[1]) * (x0.size(4) / ps[2]);
    err = err * out.positions.ge(per_frame).to(err.device(), at::kFloat).view({-1, 1, 1});
    counted -= x0.size(1) * x0.size(3) * x0.size(4);
  }
  return err.sum(at::IntArrayRef{0, 2}) / static_cast<double>(counted) * at::tensor(w).to(x0.device());
}

StageOutput FlowMatching::stage_forward(const Batch& batch, const TensorMap&, int64_t chunk, Pass pass) {
  LF_CHECK(chunk == 0, "flow_matching has one model chunk");
  WanInputs in = inputs_of(batch);
  const int64_t b = in.latents.size(0);
  LF_CHECK(static_cast<int64_t>(batch.sample_indices.size()) == b, "flow_matching: the batch has ", b,
           " samples but ", batch.sample_indices.size(), " sample indices");
  // Each sample's timestep and noise: a stream of (seed, step, sample index); evaluation uses one
  // fixed stream per sample so that its metric compares across steps.
  std::vector<at::Tensor> noise;
  std::vector<int64_t> ids;
  std::vector<float> keep;  // text dropout: 0 zeroes the sample's conditioning
  const uint64_t step = pass == Pass::train ? static_cast<uint64_t>(step_) + 1 : 0;
  for (int64_t i = 0; i < b; ++i) {
    const uint64_t index = static_cast<uint64_t>(batch.sample_indices[static_cast<size_t>(i)]);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 0x9E3779B97F4A7C15ull ^ (step * 1000003ull + index) ^
                                                        0xD1B54A32D192ED03ull);
    ids.push_back(at::randint(schedule_.first_id, schedule_.end_id, {1}, gen).item<int64_t>());
    noise.push_back(at::normal(0.0, 1.0, in.latents.select(0, i).sizes(), gen, at::kFloat));
    const double u = at::rand({1}, gen, at::kDouble).item<double>();
    keep.push_back(pass == Pass::train && u < config_.text_dropout ? 0.f : 1.f);
  }
  if (config_.text_dropout > 0 && pass == Pass::train) {
    const auto k = at::tensor(keep).to(in.text.device());
    in.text = in.text * k.view({b, 1, 1}).to(in.text.scalar_type());
    if (in.image.defined()) in.image = in.image * k.view({b, 1, 1}).to(in.image.scalar_type());
  }
  auto losses = sample_losses(in, at::stack(noise).to(in.latents.device()), at::tensor(ids));
  StageOutput out;
  if (pass == Pass::train)
    out.losses.push_back({kLoss, losses.sum()});
  else  // each CP rank counts its share of the samples (the trainer sums over dp x cp)
    out.metrics[kLoss] = {losses.sum().item<double>(), static_cast<double>(b) / dit_.context_parallel().size()};
  return out;
}

// The DiT's dropout streams. The noise stream's step counter is not kept: it is the iteration
// (resume_at), and checkpoints that hold it (flow_matching.step, written before) are read without it.
std::map<std::string, at::Tensor> FlowMatching::rng_state() const { return dit_.rng().state(); }

void FlowMatching::set_rng_state(const std::map<std::string, at::Tensor>& s) { dit_.rng().set_state(s); }

double FlowMatching::flops_per_sample(int64_t seq_length) const {
  // training.seq_length counts a sample's patch tokens (the trainer's tokens/s counts the same).
  const auto& c = dit_.config();
  const double tokens = static_cast<double>(seq_length);
  const double h = static_cast<double>(c.inner_dim()), ctx = static_cast<double>(config_.mock_text_length);
  const double attention = c.num_layers * 2.0 * 2.0 * h * (tokens + ctx);
  return (6.0 * static_cast<double>(c.num_parameters()) + 3.0 * 2.0 * attention) * tokens;
}

// --- plan -------------------------------------------------------------------------------------

namespace {

class FlowMatchingPlan : public ModelPlan {
 public:
  FlowMatchingPlan(std::shared_ptr<const ModelConfig> config, const PlanArgs& args, lf::config::ErrorList& errors)
      : config_(std::move(config)), layout_(*args.layout), foundation_(config_->fields<WanConfig>("foundation")),
        own_(config_->own_fields<FlowMatchingConfig>()), frozen_(config_->component("foundation").settings.freeze) {
    const auto& job = *args.job;
    auto origin = [&](const std::string& path) {
      const auto* n = args.resolved->find_path(path);
      return n ? n->origin() : lf::config::Origin::from_default();
    };
    const int tp = layout_.size(lf::dist::Axis::tp);
    auto refuse = [&](const std::string& key, const std::string& what, const std::string& hint) {
      errors.add(key, origin(key), what, hint);
    };
    if (layout_.size(lf::dist::Axis::pp) > 1)
      refuse("parallel.pipeline_model_parallel_size", "flow_matching runs as one pipeline stage",
             "set --pipeline-model-parallel-size 1");
    sequence_parallel_ = job.parallel.sequence_parallel && tp > 1;
    const int cp = layout_.size(lf::dist::Axis::cp);
    if (cp > 1 && job.parallel.cp_comm_type != "a2a" &&
        origin("parallel.cp_comm_type").kind != lf::config::Origin::Kind::default_)
      refuse("parallel.cp_comm_type",
             "flow_matching attends bidirectionally over the video tokens: its context parallelism is Ulysses "
             "(all-to-all); ring attention (p2p) is the causal models'",
             "drop --cp-comm-type or give a2a");
    if (cp > 1 && foundation_.num_attention_heads % (tp * cp) != 0)
      refuse("parallel.context_parallel_size",
             "Ulysses splits each TP rank's " + std::to_string(foundation_.num_attention_heads / std::max(tp, 1)) +
                 " attention heads over " + std::to_string(cp) + " context-parallel ranks: they do not divide",
             "choose a CP size dividing num_attention_heads / TP");
    if (job.parallel.chunkpipe_chunk_size)
      refuse("parallel.chunkpipe_chunk_size", "flow_matching does not run under ChunkPipe",
             "drop --chunkpipe-chunk-size");
    refuse_pipeline_layout_settings("flow_matching", job, refuse);
    refuse_expert_settings("flow_matching", job, layout_, set_by_user(origin), refuse);
    if (job.lora.rank > 0) refuse("lora.rank", "LoRA adapters are built for the causal_lm composite", "drop --lora-rank");
    if (job.training.training_phase == "sft")
      refuse("training.training_phase", "flow_matching reads latents, not conversations", "drop --training-phase sft");
    if (job.training.recompute_granularity == "selective")
      refuse("training.recompute_granularity",
             "flow_matching recomputes whole blocks (full); selective recomputation is the decoders'",
             "use --recompute-granularity full");
    for (auto [field, value] : {std::pair<const char*, int64_t>{"num_attention_heads", foundation_.num_attention_heads},
                                {"ffn_dim", foundation_.ffn_dim}})
      if (value % tp != 0)
        refuse(std::string("model.foundation.") + field,
               std::string("model.foundation.") + field + " " + std::to_string(value) +
                   " is not divisible by parallel.tensor_model_parallel_size " + std::to_string(tp),
               "");
    const auto& m = own_.mock_latent_shape;
    const auto& ps = foundation_.patch_size;
    if (m.size() == 3 && ps.size() == 3 && (m[0] % ps[0] || m[1] % ps[1] || m[2] % ps[2])) {
      refuse("model.mock_latent_shape", "model.mock_latent_shape does not divide into the foundation's patch_size", "");
    } else if (m.size() == 3 && ps.size() == 3 && job.data.mock_data) {
      const int64_t tokens = (m[0] / ps[0]) * (m[1] / ps[1]) * (m[2] / ps[2]);
      const int64_t per_cp = tokens / std::max(cp, 1);
      if (job.training.seq_length != tokens)
        refuse("training.seq_length",
               "training.seq_length " + std::to_string(job.training.seq_length) + " is not the mock latents' " +
                   std::to_string(tokens) + " patch tokens (model.mock_latent_shape over the foundation's patch_size): "
                   "tokens/s and TFLOP/s count a sample as seq_length tokens",
               "set --seq-length " + std::to_string(tokens));
      if (tokens % (2 * cp) != 0 && cp > 1)
        refuse("model.mock_latent_shape",
               "the mock latents' " + std::to_string(tokens) + " patch tokens do not split into 2 x " +
                   std::to_string(cp) + " context-parallel chunks",
               "");
      else if (sequence_parallel_ && per_cp % tp != 0)
        refuse("parallel.sequence_parallel",
               "the mock latents' " + std::to_string(per_cp) + " patch tokens per CP rank do not split over " +
                   std::to_string(tp) + " tensor-parallel ranks",
               "");
    }
    if (own_.first_frame_conditioning && ps.size() == 3 && ps[0] != 1)
      refuse("model.first_frame_conditioning", "first_frame_conditioning needs patch_size [1, ., .]", "");
    if (foundation_.pos_embed_seq_len > 0)
      refuse("model.foundation.pos_embed_seq_len", "FLF2V (two image frames) is not trained by flow_matching yet",
             "load it with loongforge-generate --denoise-inputs");
  }
  const ModelConfig& config() const override { return *config_; }
  std::string describe() const override {
    std::ostringstream os;
    const FlowMatchingSchedule s(own_);
    os << "model: " << config_->type << "\n  foundation     " << config_->component("foundation").type << ", "
       << num_parameters() << " parameters | tp " << layout_.size(lf::dist::Axis::tp) << ", dp "
       << layout_.size(lf::dist::Axis::dp) << " (the job's layout)" << (frozen_ ? " | frozen" : "") << "\n"
       << "  objective      flow matching, shift " << own_.shift << ", timestep indices [" << s.first_id << ", "
       << s.end_id << ") of " << own_.num_train_timesteps << " (timesteps " << s.timesteps[s.first_id] << " .. "
       << s.timesteps[s.end_id - 1] << "), weighting " << own_.loss_weighting
       << (own_.first_frame_conditioning ? ", first frame clean" : "") << "\n";
    return os.str();
  }
  std::string summary() const override {
    return config_->type + ": wan, " + std::to_string(num_parameters()) + " parameters, " +
           std::to_string(foundation_.num_layers) + " blocks, width " + std::to_string(foundation_.inner_dim());
  }
  int64_t num_parameters() const override { return foundation_.num_parameters(); }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.token_data = false;
    d.latents = true;
    d.latent_channels = foundation_.in_channels;
    d.text_dim = foundation_.text_dim;
    d.image_dim = foundation_.image_dim;
    return d;
  }
  void add_mock_fields(Batch& batch, uint64_t seed) const override {
    // Per sample: smooth latents (a low-frequency pattern plus a little noise) and text (and
    // image) embeddings, functions of the seed and the sample index only.
    std::vector<at::Tensor> lat, text, image;
    const auto& m = own_.mock_latent_shape;
    for (int64_t index : batch.sample_indices) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + static_cast<uint64_t>(index) + 71);
      auto coarse = at::normal(0.0, 1.0, {1, foundation_.in_channels, m[0], 2, 2}, gen, at::kFloat);
      auto smooth = at::upsample_trilinear3d(coarse, {m[0], m[1], m[2]}, false).squeeze(0);
      lat.push_back(smooth + 0.1 * at::normal(0.0, 1.0, smooth.sizes(), gen, at::kFloat));
      text.push_back(at::normal(0.0, 1.0, {own_.mock_text_length, foundation_.text_dim}, gen, at::kFloat));
      if (foundation_.image_dim > 0)
        image.push_back(at::normal(0.0, 1.0, {own_.mock_image_length, foundation_.image_dim}, gen, at::kFloat));
    }
    LF_CHECK(!lat.empty(), "flow_matching: a batch without sample indices");
    batch.set("latents", at::stack(lat));
    batch.set("text_embeddings", at::stack(text));
    if (!image.empty()) batch.set("image_embeddings", at::stack(image));
  }
  std::unique_ptr<Model> build(const BuildArgs& args) const override {
    return std::make_unique<FlowMatching>(foundation_, own_, *args.backend, args.seed, args.dtype, args.context,
                                          !frozen_, sequence_parallel_);
  }

 private:
  std::shared_ptr<const ModelConfig> config_;
  lf::dist::ParallelLayout layout_;
  WanConfig foundation_;
  FlowMatchingConfig own_;
  bool frozen_;
  bool sequence_parallel_ = false;
};

std::unique_ptr<ModelPlan> plan_flow_matching(std::shared_ptr<const ModelConfig> c, const PlanArgs& a,
                                              lf::config::ErrorList& e) {
  return std::make_unique<FlowMatchingPlan>(std::move(c), a, e);
}

}  // namespace

void register_flow_matching(Registry& r) {
  r.add(ComponentType{"wan", "foundation",
                      "Wan 2.1 / 2.2 video diffusion transformer (diffusers' WanTransformer3DModel): 3D patches, "
                      "adaLN timestep modulation, 3D RoPE, text (and image) cross-attention",
                      schema_loader<WanConfig>()});
  CompositeType t;
  t.name = kType;
  t.description = "A diffusion transformer trained by flow matching (Wan / DiffSynth's recipe: shifted sigmas, "
                  "target noise - latents, timestep-weighted MSE)";
  t.slots = {{"foundation", "foundation", "wan", true}};
  t.load_own = schema_loader<FlowMatchingConfig>();
  t.plan = plan_flow_matching;
  r.add(std::move(t));
}

}  // namespace lf::models

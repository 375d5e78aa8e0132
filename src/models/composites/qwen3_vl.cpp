#include "loongforge/models/composites/qwen3_vl.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <array>
#include <set>
#include <sstream>

#include "causal_lm_plan.h"
#include "vlm_hf.h"
#include "vlm_plan.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/hf_adapter.h"

namespace lf::models {
namespace {
const std::string kType = "qwen3_vl";

std::vector<std::array<int64_t, 3>> grids_of(const at::Tensor& g, const char* field) {
  std::vector<std::array<int64_t, 3>> out;
  if (!g.defined()) return out;
  LF_CHECK(g.dim() == 2 && g.size(1) == 3, field, " must be [num_media, 3] (t, h, w in patches), got ", g.sizes());
  const auto c = g.to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  for (int64_t i = 0; i < c.size(0); ++i) out.push_back({p[3 * i], p[3 * i + 1], p[3 * i + 2]});
  return out;
}
}  // namespace

at::Tensor qwen3_vl_position_ids(const at::Tensor& input_ids, const at::Tensor& image_grid_thw,
                                 const at::Tensor& video_grid_thw, const Qwen3VlConfig& ids, int64_t merge) {
  LF_CHECK(input_ids.dim() == 2, "input_ids must be [batch, seq], got ", input_ids.sizes());
  LF_CHECK(merge >= 1, "spatial_merge_size must be >= 1, got ", merge);
  const auto tok = input_ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t b = tok.size(0), s = tok.size(1);
  const int64_t* t = tok.data_ptr<int64_t>();
  const auto images = grids_of(image_grid_thw, "image_grid_thw");
  // A video of t frames is t grids of one frame each (timestamps separate the frames).
  std::vector<std::array<int64_t, 3>> frames;
  std::vector<std::pair<size_t, int64_t>> frame_of;  // (video, frame) of each frame grid
  {
    const auto videos = grids_of(video_grid_thw, "video_grid_thw");
    for (size_t v = 0; v < videos.size(); ++v)
      for (int64_t f = 0; f < videos[v][0]; ++f) {
        frames.push_back({1, videos[v][1], videos[v][2]});
        frame_of.push_back({v, f});
      }
  }
  at::Tensor out = at::zeros({3, b, s}, at::kLong);
  auto a = out.accessor<int64_t, 3>();
  size_t next[2] = {0, 0};
  for (int64_t i = 0; i < b; ++i) {
    int64_t pos = 0, j = 0;
    const int64_t* row = t + i * s;
    while (j < s) {
      const int64_t id = row[j];
      if (id != ids.image_token_id && id != ids.video_token_id) {
        for (int k = 0; k < 3; ++k) a[k][i][j] = pos;
        ++pos, ++j;
        continue;
      }
      const int video = id == ids.video_token_id ? 1 : 0;
      const auto& list = video ? frames : images;
      size_t& m = next[video];
      LF_CHECK(m < list.size(), "sample ", i, " position ", j, ": ", video ? "video frame" : "image",
               " placeholders (token ", id, ") beyond the ", list.size(), video ? " frame(s) of video_grid_thw" :
               " grid(s) of image_grid_thw", lf::hint(video ? "every video needs one grid row, each frame t h w / "
               "merge^2 placeholders" : "every image needs one grid row, in sample order"));
      const auto [gt, h, w] = list[m];
      const int64_t gh = h / merge, gw = w / merge, n = gt * gh * gw;
      int64_t run = 0;
      while (j + run < s && row[j + run] == id && run < n) ++run;
      std::ostringstream what;
      if (video)
        what << "video " << frame_of[m].first << " frame " << frame_of[m].second;
      else
        what << "image " << m;
      LF_CHECK(run == n, "sample ", i, " position ", j, ": ", what.str(), " (grid ", gt, "x", h, "x", w, ", merge ",
               merge, ") needs ", n, " consecutive placeholder tokens, the sequence holds ", run,
               lf::hint("the tokenizer's placeholder count must be h w / merge^2 per image or video frame"));
      for (int64_t tt = 0; tt < gt; ++tt)
        for (int64_t hh = 0; hh < gh; ++hh)
          for (int64_t ww = 0; ww < gw; ++ww) {
            const int64_t q = j + (tt * gh + hh) * gw + ww;
            a[0][i][q] = pos + tt;
            a[1][i][q] = pos + hh;
            a[2][i][q] = pos + ww;
          }
      pos += std::max(gh, gw);
      j += n;
      ++m;
    }
  }
  LF_CHECK(next[0] == images.size() && next[1] == frames.size(), "image_grid_thw holds ", images.size(),
           " grid(s) and video_grid_thw ", frames.size(), " frame(s), but the tokens hold placeholders for ", next[0],
           " image(s) and ", next[1], " video frame(s)", lf::hint("one run of placeholders per image and per frame"));
  return out;
}

Qwen3Vl::Qwen3Vl(const DecoderConfig& foundation, const Qwen3VisionConfig& vision, const Qwen3VlConfig& config,
                 const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
                 const lf::dist::ParallelContext* parallel, bool sequence_parallel, const PipelineStage& stage,
                 bool foundation_trainable, std::unique_ptr<lf::dist::ParallelContext> vision_context,
                 bool vision_trainable)
    : VisionLm(foundation, backend, seed, dtype, parallel, sequence_parallel, stage,
               foundation_trainable, std::move(vision_context), vision_trainable),
      config_(config) {
  for (const auto& [field, id] : {std::pair<const char*, int64_t>{"image_token_id", config.image_token_id},
                                  {"video_token_id", config.video_token_id}})
    LF_CHECK(id < foundation.vocab_size, "model.", field, " ", id, " is outside the vocabulary of ",
             foundation.vocab_size, " tokens");
  LF_CHECK(foundation.mrope_section.size() == 3 && foundation.mrope_interleaved,
           "qwen3_vl: the foundation needs interleaved M-RoPE: set model.foundation.mrope_section (3 sections "
           "summing to head_dim / 2; Qwen3-VL: [24, 20, 20]) and model.foundation.mrope_interleaved: true");
  const auto k = static_cast<int64_t>(vision.deepstack_visual_indexes.size());
  LF_CHECK(k <= foundation.num_layers, "qwen3_vl: the vision tower's ", k, " DeepStack entries feed the decoder's "
           "first ", k, " layers, but it has ", foundation.num_layers);
  // The vision tower lives on the first pipeline stage (on every stage when the plan gives the
  // others a vision context: --enable-full-hetero-dp).
  const bool first_stage = this->foundation().stage().first;
  if (!holds_tower(this->foundation().stage())) return;
  if (first_stage) {
    const auto& first = this->foundation().stage().chunks.front();
    LF_CHECK(first.begin == 0 && first.end >= k, "qwen3_vl: DeepStack adds vision features after decoder layers 0..",
             k - 1, ", which must all lie on the first pipeline stage's first model chunk; it holds ", describe_stage(),
             lf::hint("give the first stage at least " + std::to_string(k) +
                      " layers (--decoder-first-pipeline-num-layers) or use fewer pipeline stages"));
  }
  ParamBuilder b = tower_builder(seed, dtype);
  Qwen3VisionConfig v = vision;
  if (v.out_hidden_size == 0) v.out_hidden_size = foundation.hidden_size;
  LF_CHECK(v.out_hidden_size == foundation.hidden_size, "model.vision_encoder.out_hidden_size ", v.out_hidden_size,
           " differs from the foundation's hidden_size ", foundation.hidden_size,
           lf::hint("the mergers' outputs replace token embeddings: set out_hidden_size 0 (the foundation's width)"));
  encoder_ = std::make_unique<Qwen3VisionEncoder>(v, backend, b, "vision_encoder");
  // The tower's outputs packed side by side for the modes' exchanges: [features, h (1 + DeepStack)].
  attach_tower(
      b.take(),
      [this](const at::Tensor& rows, const at::Tensor& g) {
        Qwen3VisionOutput o = encoder_->forward(rows, g);
        std::vector<at::Tensor> parts = {o.merged};
        parts.insert(parts.end(), o.deepstack.begin(), o.deepstack.end());
        return parts.size() == 1 ? parts[0] : at::cat(parts, 1);
      },
      v.out_hidden_size * (1 + k), v.patch_dim(), v.spatial_merge_size);
}

Qwen3Vl::~Qwen3Vl() = default;

const std::string& Qwen3Vl::type() const { return kType; }

std::vector<std::string> Qwen3Vl::batch_fields() const {
  auto f = CausalLm::batch_fields();
  for (const char* name : {"pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"})
    f.push_back(name);
  return f;
}

at::Tensor Qwen3Vl::position_ids(const at::Tensor& tokens, const at::Tensor& image_grid_thw,
                                 const at::Tensor& video_grid_thw) const {
  const int64_t merge = encoder_ ? encoder_->config().spatial_merge_size : 2;
  return qwen3_vl_position_ids(tokens, image_grid_thw, video_grid_thw, config_, merge);
}

Qwen3Vl::Embedded Qwen3Vl::embed_with_media(const at::Tensor& tokens, const at::Tensor& pixel_values,
                                            const at::Tensor& image_grid_thw, const at::Tensor& pixel_values_videos,
                                            const at::Tensor& video_grid_thw) const {
  LF_CHECK(encoder_ != nullptr, "qwen3_vl: media are encoded on the first pipeline stage; this one holds ",
           describe_stage());
  Embedded out;
  at::Tensor x = foundation().embed(tokens, 0, /*scatter=*/false).transpose(0, 1);  // [b, s, h]
  const auto device = x.device();
  const int64_t merge = encoder_->config().spatial_merge_size;
  struct Kind {
    const char* what;
    int64_t id;
    const at::Tensor& pixels;
    const at::Tensor& grid;
    const char *pixels_field, *grid_field;
    at::Tensor mask;  // [b, s] bool
    int64_t count = 0;
  };
  Kind kinds[2] = {
      {"image", config_.image_token_id, pixel_values, image_grid_thw, "pixel_values", "image_grid_thw", {}, 0},
      {"video", config_.video_token_id, pixel_values_videos, video_grid_thw, "pixel_values_videos", "video_grid_thw",
       {}, 0}};
  // One tower call (or exchange, vision_modes.h) over the images then the videos.
  std::vector<at::Tensor> pixels, grids;
  for (Kind& k : kinds) {
    k.mask = tokens.eq(k.id).to(device);
    k.count = k.mask.sum().item<int64_t>();
    if (!k.pixels.defined()) {
      LF_CHECK(k.count == 0, "the tokens hold ", k.count, " ", k.what, " placeholders (model.", k.what, "_token_id ",
               k.id, ") but the batch has no ", k.pixels_field, " / ", k.grid_field);
      continue;
    }
    LF_CHECK(k.grid.defined() && k.grid.dim() == 2 && k.grid.size(1) == 3, k.pixels_field, " come with ",
             k.grid_field, " [num_", k.what, "s, 3]");
    const at::Tensor g = k.grid.to(at::kCPU, at::kLong);
    const int64_t made = (g.select(1, 0) * g.select(1, 1) * g.select(1, 2)).sum().item<int64_t>() / (merge * merge);
    LF_CHECK(k.count == made, "the tokens hold ", k.count, " ", k.what, " placeholders (model.", k.what, "_token_id ",
             k.id, ") but the vision tower makes ", made, " embeddings from the ", g.size(0), " grid(s) of ",
             k.grid_field, lf::hint(std::string("each ") + k.what + " needs t h w / spatial_merge_size^2 placeholder tokens"));
    pixels.push_back(k.pixels);
    grids.push_back(g);
  }
  const at::Tensor packed = encode_media(tokens, pixels.empty() ? at::Tensor() : at::cat(pixels),
                                           pixels.empty() ? at::Tensor() : at::cat(grids));
  if (pixels.empty()) {
    // --use-vit-dp-balance: no media here, but the exchange's backward must run on this rank too.
    if (packed.defined() && packed.requires_grad()) x = x + packed.sum().to(x.scalar_type()) * 0.0;
    out.hidden = x.transpose(0, 1).contiguous();
    return out;
  }
  // The packed columns: the merged features, then each DeepStack layer's.
  const int64_t h = x.size(2);
  const size_t layers = encoder_->config().deepstack_visual_indexes.size();
  const auto column = [&](size_t c) { return packed.narrow(1, static_cast<int64_t>(c) * h, h).to(x.scalar_type()); };
  const at::Tensor merged = column(0);
  int64_t offset = 0;
  for (const Kind& k : kinds) {
    if (k.count == 0) continue;
    x = x.masked_scatter(k.mask.unsqueeze(-1), merged.narrow(0, offset, k.count));
    offset += k.count;
  }
  out.hidden = x.transpose(0, 1).contiguous();
  // DeepStack: layer k's rows at every visual position, images' and videos' rows in sequence order.
  const bool has_image = kinds[0].count > 0, has_video = kinds[1].count > 0;
  const at::Tensor visual = has_image && has_video ? kinds[0].mask.logical_or(kinds[1].mask)
                                                   : (has_image ? kinds[0].mask : kinds[1].mask);
  const int64_t n = kinds[0].count + kinds[1].count;
  for (size_t k = 0; k < layers; ++k) {
    const at::Tensor rows = column(k + 1);
    at::Tensor values = rows;
    if (has_image && has_video)
      values = at::zeros({n, h}, x.options())
                   .masked_scatter(kinds[0].mask.masked_select(visual).unsqueeze(-1), rows.narrow(0, 0, kinds[0].count))
                   .masked_scatter(kinds[1].mask.masked_select(visual).unsqueeze(-1),
                                   rows.narrow(0, kinds[0].count, kinds[1].count));
    out.injections.push_back(HiddenInjection{static_cast<int64_t>(k), visual, values});
  }
  return out;
}

at::Tensor Qwen3Vl::embed_inputs(const Batch&) const {
  LF_FAIL("qwen3_vl embeds in its stage_forward (its DeepStack features go to the decoder layers)");
}

StageOutput Qwen3Vl::stage_forward(const Batch& batch, const TensorMap& input, int64_t chunk, Pass pass) {
  LF_CHECK(!batch.contains("position_ids"), "qwen3_vl computes its M-RoPE position ids from the tokens and the "
           "media grids; a batch with position_ids (--reset-position-ids) is not supported",
           lf::hint("drop --reset-position-ids"));
  auto field = [&](const char* name) {
    const at::Tensor* t = batch.find(name);
    return t ? *t : at::Tensor();
  };
  const at::Tensor& tokens = batch.at("tokens");
  Batch with = batch;
  with.set("position_ids", position_ids(tokens, field("image_grid_thw"), field("video_grid_thw")), 2);
  // Context parallelism: the media are spliced into the whole sequence, the layers and the head
  // see this rank's tokens.
  const Batch local = context_parallel().on() ? context_slice(with) : Batch();
  const Batch& mine = context_parallel().on() ? local : with;
  const auto& st = foundation().stage();
  const auto [lo, hi] = foundation().chunk_layers(chunk);
  const bool embeds = st.first && chunk == 0, heads = st.last && chunk == st.num_chunks() - 1;
  DecoderInputs in = inputs_of(mine, mine.at("tokens").size(1));
  at::Tensor x;
  if (embeds) {
    auto e = embed_with_media(tokens.to(backend_.device()), field("pixel_values"), field("image_grid_thw"),
                              field("pixel_values_videos"), field("video_grid_thw"));
    x = foundation().scatter_sequence(context_share(e.hidden));
    for (auto& injection : e.injections) in.injections.push_back(context_share(injection));
  } else {
    x = input.at("hidden_states");
  }
  x = foundation().run_layers(x, in, lo, hi);
  if (!heads) {
    StageOutput out;
    out.activations.set("hidden_states", x);
    return out;
  }
  return head_output(x, mine, pass);
}

at::Tensor Qwen3Vl::logits(const at::Tensor& tokens, const at::Tensor& pixel_values, const at::Tensor& image_grid_thw,
                           const at::Tensor& pixel_values_videos, const at::Tensor& video_grid_thw) const {
  check_whole_model("Qwen3Vl::logits");
  at::Tensor x = hidden_states(tokens, pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw).transpose(0, 1);
  return lm_head().full_logits(lm_head().local_logits(foundation().final_norm(x)));
}

at::Tensor Qwen3Vl::hidden_states(const at::Tensor& tokens, const at::Tensor& pixel_values,
                                  const at::Tensor& image_grid_thw, const at::Tensor& pixel_values_videos,
                                  const at::Tensor& video_grid_thw) const {
  check_whole_model("Qwen3Vl::hidden_states");
  auto e = embed_with_media(tokens.to(backend_.device()), pixel_values, image_grid_thw, pixel_values_videos,
                            video_grid_thw);
  DecoderInputs in;
  in.seq = tokens.size(1);
  in.position_ids = position_ids(tokens, image_grid_thw, video_grid_thw);
  in.injections = std::move(e.injections);
  return foundation().run_layers(foundation().scatter_sequence(e.hidden), in).transpose(0, 1);
}

void Qwen3Vl::load_hf_state(const std::map<std::string, at::Tensor>& tensors) {
  const std::string visual = "model.visual.", lm = "model.language_model.";
  load_vlm_hf_state(*this, tensors, visual, lm, "Qwen3ForCausalLM", "qwen3", "Qwen3VLForConditionalGeneration (transformers 5 names)",
                    encoder_ ? std::function<void(const std::map<std::string, at::Tensor>&)>(
                                   [&](const std::map<std::string, at::Tensor>& v) { encoder_->load_hf_state(v, visual); })
                             : nullptr);
}

// --- plan -------------------------------------------------------------------------------------

namespace {

class Qwen3VlPlan : public VlmPlan<Qwen3VisionConfig, Qwen3VlConfig> {
 public:
  Qwen3VlPlan(std::shared_ptr<const ModelConfig> config, const PlanArgs& args, lf::config::ErrorList& errors)
      : VlmPlan(config, args, errors, "qwen3_vl") {
    if (foundation_.mrope_section.size() != 3 || !foundation_.mrope_interleaved)
      errors.add("model.foundation.mrope_interleaved", origin(args, "model.foundation.mrope_interleaved"),
                 "qwen3_vl needs interleaved M-RoPE in its foundation",
                 "set model.foundation.mrope_section (Qwen3-VL: [24, 20, 20]) and mrope_interleaved: true");
    const auto deep = static_cast<int64_t>(vision_.deepstack_visual_indexes.size());
    if (deep > foundation_.num_layers)
      errors.add("model.vision_encoder.deepstack_visual_indexes", origin(args, "model.vision_encoder.deepstack_visual_indexes"),
                 std::to_string(deep) + " DeepStack entries feed the decoder's first layers, but it has " +
                     std::to_string(foundation_.num_layers),
                 "list at most num_layers blocks");
    else if (deep > 0 && layout_.size(lf::dist::Axis::pp) > 1) {
      const auto first = lf::parallel::pipeline::pipeline_stage(foundation_.num_layers, layout_.size(lf::dist::Axis::pp),
                                                                0, stage_split());
      if (!first.chunks.empty() && first.chunks.front().end < deep)
        errors.add("parallel.pipeline_model_parallel_size", origin(args, "parallel.pipeline_model_parallel_size"),
                   "qwen3_vl adds DeepStack features after decoder layers 0.." + std::to_string(deep - 1) +
                       ", which must all lie on the first pipeline stage's first model chunk",
                   "give the first stage at least " + std::to_string(deep) +
                       " layers (--decoder-first-pipeline-num-layers) or use fewer pipeline stages");
    }
  }

  DataNeeds data_needs() const override {
    // Images from a multimodal store (cut with the tower's patch geometry); a video's frames each
    // need their own run of placeholders (Qwen3-VL's timestamps), which the store does not render.
    DataNeeds d = store_media_needs();
    d.store_videos_why = "qwen3_vl reads a video as one run of placeholders per frame, each after its timestamp "
                         "text (Qwen3-VL's processor), and `loongforge-data preprocess --multimodal` renders a video "
                         "as one run (Qwen2.5-VL's)";
    return d;
  }

  std::unique_ptr<Model> build(const BuildArgs& args) const override { return build_vlm<Qwen3Vl>(args); }
};

std::unique_ptr<ModelPlan> plan_qwen3_vl(std::shared_ptr<const ModelConfig> c, const PlanArgs& a,
                                         lf::config::ErrorList& e) {
  return std::make_unique<Qwen3VlPlan>(std::move(c), a, e);
}

}  // namespace

void register_qwen3_vl(Registry& r) {
  CompositeType t;
  t.name = kType;
  t.description = "Qwen3-VL: a vision tower's merged patches spliced into an interleaved-M-RoPE qwen3 decoder at "
                  "media placeholders, its DeepStack features added after the first layers";
  t.slots = {{"vision_encoder", "vision_encoder", "qwen3_vl_vision", true},
             {"foundation", "foundation", "decoder", true}};
  t.load_own = schema_loader<Qwen3VlConfig>();
  t.plan = plan_qwen3_vl;
  r.add(std::move(t));
}

}  // namespace lf::models

#include "loongforge/models/composites/qwen2_5_vl.h"

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
#include "loongforge/core/logging.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/hf_adapter.h"
#include "loongforge/media/qwen_vision_input.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {
namespace {
const std::string kType = "qwen2_5_vl";

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

DecoderConfig qwen2_5_vl_foundation(DecoderConfig foundation) {
  // The rotary dims: the head's, or multi-latent attention's decoupled RoPE dims.
  const int64_t rotary = foundation.multi_latent_attention ? foundation.qk_pos_emb_head_dim : foundation.head_dim();
  if (foundation.mrope_section.empty() && rotary >= 8) {
    const int64_t half = rotary / 2, t = half / 4;
    foundation.mrope_section = {t, (half - t) / 2, half - t - (half - t) / 2};
  }
  return foundation;
}

at::Tensor qwen2_5_vl_position_ids(const at::Tensor& input_ids, const at::Tensor& image_grid_thw,
                                   const at::Tensor& video_grid_thw, const std::vector<double>& second_per_grid_ts,
                                   const Qwen25VlConfig& ids, int64_t merge, const at::Tensor& documents) {
  LF_CHECK(input_ids.dim() == 2, "input_ids must be [batch, seq], got ", input_ids.sizes());
  LF_CHECK(!documents.defined() || documents.sizes() == input_ids.sizes(), "document ids must be ",
           input_ids.sizes(), " like the tokens, got ", documents.sizes());
  const at::Tensor docs = documents.defined() ? documents.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
  LF_CHECK(merge >= 1, "spatial_merge_size must be >= 1, got ", merge);
  const auto tok = input_ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t b = tok.size(0), s = tok.size(1);
  const int64_t* t = tok.data_ptr<int64_t>();
  const auto images = grids_of(image_grid_thw, "image_grid_thw"), videos = grids_of(video_grid_thw, "video_grid_thw");
  LF_CHECK(second_per_grid_ts.empty() || second_per_grid_ts.size() == videos.size(), "second_per_grid_ts holds ",
           second_per_grid_ts.size(), " values for ", videos.size(), " videos", lf::hint("give one per video, or none (1 s)"));
  at::Tensor out = at::zeros({3, b, s}, at::kLong);
  auto a = out.accessor<int64_t, 3>();
  size_t next[2] = {0, 0};
  for (int64_t i = 0; i < b; ++i) {
    int64_t pos = 0, j = 0;
    const int64_t* row = t + i * s;
    const int64_t* doc = docs.defined() ? docs.data_ptr<int64_t>() + i * s : nullptr;
    while (j < s) {
      if (doc && j > 0 && doc[j] != doc[j - 1]) pos = 0;  // a packed document starts
      const int64_t id = row[j];
      if (id != ids.image_token_id && id != ids.video_token_id) {
        for (int k = 0; k < 3; ++k) a[k][i][j] = pos;
        ++pos, ++j;
        continue;
      }
      const int video = id == ids.video_token_id ? 1 : 0;
      const auto& list = video ? videos : images;
      const char* what = video ? "video" : "image";
      size_t& m = next[video];
      LF_CHECK(m < list.size(), "sample ", i, " position ", j, ": ", what, " placeholders (token ", id, ") beyond the ",
               list.size(), " grid(s) of ", what, "_grid_thw",
               lf::hint("every " + std::string(what) + " needs one grid row, in sample order"));
      const auto [gt, h, w] = list[m];
      const int64_t gh = h / merge, gw = w / merge, n = gt * gh * gw;
      int64_t run = 0;
      while (j + run < s && row[j + run] == id && run < n && (!doc || doc[j + run] == doc[j])) ++run;
      LF_CHECK(run == n, "sample ", i, " position ", j, ": ", what, " ", m, " (grid ", gt, "x", h, "x", w, ", merge ",
               merge, ") needs ", n, " consecutive placeholder tokens, the sequence holds ", run,
               lf::hint("the tokenizer's placeholder count must be t h w / merge^2 per " + std::string(what)));
      const float interval =
          video ? static_cast<float>(ids.tokens_per_second) *
                      static_cast<float>(second_per_grid_ts.empty() ? 1.0 : second_per_grid_ts[m])
                : 1.0f;
      for (int64_t tt = 0; tt < gt; ++tt)
        for (int64_t hh = 0; hh < gh; ++hh)
          for (int64_t ww = 0; ww < gw; ++ww) {
            const int64_t q = j + (tt * gh + hh) * gw + ww;
            a[0][i][q] = pos + static_cast<int64_t>(static_cast<float>(tt) * interval);
            a[1][i][q] = pos + hh;
            a[2][i][q] = pos + ww;
          }
      pos += std::max(gh, gw);
      j += n;
      ++m;
    }
  }
  LF_CHECK(next[0] == images.size() && next[1] == videos.size(), "image_grid_thw holds ", images.size(),
           " grid(s) and video_grid_thw ", videos.size(), ", but the tokens hold placeholders for ", next[0],
           " image(s) and ", next[1], " video(s)", lf::hint("one run of placeholders per grid row"));
  return out;
}

Qwen25Vl::Qwen25Vl(const DecoderConfig& foundation, const Qwen25VisionConfig& vision, const Qwen25VlConfig& config,
                   const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
                   const lf::dist::ParallelContext* parallel, bool sequence_parallel, const PipelineStage& stage,
                   bool foundation_trainable, std::unique_ptr<lf::dist::ParallelContext> vision_context,
                   bool vision_trainable)
    : VisionLm(qwen2_5_vl_foundation(foundation), backend, seed, dtype, parallel, sequence_parallel, stage,
               foundation_trainable, std::move(vision_context), vision_trainable),
      config_(config) {
  for (const auto& [field, id] : {std::pair<const char*, int64_t>{"image_token_id", config.image_token_id},
                                  {"video_token_id", config.video_token_id}})
    LF_CHECK(id < foundation.vocab_size, "model.", field, " ", id, " is outside the vocabulary of ",
             foundation.vocab_size, " tokens");
  LF_CHECK(CausalLm::config().mrope_section.size() == 3, "qwen2_5_vl: the foundation needs M-RoPE: set model.foundation."
           "mrope_section (3 sections summing to the rotary head_dim / 2; Qwen2.5-VL: [16, 24, 24])");
  // The vision tower lives on the first pipeline stage (on every stage when the plan gives the
  // others a vision context: --enable-full-hetero-dp).
  if (!holds_tower(stage)) return;
  ParamBuilder b = tower_builder(seed, dtype);
  Qwen25VisionConfig v = vision;
  if (v.out_hidden_size == 0) v.out_hidden_size = foundation.hidden_size;
  LF_CHECK(v.out_hidden_size == foundation.hidden_size, "model.vision_encoder.out_hidden_size ", v.out_hidden_size,
           " differs from the foundation's hidden_size ", foundation.hidden_size,
           lf::hint("the merger's outputs replace token embeddings: set out_hidden_size 0 (the foundation's width)"));
  encoder_ = std::make_unique<Qwen25VisionEncoder>(v, backend, b, "vision_encoder");
  attach_tower(
      b.take(), [this](const at::Tensor& rows, const at::Tensor& g) { return encoder_->forward(rows, g); },
      v.out_hidden_size, v.patch_dim(), v.spatial_merge_size);
}

Qwen25Vl::~Qwen25Vl() = default;

const std::string& Qwen25Vl::type() const { return kType; }

std::vector<std::string> Qwen25Vl::batch_fields() const {
  auto f = CausalLm::batch_fields();
  for (const char* name : {"pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"})
    f.push_back(name);
  return f;
}

Qwen25VlMedia Qwen25Vl::media_of(const Batch& batch) {
  Qwen25VlMedia m;
  const auto take = [&](const char* name) {
    const at::Tensor* t = batch.find(name);
    return t ? *t : at::Tensor();
  };
  m.pixel_values = take("pixel_values");
  m.image_grid_thw = take("image_grid_thw");
  m.pixel_values_videos = take("pixel_values_videos");
  m.video_grid_thw = take("video_grid_thw");
  if (const at::Tensor* s = batch.find("second_per_grid_ts")) {
    const at::Tensor c = s->to(at::kCPU, at::kDouble).contiguous().reshape({-1});
    m.second_per_grid_ts.assign(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  return m;
}

Qwen25VlMedia Qwen25Vl::media_of_records(const std::vector<lf::data::MediaRecord>& records,
                                          const lf::media::QwenVisionPreprocess& p) {
  Qwen25VlMedia m;
  std::vector<at::Tensor> image_rows, image_grids, video_rows, video_grids;
  for (const auto& r : records) {
    std::vector<const lf::media::Image*> frames;
    for (const auto& f : r.images) frames.push_back(&f);
    auto v = lf::media::qwen_patches_of_resized(frames, p);
    const at::Tensor grid = at::tensor({v.grid[0], v.grid[1], v.grid[2]}, at::kLong).view({1, 3});
    if (r.kind == lf::data::MediaRecord::kImage) {
      image_rows.push_back(v.pixel_values);
      image_grids.push_back(grid);
    } else {
      video_rows.push_back(v.pixel_values);
      video_grids.push_back(grid);
      m.second_per_grid_ts.push_back(r.seconds_per_grid);
    }
  }
  if (!image_rows.empty()) m.pixel_values = at::cat(image_rows), m.image_grid_thw = at::cat(image_grids);
  if (!video_rows.empty()) m.pixel_values_videos = at::cat(video_rows), m.video_grid_thw = at::cat(video_grids);
  return m;
}

void Qwen25Vl::set_media_fields(const Qwen25VlMedia& m, Batch& batch) {
  if (m.pixel_values.defined()) {
    batch.set("pixel_values", m.pixel_values, -1);
    batch.set("image_grid_thw", m.image_grid_thw, -1);
  }
  if (m.pixel_values_videos.defined()) {
    batch.set("pixel_values_videos", m.pixel_values_videos, -1);
    batch.set("video_grid_thw", m.video_grid_thw, -1);
    batch.set("second_per_grid_ts", at::tensor(m.second_per_grid_ts, at::kDouble), -1);
  }
}

at::Tensor Qwen25Vl::position_ids(const at::Tensor& tokens, const at::Tensor& image_grid_thw) const {
  Qwen25VlMedia m;
  m.image_grid_thw = image_grid_thw;
  return position_ids(tokens, m);
}

at::Tensor Qwen25Vl::position_ids(const at::Tensor& tokens, const Qwen25VlMedia& media,
                                  const at::Tensor& documents) const {
  const int64_t merge = encoder_ ? encoder_->config().spatial_merge_size : 2;
  std::vector<double> seconds = media.second_per_grid_ts;
  if (seconds.empty() && media.video_grid_thw.defined()) seconds.assign(size_t(media.video_grid_thw.size(0)), 1.0);
  return qwen2_5_vl_position_ids(tokens, media.image_grid_thw, media.video_grid_thw, seconds, config_, merge, documents);
}

at::Tensor Qwen25Vl::embed_with_media(const at::Tensor& tokens, const Qwen25VlMedia& media) const {
  LF_CHECK(encoder_ != nullptr, "qwen2_5_vl: images are encoded on the first pipeline stage; this one holds ",
           describe_stage());
  at::Tensor x = foundation().embed(tokens, 0, /*scatter=*/false);  // [s, b, h]
  struct Kind {
    const char* what;
    int64_t token;
    const at::Tensor& pixels;
    const at::Tensor& grid;
  };
  const Kind kinds[2] = {{"image", config_.image_token_id, media.pixel_values, media.image_grid_thw},
                         {"video", config_.video_token_id, media.pixel_values_videos, media.video_grid_thw}};
  // One tower call over the images then the videos (rows and grids concatenated), then each
  // kind's embeddings replace its placeholders in order.
  std::vector<at::Tensor> pixels, grids;
  std::vector<int64_t> counts;
  std::vector<at::Tensor> masks;
  const int64_t merge = encoder_->config().spatial_merge_size;
  for (const Kind& k : kinds) {
    const at::Tensor mask = tokens.eq(k.token);  // [b, s]
    const int64_t count = mask.sum().item<int64_t>();
    masks.push_back(mask);
    if (!k.pixels.defined()) {
      LF_CHECK(count == 0, "the tokens hold ", count, " ", k.what, " placeholders (model.", k.what, "_token_id ",
               k.token, ") but the batch has no ", k.what == std::string("image") ? "pixel_values / image_grid_thw"
                                                                                 : "pixel_values_videos / video_grid_thw");
      counts.push_back(0);
      continue;
    }
    LF_CHECK(k.grid.defined() && k.grid.dim() == 2 && k.grid.size(1) == 3, k.what,
             " pixels come with a [num, 3] grid (", k.what == std::string("image") ? "image_grid_thw" : "video_grid_thw",
             ")");
    const at::Tensor g = k.grid.to(at::kCPU, at::kLong);
    const int64_t tokens_made = (g.select(1, 0) * g.select(1, 1) * g.select(1, 2)).sum().item<int64_t>() / (merge * merge);
    if (count != tokens_made) {
      std::string grids;
      for (int64_t i = 0; i < g.size(0); ++i)
        grids += lf::str(i ? ", " : "", "(", g[i][0].item<int64_t>(), ", ", g[i][1].item<int64_t>(), ", ",
                         g[i][2].item<int64_t>(), ")");
      LF_FAIL("the tokens hold ", count, " ", k.what, " placeholders (model.", k.what, "_token_id ", k.token,
              ") but the ", k.what, " grids ", grids, " make ", tokens_made, " embeddings",
              lf::hint("each medium needs t h w / spatial_merge_size^2 placeholder tokens"));
    }
    pixels.push_back(k.pixels);
    grids.push_back(g);
    counts.push_back(count);
  }
  const at::Tensor all_pixels = pixels.empty() ? at::Tensor() : pixels.size() == 1 ? pixels[0] : at::cat(pixels);
  const at::Tensor all_grids = pixels.empty() ? at::Tensor() : at::cat(grids);
  const at::Tensor encoded = encode_media(tokens, all_pixels, all_grids);
  if (pixels.empty()) {
    // --use-vit-dp-balance: no media here, but the exchange's backward must run on this rank too.
    if (encoded.defined() && encoded.requires_grad()) x = x + encoded.sum().to(x.scalar_type()) * 0.0;
    return x;
  }
  return splice(x, masks, counts, encoded);
}

// Each kind's (images', videos') features replace its placeholders (masks [b, s]) in order.
at::Tensor Qwen25Vl::splice(const at::Tensor& x, const std::vector<at::Tensor>& masks,
                            const std::vector<int64_t>& counts, const at::Tensor& encoded) {
  at::Tensor xb = x.transpose(0, 1);  // [b, s, h]
  int64_t offset = 0;
  for (size_t k = 0; k < 2; ++k) {
    if (counts[k] == 0) continue;
    xb = xb.masked_scatter(masks[k].to(x.device()).unsqueeze(-1),
                           encoded.narrow(0, offset, counts[k]).to(x.scalar_type()));
    offset += counts[k];
  }
  return xb.transpose(0, 1).contiguous();
}

at::Tensor Qwen25Vl::embed_inputs(const Batch& batch) const {
  // The media are spliced into the whole sequence; a context-parallel rank keeps its tokens.
  return foundation().scatter_sequence(context_share(embed_with_media(batch.at("tokens"), media_of(batch))));
}

StageOutput Qwen25Vl::stage_forward(const Batch& batch, const TensorMap& input, int64_t chunk, Pass pass) {
  // Packed conversations (--packing-sft-data: document_ids with their restarting 1D positions): the
  // M-RoPE positions restart with each document, and attention stays within it.
  const at::Tensor* documents = batch.find("document_ids");
  LF_CHECK(!batch.contains("position_ids") || documents,
           "qwen2_5_vl computes its M-RoPE position ids from the tokens and the media grids; a batch with "
           "position_ids but no document_ids (--reset-position-ids) is not supported",
           lf::hint("drop --reset-position-ids (packed conversations: --packing-sft-data)"));
  Batch with = batch;
  with.set("position_ids", position_ids(batch.at("tokens"), media_of(batch), documents ? *documents : at::Tensor()), 2);
  return CausalLm::stage_forward(with, input, chunk, pass);
}

at::Tensor Qwen25Vl::logits(const at::Tensor& tokens, const at::Tensor& pixel_values,
                            const at::Tensor& image_grid_thw) const {
  Qwen25VlMedia m;
  m.pixel_values = pixel_values;
  m.image_grid_thw = image_grid_thw;
  return logits(tokens, m);
}

at::Tensor Qwen25Vl::logits(const at::Tensor& tokens, const Qwen25VlMedia& media) const {
  check_whole_model("Qwen25Vl::logits");
  at::Tensor x = foundation().scatter_sequence(embed_with_media(tokens, media));
  DecoderInputs in;
  in.seq = tokens.size(1);
  in.position_ids = position_ids(tokens, media);
  x = foundation().run_layers(x, in);
  return lm_head().full_logits(lm_head().local_logits(foundation().final_norm(x)));
}

void Qwen25Vl::load_hf_state(const std::map<std::string, at::Tensor>& tensors) {
  // transformers 5: model.visual.*, model.language_model.*; transformers 4: visual.*, model.*.
  const bool v5 = std::any_of(tensors.begin(), tensors.end(),
                              [](const auto& e) { return e.first.rfind("model.language_model.", 0) == 0; });
  const std::string visual = v5 ? "model.visual." : "visual.", lm = v5 ? "model.language_model." : "model.";
  load_vlm_hf_state(*this, tensors, visual, lm, "Qwen2ForCausalLM", "qwen2", "Qwen2_5_VLForConditionalGeneration",
                    encoder_ ? std::function<void(const std::map<std::string, at::Tensor>&)>(
                                   [&](const std::map<std::string, at::Tensor>& v) { encoder_->load_hf_state(v, visual); })
                             : nullptr);
}

// --- plan -------------------------------------------------------------------------------------

namespace {

class Qwen25VlPlan : public VlmPlan<Qwen25VisionConfig, Qwen25VlConfig> {
 public:
  Qwen25VlPlan(std::shared_ptr<const ModelConfig> config, const PlanArgs& args, lf::config::ErrorList& errors)
      : VlmPlan(config, args, errors, "qwen2_5_vl") {
    foundation_ = qwen2_5_vl_foundation(foundation_);
    if (foundation_.mrope_section.size() != 3)
      errors.add("model.foundation.mrope_section", origin(args, "model.foundation.mrope_section"),
                 "qwen2_5_vl needs M-RoPE in its foundation, and its rotary dims are too few (< 8) for the default "
                 "sections",
                 "set model.foundation.mrope_section to 3 sections summing to the rotary head_dim / 2 (Qwen2.5-VL: "
                 "[16, 24, 24])");
  }

  DataNeeds data_needs() const override { return store_media_needs(); }

  std::unique_ptr<Model> build(const BuildArgs& args) const override { return build_vlm<Qwen25Vl>(args); }

 protected:
  // model.mock_image_patches (0: 2 x merge).
  int64_t mock_side() const override {
    return own_.mock_image_patches ? own_.mock_image_patches : 2 * vision_.spatial_merge_size;
  }
};

std::unique_ptr<ModelPlan> plan_qwen2_5_vl(std::shared_ptr<const ModelConfig> c, const PlanArgs& a,
                                           lf::config::ErrorList& e) {
  return std::make_unique<Qwen25VlPlan>(std::move(c), a, e);
}

}  // namespace

void register_qwen2_5_vl(Registry& r) {
  CompositeType t;
  t.name = kType;
  t.description = "Qwen2.5-VL: a vision tower's merged patches spliced into an M-RoPE decoder at image placeholders";
  t.slots = {{"vision_encoder", "vision_encoder", "qwen2_5_vl_vision", true}, {"foundation", "foundation", "decoder", true}};
  t.load_own = schema_loader<Qwen25VlConfig>();
  t.plan = plan_qwen2_5_vl;
  r.add(std::move(t));
}

}  // namespace lf::models

#include "loongforge/models/composites/pi05.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "loongforge/backend/fp8.h"
#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/parallel/tensor/cross_entropy.h"
#include "loongforge/parallel/tensor/layers.h"
#include "loongforge/parallel/tensor/mappings.h"
#include "pi05_tensors.h"
#include "policy_streams.h"

namespace lf::models {

using pi05_tensors::additive_mask;
using pi05_tensors::gated_add;
using pi05_tensors::prefix_rows;
using pi05_tensors::rope_per_token;
using pi05_tensors::rope_tables;

namespace {

const std::string kType = "pi05";
const std::string kVision = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.";
const std::string kProjector = "paligemma_with_expert.paligemma.model.multi_modal_projector.linear.";
const std::string kLm = "paligemma_with_expert.paligemma.model.language_model.";
const std::string kExpert = "paligemma_with_expert.gemma_expert.model.";

// The parameters, declared in one order for the model and for the records.
struct Declared {
  at::Tensor patch_w, patch_b, pos_emb, post_ln_w, post_ln_b, proj_w, proj_b, embed, lm_norm;
  struct Vision {
    at::Tensor ln1_w, ln1_b, q, q_b, k, k_b, v, v_b, out, out_b, ln2_w, ln2_b, fc1, fc1_b, fc2, fc2_b;
  };
  struct Layer {
    at::Tensor in_w, in_dense, in_dense_b, post_w, post_dense, post_dense_b, q, k, v, o, gate, up, down;
  };
  std::vector<Vision> vision;
  std::vector<Layer> vlm, expert;
  at::Tensor expert_norm_dense, expert_norm_dense_b;
  at::Tensor action_in_w, action_in_b, action_out_w, action_out_b, time_in_w, time_in_b, time_out_w, time_out_b;
};

}  // namespace

at::Tensor sincos2d_position_embedding(const SiglipConfig& sv) {
  const int64_t side = sv.image_size / sv.patch_size, q = sv.hidden_size / 4;
  LF_CHECK(q * 4 == sv.hidden_size, "pi05 vision_encoder: sincos2d needs hidden_size divisible by 4, not ",
           sv.hidden_size);
  const at::Tensor idx = at::arange(side * side, at::kDouble);
  const at::Tensor x = at::remainder(idx, side).unsqueeze(1), y = at::floor_divide(idx, side).unsqueeze(1);
  const at::Tensor omega = at::pow(10000.0, -at::arange(q, at::kDouble) / static_cast<double>(q)).unsqueeze(0);
  return at::cat({at::sin(x * omega), at::cos(x * omega), at::sin(y * omega), at::cos(y * omega)}, 1).to(at::kFloat);
}

namespace {

// tp: the TP size the shardings are for (b's group, or a records-only builder's target layout).
Declared declare(ParamBuilder& b, int tp, const SiglipConfig& sv, const PiGemmaConfig& vlm, const PiGemmaConfig& ex,
                 const Pi05Config& c) {
  using lf::parallel::Sharding;
  constexpr double kStd = 0.02;
  // A weight matrix of the fresh policy: N(0, 0.02), or N(0, 1 / fan_in) (fan_in: the elements of
  // one output row, e.g. 3 x patch^2 for the patch embedding, the width for the token embedding).
  auto init = [&](std::vector<int64_t> shape) {
    int64_t fan_in = 1;
    for (size_t i = 1; i < shape.size(); ++i) fan_in *= shape[i];
    return b.normal(shape, c.init_method == "fan_in" ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : kStd);
  };
  auto zeros = [&](std::vector<int64_t> s) {
    return b.meta() ? at::empty(s, at::TensorOptions().dtype(at::kFloat).device(c10::kMeta)) : at::zeros(s);
  };
  auto ones = [&](std::vector<int64_t> s) {
    return b.meta() ? at::empty(s, at::TensorOptions().dtype(at::kFloat).device(c10::kMeta)) : at::ones(s);
  };
  auto rep = Sharding::replicated();
  auto col = Sharding::along(0);
  auto row = Sharding::along(1);
  Declared d;
  const int64_t hv = sv.hidden_size;
  d.patch_w = b.add(kVision + "embeddings.patch_embedding.weight", init({hv, 3, sv.patch_size, sv.patch_size}),
                    rep, false);
  d.patch_b = b.add(kVision + "embeddings.patch_embedding.bias", zeros({hv}), rep, true);
  at::Tensor pos = init({sv.tokens_per_image(), hv});  // drawn either way: the stream stays the same
  if (sv.position_embedding_init == "sincos2d" && !b.meta()) pos = sincos2d_position_embedding(sv);
  d.pos_emb = b.add(kVision + "embeddings.position_embedding.weight", pos, rep, true);
  for (int64_t i = 0; i < sv.num_hidden_layers; ++i) {
    const std::string p = kVision + "encoder.layers." + std::to_string(i) + ".";
    Declared::Vision l;
    l.ln1_w = b.add(p + "layer_norm1.weight", ones({hv}), rep, true);
    l.ln1_b = b.add(p + "layer_norm1.bias", zeros({hv}), rep, true);
    l.k = b.add(p + "self_attn.k_proj.weight", init({hv, hv}), col, false);
    l.k_b = b.add(p + "self_attn.k_proj.bias", zeros({hv}), col, true);
    l.v = b.add(p + "self_attn.v_proj.weight", init({hv, hv}), col, false);
    l.v_b = b.add(p + "self_attn.v_proj.bias", zeros({hv}), col, true);
    l.q = b.add(p + "self_attn.q_proj.weight", init({hv, hv}), col, false);
    l.q_b = b.add(p + "self_attn.q_proj.bias", zeros({hv}), col, true);
    l.out = b.add(p + "self_attn.out_proj.weight", init({hv, hv}), row, false);
    l.out_b = b.add(p + "self_attn.out_proj.bias", zeros({hv}), rep, true);
    l.ln2_w = b.add(p + "layer_norm2.weight", ones({hv}), rep, true);
    l.ln2_b = b.add(p + "layer_norm2.bias", zeros({hv}), rep, true);
    l.fc1 = b.add(p + "mlp.fc1.weight", init({sv.intermediate_size, hv}), col, false);
    l.fc1_b = b.add(p + "mlp.fc1.bias", zeros({sv.intermediate_size}), col, true);
    l.fc2 = b.add(p + "mlp.fc2.weight", init({hv, sv.intermediate_size}), row, false);
    l.fc2_b = b.add(p + "mlp.fc2.bias", zeros({hv}), rep, true);
    d.vision.push_back(l);
  }
  d.post_ln_w = b.add(kVision + "post_layernorm.weight", ones({hv}), rep, true);
  d.post_ln_b = b.add(kVision + "post_layernorm.bias", zeros({hv}), rep, true);
  d.proj_w = b.add(kProjector + "weight", init({vlm.width, hv}), rep, false);
  d.proj_b = b.add(kProjector + "bias", zeros({vlm.width}), rep, true);
  d.embed = b.add(kLm + "embed_tokens.weight", init({vlm.vocab_size, vlm.width}), col, false);

  // A Gemma stack. Keys/values whose head count TP does not divide are replicated: each rank's queries
  // use them, and their output gradients are summed over TP before their GEMMs (Pi05::qkv), so
  // their weights' gradients are whole on every rank (ParamBuilder::TpGrad::whole). The prefix
  // LM's last query and output projections, MLP and post-attention norm feed only its final norm,
  // which pi0.5 never reads (only that layer's keys and values are):
  // no gradient reaches them, so they are model state (kept, saved, never trained), as LeRobot's
  // AdamW skips them for want of a gradient. The prefix LM loss (prefix_lm_loss_weight > 0) reads
  // them: then they are parameters.
  auto stack = [&](const std::string& prefix, const PiGemmaConfig& g, bool adaptive, bool prefix_lm) {
    std::vector<Declared::Layer> out;
    const bool kv_split = g.num_kv_heads % tp == 0;
    const int64_t w = g.width, qd = g.num_heads * g.head_dim, kvd = g.num_kv_heads * g.head_dim;
    for (int64_t i = 0; i < g.depth; ++i) {
      const std::string p = prefix + "layers." + std::to_string(i) + ".";
      const bool dead = prefix_lm && i == g.depth - 1;
      auto add = [&](const std::string& name, const at::Tensor& full, Sharding s, bool nwd,
                     ParamBuilder::TpGrad grad = ParamBuilder::TpGrad::by_layout) {
        return dead && name.find("self_attn.k_proj") == std::string::npos &&
                       name.find("self_attn.v_proj") == std::string::npos &&
                       name.find("input_layernorm") == std::string::npos
                   ? b.add_state(p + name, full)
                   : b.add(p + name, full, s, nwd, grad);
      };
      Declared::Layer l;
      l.q = add("self_attn.q_proj.weight", init({qd, w}), col, false);
      const auto kv_grad = kv_split ? ParamBuilder::TpGrad::by_layout : ParamBuilder::TpGrad::whole;
      l.k = add("self_attn.k_proj.weight", init({kvd, w}), kv_split ? col : rep, false, kv_grad);
      l.v = add("self_attn.v_proj.weight", init({kvd, w}), kv_split ? col : rep, false, kv_grad);
      l.o = add("self_attn.o_proj.weight", init({w, qd}), row, false);
      l.gate = add("mlp.gate_proj.weight", init({g.mlp_dim, w}), col, false);
      l.up = add("mlp.up_proj.weight", init({g.mlp_dim, w}), col, false);
      l.down = add("mlp.down_proj.weight", init({w, g.mlp_dim}), row, false);
      if (adaptive) {
        l.in_dense = add("input_layernorm.dense.weight", zeros({3 * w, w}), rep, false);
        l.in_dense_b = add("input_layernorm.dense.bias", zeros({3 * w}), rep, true);
        l.post_dense = add("post_attention_layernorm.dense.weight", zeros({3 * w, w}), rep, false);
        l.post_dense_b = add("post_attention_layernorm.dense.bias", zeros({3 * w}), rep, true);
      } else {
        l.in_w = add("input_layernorm.weight", zeros({w}), rep, true);
        l.post_w = add("post_attention_layernorm.weight", zeros({w}), rep, true);
      }
      out.push_back(l);
    }
    return out;
  };
  const bool prefix_lm = c.prefix_lm_loss_weight > 0;
  d.vlm = stack(kLm, vlm, false, !prefix_lm);
  d.lm_norm = prefix_lm ? b.add(kLm + "norm.weight", zeros({vlm.width}), rep, true)
                        : b.add_state(kLm + "norm.weight", zeros({vlm.width}));
  d.expert = stack(kExpert, ex, true, false);
  d.expert_norm_dense = b.add(kExpert + "norm.dense.weight", zeros({3 * ex.width, ex.width}), rep, false);
  d.expert_norm_dense_b = b.add(kExpert + "norm.dense.bias", zeros({3 * ex.width}), rep, true);
  const int64_t we = ex.width, a = c.max_action_dim;
  d.action_in_w = b.add("action_in_proj.weight", init({we, a}), rep, false);
  d.action_in_b = b.add("action_in_proj.bias", zeros({we}), rep, true);
  d.action_out_w = b.add("action_out_proj.weight", init({a, we}), rep, false);
  d.action_out_b = b.add("action_out_proj.bias", zeros({a}), rep, true);
  d.time_in_w = b.add("time_mlp_in.weight", init({we, we}), rep, false);
  d.time_in_b = b.add("time_mlp_in.bias", zeros({we}), rep, true);
  d.time_out_w = b.add("time_mlp_out.weight", init({we, we}), rep, false);
  d.time_out_b = b.add("time_mlp_out.bias", zeros({we}), rep, true);
  return d;
}

}  // namespace

Pi05::Pi05(const SiglipConfig& vision, const PiGemmaConfig& vlm, const PiGemmaConfig& expert, const Pi05Config& config,
           const lf::backend::DeviceBackend& backend, uint64_t seed, at::ScalarType dtype,
           const lf::dist::ParallelContext* parallel, Pi05Freeze freeze)
    : backend_(backend), parallel_(parallel), tp_(tensor_parallel_of(parallel, false)), freeze_(freeze),
      vision_(vision), vlm_(vlm), expert_(expert), config_(config), seed_(seed) {
  LF_CHECK(vlm.num_heads == expert.num_heads && vlm.num_kv_heads == expert.num_kv_heads &&
               vlm.head_dim == expert.head_dim,
           "pi05: the PaliGemma LM and the action expert share each layer's attention: their num_heads, num_kv_heads "
           "and head_dim must be equal");
  LF_CHECK(vlm.depth == expert.depth, "pi05: the PaliGemma LM has ", vlm.depth, " layers and the action expert ",
           expert.depth, "; they run layer by layer together");
  ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(seed), dtype, backend.device(), tp_, true);
  auto d = declare(b, tp_.size(), vision, vlm, expert, config);
  patch_w_ = d.patch_w, patch_b_ = d.patch_b, pos_emb_ = d.pos_emb, post_ln_w_ = d.post_ln_w, post_ln_b_ = d.post_ln_b;
  proj_w_ = d.proj_w, proj_b_ = d.proj_b, embed_ = d.embed, lm_norm_ = d.lm_norm;
  for (const auto& l : d.vision)
    vision_layers_.push_back({l.ln1_w, l.ln1_b, l.q, l.q_b, l.k, l.k_b, l.v, l.v_b, l.out, l.out_b, l.ln2_w, l.ln2_b,
                              l.fc1, l.fc1_b, l.fc2, l.fc2_b});
  auto layers = [](const std::vector<Declared::Layer>& in) {
    std::vector<GemmaLayer> out;
    for (const auto& l : in)
      out.push_back({{l.in_w, l.in_dense, l.in_dense_b}, {l.post_w, l.post_dense, l.post_dense_b}, l.q, l.k, l.v, l.o,
                     l.gate, l.up, l.down});
    return out;
  };
  vlm_layers_ = layers(d.vlm);
  expert_layers_ = layers(d.expert);
  expert_final_ = {{}, d.expert_norm_dense, d.expert_norm_dense_b};
  unit_weight_ = at::ones({expert.width}, at::TensorOptions().dtype(at::kFloat).device(backend.device()));
  action_in_w_ = d.action_in_w, action_in_b_ = d.action_in_b, action_out_w_ = d.action_out_w;
  action_out_b_ = d.action_out_b, time_in_w_ = d.time_in_w, time_in_b_ = d.time_in_b, time_out_w_ = d.time_out_w;
  time_out_b_ = d.time_out_b;
  for (auto& p : b.take()) {
    if (p.state) {
      state_.push_back(std::move(p));
      continue;
    }
    // The projector trains with the LM: LeRobot's freeze_vision_encoder freezes the tower only.
    const bool vision = p.name.starts_with(kVision);
    const bool lm = p.name.starts_with(kLm) || p.name.starts_with(kProjector);
    const bool frozen = vision ? freeze.vision_encoder : lm ? freeze.foundation : freeze.action_expert;
    if (frozen) p.tensor.requires_grad_(false);
    params_.push_back(p);
    (vision ? vision_params_ : lm ? vlm_params_ : expert_params_).push_back(std::move(p));
  }
}

const std::string& Pi05::type() const { return kType; }

void Pi05::load_full(const std::map<std::string, at::Tensor>& full, const std::string& source) {
  c10::NoGradGuard no_grad;
  size_t used = 0;
  for (const auto* group : {&params_, &state_})
    for (const auto& p : *group) {
      auto it = full.find(p.name);
      LF_CHECK(it != full.end(), source, " lacks tensor '", p.name, "', which the pi05 model needs",
               lf::hint("the weights and the model's configuration disagree"));
      const auto shape = p.full_shape();
      LF_CHECK(it->second.sizes().vec() == shape, source, ": tensor '", p.name, "' has shape ", it->second.sizes(),
               ", but the model needs ", at::IntArrayRef(shape));
      p.tensor.copy_(p.sharding.shard(it->second, p.tp_rank, p.tp_size));
      ++used;
    }
  if (used != full.size())
    for (const auto& [name, t] : full) {
      bool known = false;
      for (const auto* group : {&params_, &state_})
        for (const auto& p : *group) known = known || p.name == name;
      LF_CHECK(known, source, " holds tensor '", name, "', which the pi05 model does not have",
               lf::hint("the weights and the model's configuration disagree"));
    }
}

std::vector<ParameterGroup> Pi05::parameter_groups() const {
  std::vector<ParameterGroup> g{ParameterGroup{"vision_encoder", vision_params_, parallel_, !freeze_.vision_encoder},
                                ParameterGroup{"model", vlm_params_, parallel_, !freeze_.foundation},
                                ParameterGroup{"action_expert", expert_params_, parallel_, !freeze_.action_expert}};
  if (!state_.empty()) g.push_back(ParameterGroup{"model_state", state_, parallel_, false});
  return g;
}

std::vector<std::string> Pi05::batch_fields() const {
  std::vector<std::string> f{"images", "image_masks", "prompt_tokens", "prompt_masks", "actions"};
  if (prefix_lm()) f.push_back("prompt_labels");
  return f;
}

std::vector<std::string> Pi05::eval_metrics() const {
  if (prefix_lm()) return {kLoss, kPrefixLmLoss};
  return {kLoss};
}

const at::Tensor& Pi05::prompt_labels(const Batch& batch) const {
  LF_CHECK(batch.contains("prompt_labels"), "pi05: model.prefix_lm_loss_weight is ", config_.prefix_lm_loss_weight,
           " but the batch has no field 'prompt_labels' (token ids the prefix LM is trained to predict at prompt "
           "positions)",
           lf::hint("train on a store made by loongforge-data make-demo-reach --position-queries, or set "
                    "model.prefix_lm_loss_weight 0"));
  return batch.at("prompt_labels");
}

std::map<std::string, double> Pi05::loss_counts(const Batch& batch) const {
  const auto& a = batch.at("actions");
  std::map<std::string, double> c{{kLoss, static_cast<double>(a.size(0) * config_.chunk_size * config_.action_dim)}};
  if (prefix_lm()) c[kPrefixLmLoss] = static_cast<double>(prompt_labels(batch).ge(0).sum().item<int64_t>());
  return c;
}

Pi05Inputs Pi05::inputs_of(const Batch& batch) const {
  // The model's inputs (training reads `actions` too, sampling does not).
  for (const char* f : {"images", "image_masks", "prompt_tokens", "prompt_masks"})
    LF_CHECK(batch.contains(f), "pi05: the batch has no field '", f, "' (its inputs are images, image_masks, ",
             "prompt_tokens, prompt_masks)");
  const auto dev = backend_.device();
  Pi05Inputs in;
  in.images = batch.at("images").to(dev, at::kFloat).transpose(0, 1);         // [n_cam, b, 3, H, W]
  in.img_masks = batch.at("image_masks").to(dev).to(at::kBool).transpose(0, 1);  // [n_cam, b]
  in.tokens = batch.at("prompt_tokens").to(dev, at::kLong);
  in.masks = batch.at("prompt_masks").to(dev).to(at::kBool);
  if (batch.contains("prompt_ar_mask")) in.ar_mask = batch.at("prompt_ar_mask").to(dev).to(at::kBool);
  return in;
}

// --- the vision tower ---------------------------------------------------------------------------

at::Tensor Pi05::embed_images(const at::Tensor& images) const {
  using lf::parallel::column_parallel_linear;
  using lf::parallel::row_parallel_linear;
  const auto& c = vision_;
  LF_CHECK(images.dim() == 4 && images.size(1) == 3 && images.size(2) == c.image_size && images.size(3) == c.image_size,
           "pi05: images must be [n, 3, ", c.image_size, ", ", c.image_size, "] (the vision tower's image_size), got ",
           images.sizes());
  const int64_t n = images.size(0), t = c.tokens_per_image();
  const int64_t heads = c.num_attention_heads / tp_.size(), hd = c.hidden_size / c.num_attention_heads;
  // SigLIP's patch embedding (a conv with stride = kernel) as one GEMM over the patches, each
  // flattened (channel, row, column) as the conv weight is, in row-major patch order: no conv
  // (mkldnn's forward and backward cost ~5x the GEMMs at these sizes); no input gradient.
  const int64_t p = c.patch_size, side = c.image_size / p;
  auto patches = images.to(patch_w_.scalar_type())
                     .view({n, 3, side, p, side, p})
                     .permute({0, 2, 4, 1, 3, 5})
                     .reshape({n, side * side, 3 * p * p});
  auto x = at::linear(patches, patch_w_.flatten(1), patch_b_) + pos_emb_;  // [n, t, hidden]
  for (const auto& l : vision_layers_) {
    auto h = lf::ops::layer_norm(backend_, x, l.ln1_w, l.ln1_b, c.layer_norm_eps);
    auto split = [&](const at::Tensor& y) { return y.view({n, t, heads, hd}).transpose(1, 2); };
    auto q = split(column_parallel_linear(h, l.q, l.q_b, tp_, false, sink_));
    auto k = split(column_parallel_linear(h, l.k, l.k_b, tp_, false, sink_));
    auto v = split(column_parallel_linear(h, l.v, l.v_b, tp_, false, sink_));
    auto o = lf::ops::sdpa(backend_, q, k, v, lf::backend::AttentionMask::none());
    x = x + row_parallel_linear(o.transpose(1, 2).reshape({n, t, heads * hd}), l.out, l.out_b, tp_, sink_);
    h = lf::ops::layer_norm(backend_, x, l.ln2_w, l.ln2_b, c.layer_norm_eps);
    h = lf::ops::gelu_tanh(backend_, column_parallel_linear(h, l.fc1, l.fc1_b, tp_, false, sink_));
    x = x + row_parallel_linear(h, l.fc2, l.fc2_b, tp_, sink_);
  }
  x = lf::ops::layer_norm(backend_, x, post_ln_w_, post_ln_b_, c.layer_norm_eps);
  return lf::ops::linear(x, proj_w_, proj_b_, sink_);
}

Pi05::Prefix Pi05::embed_prefix(const Pi05Inputs& in, bool skip_missing) const {
  const int64_t cams = in.images.size(0), b = in.images.size(1);
  LF_CHECK(in.img_masks.dim() == 2 && in.img_masks.size(0) == cams && in.img_masks.size(1) == b,
           "pi05: img_masks must be [n_cam, b] = [", cams, ", ", b, "], got ", in.img_masks.sizes());
  LF_CHECK(in.tokens.dim() == 2 && in.tokens.size(0) == b && in.masks.sizes() == in.tokens.sizes(),
           "pi05: tokens and masks must both be [b, L] with b = ", b, ", got ", in.tokens.sizes(), " and ",
           in.masks.sizes());
  const auto dev = backend_.device();  // callers may hand CPU tensors (generate, the reach policy)
  // A missing camera's image tokens are padding, keys no valid token sees: with skip_missing the
  // tower skips its image and its tokens are zeros (LeRobot runs the tower on the placeholder
  // image). Only a padded query, which sees every key alike, could tell.
  const auto images = in.images.to(dev).flatten(0, 1);  // [cams b, 3, H, W]
  const auto present = in.img_masks.to(dev).reshape({-1});
  const int64_t shown = skip_missing ? present.sum().item<int64_t>() : present.size(0);
  at::Tensor img;  // [cams b, t, width]
  if (shown == 0 || shown == present.size(0)) {
    img = embed_images(images);
  } else {
    const auto rows = present.nonzero().squeeze(1);
    auto some = embed_images(images.index_select(0, rows));
    img = at::zeros({present.size(0), some.size(1), some.size(2)}, some.options()).index_copy(0, rows, some);
  }
  const int64_t t = img.size(1);
  img = img.view({cams, b, t, -1}).transpose(0, 1).reshape({b, cams * t, -1});
  auto img_pad = in.img_masks.to(dev).transpose(0, 1).unsqueeze(-1).expand({b, cams, t}).reshape({b, cams * t});
  // Gemma scales its token embeddings by sqrt(width), in the embedding's dtype.
  const double scale = static_cast<double>(static_cast<float>(std::sqrt(static_cast<double>(vlm_.width))));
  auto lang = lf::parallel::vocab_parallel_embedding(in.tokens.to(dev), embed_, tp_) * scale;
  Prefix p{at::cat({img.to(lang.scalar_type()), lang}, 1), at::cat({img_pad, in.masks.to(dev)}, 1), {}};
  if (in.ar_mask.defined()) {
    LF_CHECK(in.ar_mask.sizes() == in.tokens.sizes(), "pi05: prompt_ar_mask must be [b, L] = ", in.tokens.sizes(),
             " (the prompt_tokens' shape), got ", in.ar_mask.sizes());
    // openpi's make_att_2d_masks: the blocks are the cumulative sum of the ar mask (images: 0).
    p.block = at::cat({at::zeros({b, cams * t}, at::TensorOptions().dtype(at::kLong).device(dev)),
                       in.ar_mask.to(dev, at::kLong).cumsum(1)},
                      1);
  }
  return p;
}

std::pair<at::Tensor, at::Tensor> Pi05::embed_suffix(const at::Tensor& x_t, const at::Tensor& time) const {
  const int64_t dim = expert_.width;
  // openpi's sine-cosine embedding of the time, in float64, then the time's dtype.
  auto fraction = at::linspace(0.0, 1.0, dim / 2, at::TensorOptions().dtype(at::kDouble));
  auto period = config_.min_period * at::pow(config_.max_period / config_.min_period, fraction);
  auto factor = (1.0 / period) * (2.0 * M_PI);
  auto arg = factor.unsqueeze(0) * time.to(at::kCPU, at::kDouble).unsqueeze(1);
  auto emb = at::cat({arg.sin(), arg.cos()}, 1).to(at::kFloat).to(x_t.device());
  auto dtype = action_in_w_.scalar_type();
  auto actions = lf::ops::linear(x_t.to(dtype), action_in_w_, action_in_b_, sink_);
  auto cond = at::silu(lf::ops::linear(at::silu(lf::ops::linear(emb.to(dtype), time_in_w_, time_in_b_, sink_)), time_out_w_,
                                       time_out_b_, sink_));
  return {actions, cond};
}

// --- the Gemma layers ---------------------------------------------------------------------------

std::pair<at::Tensor, at::Tensor> Pi05::norm(const Norm& n, const at::Tensor& x, const at::Tensor& cond,
                                             double eps) const {
  if (!n.dense.defined()) return {lf::ops::rms_norm(backend_, x, 1.0 + n.weight, eps), {}};
  auto mod = lf::ops::linear(cond, n.dense, n.dense_bias, sink_).unsqueeze(1);  // [b, 1, 3 w]
  auto parts = mod.chunk(3, -1);
  if (x.scalar_type() == at::kFloat) {  // the backend's fused RMSNorm (unit weight), then shift + normed (1 + scale)
    auto normed = lf::ops::rms_norm(backend_, x, unit_weight_, eps);
    return {at::addcmul(parts[1], normed, 1.0 + parts[0]), parts[2]};
  }
  // Lower precision as openpi: the statistics and the modulation in fp32, the result in x's dtype.
  auto var = x.to(at::kFloat).square().mean(-1, true);
  auto normed = x * at::rsqrt(var + eps);
  auto out = normed * (1.0 + parts[0].to(at::kFloat)) + parts[1].to(at::kFloat);
  return {out.to(x.scalar_type()), parts[2].to(x.scalar_type())};
}

bool Pi05::set_fp8(const lf::ops::Fp8Policy* fp8) {
  const auto n = static_cast<int64_t>(vlm_layers_.size());
  const std::vector<bool> on = fp8 ? fp8->layers_in_fp8(n, "layers") : std::vector<bool>(vlm_layers_.size(), false);
  fp8_ = fp8;
  for (size_t i = 0; i < vlm_layers_.size(); ++i) vlm_layers_[i].fp8 = expert_layers_[i].fp8 = on[i];
  return fp8 == nullptr || std::find(on.begin(), on.end(), true) != on.end();
}

const lf::ops::Fp8Recipe* Pi05::fp8_for(const GemmaLayer& l, lf::ops::Fp8Gemm kind, const at::Tensor& x) const {
  return l.fp8 && fp8_ != nullptr ? fp8_->choose(kind, x.numel() / x.size(-1)) : nullptr;
}

at::Tensor Pi05::mlp(const GemmaLayer& l, const at::Tensor& x) const {
  using lf::parallel::column_parallel_linear;
  const auto* f1 = fp8_for(l, lf::ops::Fp8Gemm::fc1, x);
  auto gate = column_parallel_linear(x, l.gate, {}, tp_, false, sink_, f1),
       up = column_parallel_linear(x, l.up, {}, tp_, false, sink_, f1);
  // fp32: the backend's fused GeGLU; bf16 rounds gelu(gate) before the product, as openpi does.
  auto h = x.scalar_type() == at::kFloat ? lf::ops::geglu_tanh(backend_, gate, up) : lf::ops::gelu_tanh(backend_, gate) * up;
  return lf::parallel::row_parallel_linear(h, l.down, {}, tp_, sink_, fp8_for(l, lf::ops::Fp8Gemm::fc2, h));
}

at::Tensor Pi05::out_proj(const GemmaLayer& l, const at::Tensor& o) const {
  return lf::parallel::row_parallel_linear(o, l.o, {}, tp_, sink_, fp8_for(l, lf::ops::Fp8Gemm::proj, o));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> Pi05::qkv(const GemmaLayer& l, const PiGemmaConfig& c,
                                                         const at::Tensor& x, const at::Tensor& cos,
                                                         const at::Tensor& sin, bool kv_only) const {
  // Entering the TP region once: the gradient of x sums every rank's heads.
  auto xt = tp_.tp ? lf::parallel::copy_to_tp(x, *tp_.tp) : x;
  const int64_t b = x.size(0), s = x.size(1), d = c.head_dim;
  const auto* f = fp8_for(l, lf::ops::Fp8Gemm::qkv, xt);
  // Column-parallel projections: under TP a tensorwise amax is reduced over the TP group.
  auto column = [&](const at::Tensor& in, const at::Tensor& w) {
    return f ? lf::ops::fp8_linear(in, w, {}, *f, sink_, tp_.size() > 1 ? tp_.tp : nullptr)
             : lf::ops::linear(in, w, {}, sink_);
  };
  // Keys/values whose head count TP does not divide are replicated and every rank's queries read
  // them: their output gradients are summed over TP before their GEMMs (one all-reduce for both), so
  // those quantize (FP8) the whole gradient as one process does and compute whole weight and input
  // gradients; the input's is counted once in the entry's sum.
  at::Tensor k, v;
  if (tp_.size() > 1 && c.num_kv_heads % tp_.size() != 0) {
    const auto in = lf::parallel::once_over_tp(xt, *tp_.tp);
    auto proj = [&](const at::Tensor& w) {
      return f ? lf::ops::fp8_linear(in, w, {}, *f, sink_, nullptr) : lf::ops::linear(in, w, {}, sink_);
    };
    const int64_t kvd = l.k.size(0);
    const auto both = lf::parallel::copy_to_tp(at::cat({proj(l.k), proj(l.v)}, -1), *tp_.tp);
    k = both.narrow(-1, 0, kvd);
    v = both.narrow(-1, kvd, kvd);
  } else {
    k = column(xt, l.k);
    v = column(xt, l.v);
  }
  k = k.reshape({b, s, -1, d});
  v = v.reshape({b, s, -1, d});
  if (kv_only) return {at::Tensor(), rope_per_token(backend_, k, cos, sin), v};
  auto q = column(xt, l.q).view({b, s, -1, d});
  return {rope_per_token(backend_, q, cos, sin), rope_per_token(backend_, k, cos, sin), v};
}

at::Tensor Pi05::attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& mask) const {
  // q [b, s, n, d], k/v [b, t, nkv, d], mask [b, 1, s, t] (additive_mask) -> [b, s, n d]
  auto o = lf::ops::sdpa(backend_, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                         lf::backend::AttentionMask::additive(mask));
  return o.transpose(1, 2).flatten(2);
}

std::pair<at::Tensor, at::Tensor> Pi05::joint_forward(const Prefix& p, const at::Tensor& suffix, const at::Tensor& cond,
                                                      bool with_prefix) const {
  const int64_t b = p.embs.size(0), np = p.embs.size(1), ns = suffix.size(1);
  auto pad = at::cat({p.pad, at::ones({b, ns}, p.pad.options())}, 1);  // [b, np + ns]
  auto positions = pad.to(at::kLong).cumsum(1) - 1;
  // Prefix tokens see the valid prefix (of their own and earlier blocks); suffix tokens see the
  // valid prefix and the whole suffix.
  at::Tensor block;
  if (p.block.defined())
    block = at::cat({p.block, at::full({b, ns}, np + 1, p.block.options())}, 1);  // [b, np + ns]
  else
    block = at::cat({at::zeros({np}, at::kLong), at::ones({ns}, at::kLong)}).to(pad.device()).unsqueeze(0);
  auto allowed = (block.unsqueeze(1) <= block.unsqueeze(2)) & pad.unsqueeze(1) & pad.unsqueeze(2);
  const auto mask = additive_mask(allowed);
  auto [cos, sin] = rope_tables(positions, vlm_.head_dim, vlm_.rope_theta, p.embs.scalar_type());
  auto cos_p = cos.narrow(1, 0, np).contiguous(), sin_p = sin.narrow(1, 0, np).contiguous();
  auto cos_s = cos.narrow(1, np, ns).contiguous(), sin_s = sin.narrow(1, np, ns).contiguous();
  at::Tensor xp = p.embs, xs = suffix;
  // Without the prefix's outputs its padding is skipped (PrefixRows): xp is [1, T, width].
  const auto packed = with_prefix ? std::nullopt : prefix_rows(p.pad, ns);
  if (packed) xp = packed->pack(xp), cos_p = packed->pack(cos_p), sin_p = packed->pack(sin_p);
  auto join = [&](const at::Tensor& a, const at::Tensor& c) { return packed ? packed->join(a, c) : at::cat({a, c}, 1); };
  for (int64_t i = 0; i < vlm_.depth; ++i) {
    const auto& lp = vlm_layers_[i];
    const auto& ls = expert_layers_[i];
    const bool last = i == vlm_.depth - 1 && !with_prefix;
    auto [hp, gp] = norm(lp.input_norm, xp, {}, vlm_.rms_norm_eps);
    auto [hs, gs] = norm(ls.input_norm, xs, cond, expert_.rms_norm_eps);
    // The prefix's last queries feed nothing pi0.5 reads (their weights are model state).
    auto [qp, kp, vp] = qkv(lp, vlm_, hp, cos_p, sin_p, last);
    auto [qs, ks, vs] = qkv(ls, expert_, hs, cos_s, sin_s);
    if (last) {
      // The prefix's last outputs feed nothing pi0.5 reads: only the suffix's queries attend.
      auto o = attention(qs, join(kp, ks), join(vp, vs), mask.narrow(2, np, ns));
      xs = gated_add(xs, out_proj(ls, o), gs);
    } else {
      auto o = attention(join(qp, qs), join(kp, ks), join(vp, vs), mask);
      at::Tensor op, os;
      if (packed) {
        std::tie(op, os) = packed->split(o);
      } else {  // split, not two narrows: the backward concatenates the parts' gradients once
        auto parts = o.split_with_sizes({np, ns}, 1);
        op = parts[0], os = parts[1];
      }
      xp = xp + out_proj(lp, op);
      xs = gated_add(xs, out_proj(ls, os), gs);
      auto [mp, unused] = norm(lp.post_norm, xp, {}, vlm_.rms_norm_eps);
      xp = xp + mlp(lp, mp);
    }
    auto [ms, gms] = norm(ls.post_norm, xs, cond, expert_.rms_norm_eps);
    xs = gated_add(xs, mlp(ls, ms), gms);
  }
  auto out = norm(expert_final_, xs, cond, expert_.rms_norm_eps).first;
  if (!with_prefix) return {out, {}};
  return {out, lf::ops::rms_norm(backend_, xp, 1.0 + lm_norm_, vlm_.rms_norm_eps)};
}

at::Tensor Pi05::lm_head_losses(const at::Tensor& hidden, const at::Tensor& labels) const {
  LF_CHECK(labels.dim() == 2 && labels.size(0) == hidden.size(0) && labels.size(1) == hidden.size(1),
           "pi05: prompt_labels must be [b, L] = [", hidden.size(0), ", ", hidden.size(1), "] (the prompt's shape), got ",
           labels.sizes());
  const auto target = labels.to(backend_.device(), at::kLong).reshape({-1});
  // Entering the TP region: each rank's logits are its vocabulary rows; x's gradient sums over ranks.
  auto x = (tp_.tp ? lf::parallel::copy_to_tp(hidden, *tp_.tp) : hidden).reshape({-1, hidden.size(-1)});
  // The head is the embedding (tied), in its dtype (the cross entropy is fp32); with the sink its
  // weight gradient goes into the buffer slot, the lookup's adds to it.
  auto logits = lf::ops::linear(x.to(embed_.scalar_type()), embed_, {}, sink_);
  auto l = tp_.tp ? lf::parallel::vocab_parallel_cross_entropy(logits, target, *tp_.tp, vlm_.vocab_size)
                  : lf::ops::softmax_cross_entropy(backend_, logits, target);
  return l.view(labels.sizes());
}

at::Tensor Pi05::prefix_lm_losses(const Pi05Inputs& in, const at::Tensor& labels) const {
  // Without the loss the last layer's query, output and MLP weights are model state, whole on every
  // TP rank rather than sharded.
  LF_CHECK(prefix_lm(), "pi05: the prefix LM's head is read only with model.prefix_lm_loss_weight > 0");
  at::Tensor x;
  prefix_cache(embed_prefix(in), &x);
  x = lf::ops::rms_norm(backend_, x, 1.0 + lm_norm_, vlm_.rms_norm_eps);
  const int64_t L = in.tokens.size(1);
  return lm_head_losses(x.narrow(1, x.size(1) - L, L), labels);
}

at::Tensor Pi05::prompt_logits(const Pi05Inputs& in) const {
  LF_CHECK(prefix_lm(), "pi05: the prefix LM's head is read only with model.prefix_lm_loss_weight > 0",
           lf::hint("a policy that decodes its prompt's answers is trained with the prefix LM loss"));
  LF_CHECK(!tp_.tp, "pi05: prompt logits are computed on one process (tensor parallel size 1)");
  at::NoGradGuard no_grad;
  at::Tensor x;
  prefix_cache(embed_prefix(in), &x);
  x = lf::ops::rms_norm(backend_, x, 1.0 + lm_norm_, vlm_.rms_norm_eps);
  const int64_t L = in.tokens.size(1);
  return at::linear(x.narrow(1, x.size(1) - L, L), embed_).to(at::kFloat);
}

at::Tensor Pi05::losses(const Pi05Inputs& in, const at::Tensor& actions, const at::Tensor& noise,
                        const at::Tensor& time) const {
  return train_losses(in, actions, noise, time, {}).first;
}

std::pair<at::Tensor, at::Tensor> Pi05::train_losses(const Pi05Inputs& in, const at::Tensor& actions,
                                                     const at::Tensor& noise, const at::Tensor& time,
                                                     const at::Tensor& labels) const {
  const int64_t b = in.tokens.size(0);
  LF_CHECK(actions.dim() == 3 && actions.size(0) == b && actions.size(1) == config_.chunk_size &&
               actions.size(2) == config_.max_action_dim,
           "pi05: actions must be [b, chunk_size, max_action_dim] = [", b, ", ", config_.chunk_size, ", ",
           config_.max_action_dim, "], got ", actions.sizes());
  LF_CHECK(noise.sizes() == actions.sizes(), "pi05: noise ", noise.sizes(), " must have the actions' shape ",
           actions.sizes());
  LF_CHECK(time.dim() == 1 && time.size(0) == b, "pi05: time must be [b] = [", b, "], got ", time.sizes());
  const auto dev = backend_.device();
  auto a = actions.to(dev, at::kFloat), eps = noise.to(dev, at::kFloat);
  auto t = time.to(dev, at::kFloat).view({b, 1, 1});
  auto x_t = t * eps + (1 - t) * a;
  auto u_t = eps - a;
  auto prefix = embed_prefix(in, !labels.defined());
  auto [suffix, cond] = embed_suffix(x_t, time.to(at::kFloat));
  auto [out, prefix_out] = joint_forward(prefix, suffix.to(prefix.embs.scalar_type()), cond, labels.defined());
  // The suffix is the chunk's action tokens (a full-length narrow would still cost a backward copy).
  auto tail = out.size(1) == config_.chunk_size ? out : out.narrow(1, out.size(1) - config_.chunk_size, config_.chunk_size);
  auto v_t = lf::ops::linear(tail.to(at::kFloat), action_out_w_.to(at::kFloat), action_out_b_.to(at::kFloat), sink_);
  if (!labels.defined()) return {(u_t - v_t).square(), {}};
  const int64_t L = in.tokens.size(1);
  return {(u_t - v_t).square(), lm_head_losses(prefix_out.narrow(1, prefix_out.size(1) - L, L), labels)};
}

// --- sampling -----------------------------------------------------------------------------------

std::vector<Pi05::KV> Pi05::prefix_cache(const Prefix& p, at::Tensor* hidden) const {
  auto positions = p.pad.to(at::kLong).cumsum(1) - 1;
  auto allowed = p.pad.unsqueeze(1) & p.pad.unsqueeze(2);
  if (p.block.defined()) allowed = allowed & (p.block.unsqueeze(1) <= p.block.unsqueeze(2));
  const auto mask = additive_mask(allowed);
  auto [cos, sin] = rope_tables(positions, vlm_.head_dim, vlm_.rope_theta, p.embs.scalar_type());
  std::vector<KV> cache;
  at::Tensor x = p.embs;
  // Without the hidden states the padding is skipped (PrefixRows): x is [1, T, width], the cache
  // padded (zeros at the padding, which denoise_step masks).
  const auto packed = hidden ? std::nullopt : prefix_rows(p.pad, 0);
  if (packed) x = packed->pack(x), cos = packed->pack(cos), sin = packed->pack(sin);
  auto unpack = [&](const at::Tensor& t) { return packed ? packed->join(t, {}) : t; };
  for (int64_t i = 0; i < vlm_.depth; ++i) {
    const auto& l = vlm_layers_[i];
    auto [h, unused] = norm(l.input_norm, x, {}, vlm_.rms_norm_eps);
    const bool last = i == vlm_.depth - 1 && !hidden;  // only the last layer's keys and values are read
    auto [q, k, v] = qkv(l, vlm_, h, cos, sin, last);
    k = unpack(k), v = unpack(v);
    cache.push_back({k, v});
    if (last) break;
    auto o = attention(unpack(q), k, v, mask);
    if (packed) o = packed->split(o).first;
    x = x + out_proj(l, o);
    auto [m, unused2] = norm(l.post_norm, x, {}, vlm_.rms_norm_eps);
    x = x + mlp(l, m);
  }
  if (hidden) *hidden = x;
  return cache;
}

at::Tensor Pi05::denoise_step(const Prefix& p, const std::vector<KV>& cache, const at::Tensor& x_t,
                              const at::Tensor& time) const {
  auto [xs, cond] = embed_suffix(x_t, time);
  xs = xs.to(p.embs.scalar_type());
  const int64_t b = xs.size(0), ns = xs.size(1);
  auto offsets = p.pad.to(at::kLong).sum(1, true);  // [b, 1]
  auto positions = offsets + at::arange(ns, offsets.options()).unsqueeze(0);
  const auto mask = additive_mask(at::cat({p.pad.unsqueeze(1).expand({b, ns, p.pad.size(1)}),
                                           at::ones({b, ns, ns}, p.pad.options())},
                                          2));
  auto [cos, sin] = rope_tables(positions, expert_.head_dim, vlm_.rope_theta, xs.scalar_type());
  for (int64_t i = 0; i < expert_.depth; ++i) {
    const auto& l = expert_layers_[i];
    auto [h, g] = norm(l.input_norm, xs, cond, expert_.rms_norm_eps);
    auto [q, k, v] = qkv(l, expert_, h, cos, sin);
    auto o = attention(q, at::cat({cache[i].k, k}, 1), at::cat({cache[i].v, v}, 1), mask);
    xs = gated_add(xs, out_proj(l, o), g);
    auto [m, gm] = norm(l.post_norm, xs, cond, expert_.rms_norm_eps);
    xs = gated_add(xs, mlp(l, m), gm);
  }
  auto out = norm(expert_final_, xs, cond, expert_.rms_norm_eps).first;
  return at::linear(out.narrow(1, ns - config_.chunk_size, config_.chunk_size).to(at::kFloat),
                    action_out_w_.to(at::kFloat), action_out_b_.to(at::kFloat));
}

at::Tensor Pi05::sample_actions(const Pi05Inputs& in, const at::Tensor& noise, int64_t steps) const {
  if (steps <= 0) steps = config_.num_inference_steps;
  const int64_t b = in.tokens.size(0);
  LF_CHECK(noise.dim() == 3 && noise.size(0) == b && noise.size(1) == config_.chunk_size &&
               noise.size(2) == config_.max_action_dim,
           "pi05: noise must be [b, chunk_size, max_action_dim] = [", b, ", ", config_.chunk_size, ", ",
           config_.max_action_dim, "], got ", noise.sizes());
  at::NoGradGuard no_grad;
  auto prefix = embed_prefix(in, true);
  auto cache = prefix_cache(prefix);
  const double dt = -1.0 / static_cast<double>(steps);
  auto x = noise.to(backend_.device(), at::kFloat);
  for (int64_t step = 0; step < steps; ++step) {
    const float time = static_cast<float>(1.0 + static_cast<double>(step) * dt);
    auto v = denoise_step(prefix, cache, x, at::full({b}, time, at::kFloat));
    x = x + dt * v;
  }
  return x;
}

// --- training -----------------------------------------------------------------------------------

at::Tensor Pi05::sample_time(const at::Tensor& ids) const {
  // t ~ Beta(alpha, beta) x scale + offset per sample, from a stream keyed by (seed, step, sample):
  // the same draw on every layout. Beta from two Gammas.
  std::vector<float> out;
  for (double beta : policy_streams::beta_draws(seed_, step_, ids, config_.time_sampling_beta_alpha,
                                                config_.time_sampling_beta_beta))
    out.push_back(static_cast<float>(beta * config_.time_sampling_scale + config_.time_sampling_offset));
  return at::tensor(out, at::kFloat);
}

StageOutput Pi05::stage_forward(const Batch& batch, const TensorMap&, int64_t, Pass pass) {
  auto in = inputs_of(batch);
  seen_cameras_ = in.images.size(0);
  seen_prompt_ = in.tokens.size(1);
  const auto& actions = batch.at("actions");
  const int64_t b = actions.size(0);
  LF_CHECK(static_cast<int64_t>(batch.sample_indices.size()) == b, "pi05: the batch has ", b, " samples but ",
           batch.sample_indices.size(), " sample indices");
  const auto noise =
      policy_streams::noise_draws(seed_, step_, batch.sample_indices, {config_.chunk_size, config_.max_action_dim});
  auto ids = at::tensor(batch.sample_indices, at::kLong);
  const at::Tensor labels = prefix_lm() ? prompt_labels(batch) : at::Tensor();
  StageOutput out;
  std::optional<at::NoGradGuard> no_grad;
  if (pass == Pass::eval) no_grad.emplace();
  auto [flow, lm] = train_losses(in, actions, noise, sample_time(ids), labels);
  auto l = flow.narrow(2, 0, config_.action_dim);
  if (pass == Pass::eval) {
    out.metrics[kLoss] = Metric{l.sum().item<double>(), static_cast<double>(l.numel())};
    if (lm.defined())
      out.metrics[kPrefixLmLoss] = Metric{lm.sum().item<double>(), static_cast<double>(labels.ge(0).sum().item<int64_t>())};
    return out;
  }
  out.losses.push_back({kLoss, l.sum()});
  if (lm.defined()) out.losses.push_back({kPrefixLmLoss, lm.sum() * config_.prefix_lm_loss_weight});
  return out;
}


double Pi05::flops_per_sample(int64_t) const {
  // 6 x parameters x tokens for the matmuls of each stream (prefix through the vision tower and
  // the LM, the suffix through the expert), attention ignored (short sequences). The cameras and
  // prompt length of the last batch trained on (a LeRobot dataset's cameras, the tokenizer's
  // max length); before any, the mock data's.
  const double cams = static_cast<double>(seen_cameras_ > 0 ? seen_cameras_ : config_.mock_cameras);
  const double img_tokens = cams * static_cast<double>(vision_.tokens_per_image());
  const double prefix = img_tokens + static_cast<double>(seen_prompt_ > 0 ? seen_prompt_ : config_.mock_tokens);
  return 6.0 * (static_cast<double>(vision_.num_parameters()) * img_tokens +
                static_cast<double>(vlm_.num_parameters(false)) * prefix +
                static_cast<double>(expert_.num_parameters(true)) * static_cast<double>(config_.chunk_size));
}

std::vector<Pi05Record> pi05_parameter_records(const SiglipConfig& vision, const PiGemmaConfig& vlm,
                                               const PiGemmaConfig& expert, const Pi05Config& config, int tp) {
  auto b = ParamBuilder::records_only();
  declare(b, tp, vision, vlm, expert, config);
  std::vector<Pi05Record> out;
  for (const auto& p : b.params()) out.push_back({p.name, p.tensor.sizes().vec(), p.sharding, p.state});
  return out;
}

}  // namespace lf::models

#include "loongforge/models/encoders/intern_vit.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <tuple>

#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/models/blocks/param_builder.h"
#include "loongforge/models/registry.h"

namespace lf::models {
namespace {

constexpr double kProjectorNormEps = 1e-5;  // nn.LayerNorm's default in InternVLMultiModalProjector
constexpr double kQkNormEps = 1e-6;         // InternVLVisionRMSNorm's default

void check_config(const InternVisionConfig& c, const std::string& name) {
  LF_CHECK(c.hidden_size % c.num_attention_heads == 0, "intern_vit ", name, ": hidden_size ", c.hidden_size,
           " is not a multiple of num_attention_heads ", c.num_attention_heads);
  LF_CHECK(c.image_size % c.patch_size == 0, "intern_vit ", name, ": image_size ", c.image_size,
           " is not a multiple of patch_size ", c.patch_size);
  const int64_t m = c.merge();
  LF_CHECK(m >= 1 && c.grid() % m == 0, "intern_vit ", name, ": downsample_ratio ", c.downsample_ratio,
           " must be 1 / k for a k dividing the ", c.grid(), " patches of a tile side");
  LF_CHECK(c.vision_feature_layer >= -(c.num_hidden_layers + 1) && c.vision_feature_layer <= c.num_hidden_layers,
           "intern_vit ", name, ": vision_feature_layer ", c.vision_feature_layer, " is outside the ",
           c.num_hidden_layers + 1, " hidden states (the embeddings and ", c.num_hidden_layers, " layers)");
  LF_CHECK(c.out_hidden_size > 0, "intern_vit ", name, ": out_hidden_size must be resolved (> 0)");
}

}  // namespace

int64_t InternVisionConfig::merge() const {
  const double inverse = 1.0 / downsample_ratio;
  const auto m = static_cast<int64_t>(std::llround(inverse));
  return std::abs(inverse - static_cast<double>(m)) < 1e-9 ? m : 0;
}

int64_t InternVisionConfig::num_parameters() const {
  const int64_t h = hidden_size, f = intermediate_size, s = shuffled_size(), o = out_hidden_size;
  const int64_t norm = norm_type == "layer_norm" ? 2 * h : h;
  const int64_t block = 2 * norm + 3 * h * h + (attention_bias ? 3 * h : 0) + (use_qk_norm ? 2 * h : 0) + h * h + h +
                        2 * h + (f * h + f) + (h * f + h);
  return (h * patch_dim() + h) + h + (use_absolute_position_embeddings ? (grid() * grid() + 1) * h : 0) +
         num_hidden_layers * block + (use_mean_pooling ? 0 : 2 * h) + 2 * s + (s * o + o) + (o * o + o);
}

InternVisionEncoder::InternVisionEncoder(const InternVisionConfig& c, const lf::backend::DeviceBackend& backend,
                                         ParamBuilder& b, const std::string& name)
    : c_(c), name_(name), backend_(&backend) {
  check_config(c, name);
  const size_t first = b.params().size();
  const int64_t h = c.hidden_size, f = c.intermediate_size, s = c.shuffled_size(), o = c.out_hidden_size;
  const double std = c.initializer_range;
  const NormSpec norm{c.norm_type == "layer_norm", c.layer_norm_eps};
  patch_embed_ = b.add(name + ".patch_embed.weight", b.normal({h, c.patch_dim()}, std), Sharding::replicated(), false);
  patch_bias_ = b.add(name + ".patch_embed.bias", at::zeros({h}), Sharding::replicated(), true);
  cls_ = b.add(name + ".cls_token", b.normal({h}, std), Sharding::replicated(), true);
  if (c.use_absolute_position_embeddings)
    pos_embed_ = b.add(name + ".pos_embed.weight", b.normal({c.grid() * c.grid() + 1, h}, std), Sharding::replicated(),
                       true);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = name + ".blocks." + std::to_string(i);
    Block blk;
    blk.norm1 = Norm(b, p + ".norm1", h, norm);
    for (auto [w, bias, which] : {std::tuple{&blk.q, &blk.q_bias, "q"}, std::tuple{&blk.k, &blk.k_bias, "k"},
                                  std::tuple{&blk.v, &blk.v_bias, "v"}}) {
      *w = b.add(p + ".attention.linear_" + which + ".weight", b.normal({h, h}, std), Sharding::replicated(), false);
      if (c.attention_bias)
        *bias = b.add(p + ".attention.linear_" + which + ".bias", at::zeros({h}), Sharding::replicated(), true);
    }
    if (c.use_qk_norm) {
      blk.q_norm = Norm(b, p + ".attention.q_norm", h, NormSpec{false, kQkNormEps});
      blk.k_norm = Norm(b, p + ".attention.k_norm", h, NormSpec{false, kQkNormEps});
    }
    blk.proj = b.add(p + ".attention.linear_proj.weight", b.normal({h, h}, std), Sharding::replicated(), false);
    blk.proj_bias = b.add(p + ".attention.linear_proj.bias", at::zeros({h}), Sharding::replicated(), true);
    blk.ls1 = b.add(p + ".ls1", at::full({h}, c.layer_scale_init_value), Sharding::replicated(), true);
    blk.ls2 = b.add(p + ".ls2", at::full({h}, c.layer_scale_init_value), Sharding::replicated(), true);
    blk.norm2 = Norm(b, p + ".norm2", h, norm);
    blk.fc1 = b.add(p + ".mlp.linear_fc1.weight", b.normal({f, h}, std), Sharding::replicated(), false);
    blk.fc1_bias = b.add(p + ".mlp.linear_fc1.bias", at::zeros({f}), Sharding::replicated(), true);
    blk.fc2 = b.add(p + ".mlp.linear_fc2.weight", b.normal({h, f}, std), Sharding::replicated(), false);
    blk.fc2_bias = b.add(p + ".mlp.linear_fc2.bias", at::zeros({h}), Sharding::replicated(), true);
    blocks_.push_back(std::move(blk));
  }
  if (!c.use_mean_pooling) final_norm_ = Norm(b, name + ".final_norm", h, NormSpec{true, c.layer_norm_eps});
  projector_norm_ = Norm(b, name + ".projector.norm", s, NormSpec{true, kProjectorNormEps});
  fc1_ = b.add(name + ".projector.linear_fc1.weight", b.normal({o, s}, std), Sharding::replicated(), false);
  fc1_bias_ = b.add(name + ".projector.linear_fc1.bias", at::zeros({o}), Sharding::replicated(), true);
  fc2_ = b.add(name + ".projector.linear_fc2.weight", b.normal({o, o}, std), Sharding::replicated(), false);
  fc2_bias_ = b.add(name + ".projector.linear_fc2.bias", at::zeros({o}), Sharding::replicated(), true);
  params_.assign(b.params().begin() + static_cast<std::ptrdiff_t>(first), b.params().end());
}

// x [tiles, 1 + g^2, hidden]: pre-norm attention and MLP, each scaled by its layer scale.
at::Tensor InternVisionEncoder::block(const Block& blk, const at::Tensor& x) const {
  const auto& be = *backend_;
  const int64_t tiles = x.size(0), s = x.size(1), heads = c_.num_attention_heads, d = c_.head_dim();
  const at::Tensor y = blk.norm1(be, x);
  at::Tensor q = at::linear(y, blk.q, blk.q_bias), k = at::linear(y, blk.k, blk.k_bias), v = at::linear(y, blk.v, blk.v_bias);
  if (c_.use_qk_norm) q = blk.q_norm(be, q), k = blk.k_norm(be, k);
  auto heads_of = [&](const at::Tensor& t) { return t.view({tiles, s, heads, d}).transpose(1, 2); };  // [tiles, heads, s, d]
  at::Tensor o = lf::ops::sdpa(be, heads_of(q), heads_of(k), heads_of(v), lf::backend::AttentionMask::none());
  o = at::linear(o.transpose(1, 2).reshape({tiles, s, heads * d}), blk.proj, blk.proj_bias);
  at::Tensor h = x + blk.ls1 * o;
  at::Tensor m = lf::ops::gelu(be, at::linear(blk.norm2(be, h), blk.fc1, blk.fc1_bias));
  return h + blk.ls2 * at::linear(m, blk.fc2, blk.fc2_bias);
}

std::pair<at::Tensor, at::Tensor> InternVisionEncoder::rows_of_pixels(const at::Tensor& pixel_values) const {
  const int64_t g = c_.grid(), p = c_.patch_size, ch = c_.num_channels;
  LF_CHECK(pixel_values.dim() == 4 && pixel_values.size(1) == ch && pixel_values.size(2) == c_.image_size &&
               pixel_values.size(3) == c_.image_size,
           "intern_vit ", name_, ": pixel_values must be [tiles, ", ch, ", ", c_.image_size, ", ", c_.image_size,
           "], got ", pixel_values.sizes(), lf::hint("InternVL's processor cuts images into image_size tiles"));
  const int64_t tiles = pixel_values.size(0);
  at::Tensor rows = pixel_values.view({tiles, ch, g, p, g, p}).permute({0, 2, 4, 1, 3, 5}).reshape({tiles * g * g, ch * p * p});
  at::Tensor grid = at::tensor({int64_t{1}, g, g}, at::kLong).repeat({tiles, 1});
  return {rows.contiguous(), grid};
}

at::Tensor InternVisionEncoder::forward(const at::Tensor& rows, const at::Tensor& grid) const {
  const auto& be = *backend_;
  const int64_t g = c_.grid(), m = c_.merge(), h = c_.hidden_size;
  LF_CHECK(rows.dim() == 2 && rows.size(1) == c_.patch_dim(), "intern_vit ", name_, ": pixel rows must be [tiles x ",
           g * g, ", ", c_.patch_dim(), "] (C P P = ", c_.num_channels, " x ", c_.patch_size, " x ", c_.patch_size,
           "), got ", rows.sizes());
  LF_CHECK(grid.dim() == 2 && grid.size(1) == 3, "intern_vit ", name_, ": the grid must be [tiles, 3], got ",
           grid.sizes());
  const at::Tensor gc = grid.to(at::kCPU, at::kLong);
  const int64_t tiles = gc.size(0);
  LF_CHECK(gc.select(1, 0).eq(1).all().item<bool>() && gc.select(1, 1).eq(g).all().item<bool>() &&
               gc.select(1, 2).eq(g).all().item<bool>(),
           "intern_vit ", name_, ": every tile's grid must be (1, ", g, ", ", g, ") (image_size ", c_.image_size,
           " / patch_size ", c_.patch_size, "), got ", gc,
           lf::hint("resize or tile images to image_size x image_size pixels"));
  LF_CHECK(rows.size(0) == tiles * g * g, "intern_vit ", name_, ": ", tiles, " tiles need ", tiles * g * g,
           " pixel rows, got ", rows.size(0));
  at::Tensor x = at::linear(rows.to(patch_embed_.device(), patch_embed_.scalar_type()), patch_embed_, patch_bias_)
                     .view({tiles, g * g, h});
  x = at::cat({cls_.view({1, 1, h}).expand({tiles, 1, h}), x}, 1);  // [tiles, 1 + g^2, h]
  if (pos_embed_.defined()) x = x + pos_embed_.unsqueeze(0);
  // The features: hidden state k (0: the embeddings, k: after layer k), or the last output normed.
  const int64_t layers = c_.num_hidden_layers, f = c_.vision_feature_layer;
  const int64_t run = f == -1 ? layers : f >= 0 ? f : layers + 1 + f;
  x = run_blocks(run, x, recompute_,
                 [this](int64_t i, const at::Tensor& in) { return block(blocks_[static_cast<size_t>(i)], in); });
  if (f == -1 && !c_.use_mean_pooling) x = final_norm_(be, x);
  // transformers' pixel_shuffle on [tiles, g, g, h] (the CLS token dropped), scale 1 / m.
  const int64_t gs = g / m;
  x = x.narrow(1, 1, g * g).reshape({tiles, g, g, h});
  x = x.reshape({tiles, g, gs, h * m}).permute({0, 2, 1, 3}).contiguous();
  x = x.view({tiles, gs, gs, h * m * m}).permute({0, 2, 1, 3}).reshape({tiles * gs * gs, h * m * m});
  x = at::linear(projector_norm_(be, x), fc1_, fc1_bias_);
  return at::linear(lf::ops::gelu(be, x), fc2_, fc2_bias_);
}

std::map<std::string, at::Tensor> intern_vision_from_hf(const InternVisionConfig& c,
                                                        const std::map<std::string, at::Tensor>& tensors,
                                                        const std::string& vp, const std::string& pp) {
  const int64_t h = c.hidden_size, f = c.intermediate_size, s = c.shuffled_size(), o = c.out_hidden_size;
  size_t used = 0;
  auto get = [&](const std::string& name, std::vector<int64_t> shape) {
    auto it = tensors.find(name);
    LF_CHECK(it != tensors.end(), "InternVL vision weights: tensor ", name, " is missing",
             lf::hint("pass every tensor of the checkpoint's vision tower and projector"));
    LF_CHECK(it->second.numel() == c10::multiply_integers(shape),
             "InternVL vision weights: tensor ", name, " is ", it->second.sizes(), ", the config (hidden_size ", h,
             ", intermediate_size ", f, ", image_size ", c.image_size, ", patch_size ", c.patch_size,
             ", out_hidden_size ", o, ") says ", at::IntArrayRef(shape));
    ++used;
    return it->second.detach().reshape(shape);
  };
  std::map<std::string, at::Tensor> out;
  out["patch_embed.weight"] = get(vp + "embeddings.patch_embeddings.projection.weight", {h, c.patch_dim()});
  out["patch_embed.bias"] = get(vp + "embeddings.patch_embeddings.projection.bias", {h});
  out["cls_token"] = get(vp + "embeddings.cls_token", {h});
  if (c.use_absolute_position_embeddings)
    out["pos_embed.weight"] = get(vp + "embeddings.position_embeddings", {c.grid() * c.grid() + 1, h});
  const bool layer_norm = c.norm_type == "layer_norm";
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string hp = vp + "encoder.layer." + std::to_string(i) + ".", p = "blocks." + std::to_string(i) + ".";
    for (const auto& [hf, ours] : {std::pair<std::string, std::string>{"layernorm_before", "norm1"},
                                   {"layernorm_after", "norm2"}}) {
      out[p + ours + ".weight"] = get(hp + hf + ".weight", {h});
      if (layer_norm) out[p + ours + ".bias"] = get(hp + hf + ".bias", {h});
    }
    for (const char* x : {"q", "k", "v"}) {
      out[p + "attention.linear_" + x + ".weight"] = get(hp + "attention." + x + "_proj.weight", {h, h});
      if (c.attention_bias) out[p + "attention.linear_" + x + ".bias"] = get(hp + "attention." + x + "_proj.bias", {h});
    }
    if (c.use_qk_norm) {
      out[p + "attention.q_norm.weight"] = get(hp + "attention.q_norm.weight", {h});
      out[p + "attention.k_norm.weight"] = get(hp + "attention.k_norm.weight", {h});
    }
    out[p + "attention.linear_proj.weight"] = get(hp + "attention.projection_layer.weight", {h, h});
    out[p + "attention.linear_proj.bias"] = get(hp + "attention.projection_layer.bias", {h});
    out[p + "ls1"] = get(hp + "lambda_1", {h});
    out[p + "ls2"] = get(hp + "lambda_2", {h});
    out[p + "mlp.linear_fc1.weight"] = get(hp + "mlp.fc1.weight", {f, h});
    out[p + "mlp.linear_fc1.bias"] = get(hp + "mlp.fc1.bias", {f});
    out[p + "mlp.linear_fc2.weight"] = get(hp + "mlp.fc2.weight", {h, f});
    out[p + "mlp.linear_fc2.bias"] = get(hp + "mlp.fc2.bias", {h});
  }
  if (!c.use_mean_pooling) {
    out["final_norm.weight"] = get(vp + "layernorm.weight", {h});
    out["final_norm.bias"] = get(vp + "layernorm.bias", {h});
  }
  out["projector.norm.weight"] = get(pp + "layer_norm.weight", {s});
  out["projector.norm.bias"] = get(pp + "layer_norm.bias", {s});
  out["projector.linear_fc1.weight"] = get(pp + "linear_1.weight", {o, s});
  out["projector.linear_fc1.bias"] = get(pp + "linear_1.bias", {o});
  out["projector.linear_fc2.weight"] = get(pp + "linear_2.weight", {o, o});
  out["projector.linear_fc2.bias"] = get(pp + "linear_2.bias", {o});
  // Stray tensors under the prefixes: a config that does not describe this checkpoint.
  size_t under = 0;
  std::string stray;
  for (const auto& [k, v] : tensors)
    if (k.rfind(vp, 0) == 0 || k.rfind(pp, 0) == 0) {
      ++under;
      if (stray.empty() && !out.count(k)) stray = k;
    }
  LF_CHECK(under == used, "InternVL vision weights: ", under - used, " tensor(s) under ", vp, " / ", pp,
           " are not used by the configured tower (e.g. ", stray, ")",
           lf::hint("the config (num_hidden_layers, attention_bias, use_qk_norm, norm_type, use_mean_pooling) does not "
                    "match the checkpoint"));
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> intern_vision_tensors(const InternVisionConfig& c) {
  const int64_t h = c.hidden_size, f = c.intermediate_size, s = c.shuffled_size(), o = c.out_hidden_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out{
      {"patch_embed.weight", {h, c.patch_dim()}}, {"patch_embed.bias", {h}}, {"cls_token", {h}}};
  if (c.use_absolute_position_embeddings) out.push_back({"pos_embed.weight", {c.grid() * c.grid() + 1, h}});
  const bool layer_norm = c.norm_type == "layer_norm";
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    auto norm = [&](const std::string& n) {
      out.push_back({p + n + ".weight", {h}});
      if (layer_norm) out.push_back({p + n + ".bias", {h}});
    };
    norm("norm1");
    for (const char* x : {"q", "k", "v"}) {
      out.push_back({p + "attention.linear_" + x + ".weight", {h, h}});
      if (c.attention_bias) out.push_back({p + "attention.linear_" + x + ".bias", {h}});
    }
    if (c.use_qk_norm) {
      out.push_back({p + "attention.q_norm.weight", {h}});
      out.push_back({p + "attention.k_norm.weight", {h}});
    }
    out.push_back({p + "attention.linear_proj.weight", {h, h}});
    out.push_back({p + "attention.linear_proj.bias", {h}});
    out.push_back({p + "ls1", {h}});
    out.push_back({p + "ls2", {h}});
    norm("norm2");
    out.push_back({p + "mlp.linear_fc1.weight", {f, h}});
    out.push_back({p + "mlp.linear_fc1.bias", {f}});
    out.push_back({p + "mlp.linear_fc2.weight", {h, f}});
    out.push_back({p + "mlp.linear_fc2.bias", {h}});
  }
  if (!c.use_mean_pooling) {
    out.push_back({"final_norm.weight", {h}});
    out.push_back({"final_norm.bias", {h}});
  }
  out.push_back({"projector.norm.weight", {s}});
  out.push_back({"projector.norm.bias", {s}});
  out.push_back({"projector.linear_fc1.weight", {o, s}});
  out.push_back({"projector.linear_fc1.bias", {o}});
  out.push_back({"projector.linear_fc2.weight", {o, o}});
  out.push_back({"projector.linear_fc2.bias", {o}});
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> intern_vision_to_hf(const InternVisionConfig& c,
                                                                    const std::map<std::string, at::Tensor>& ours,
                                                                    const std::string& vp, const std::string& pp) {
  // The names as intern_vision_from_hf reads them, and transformers' shapes.
  const int64_t h = c.hidden_size, p = c.patch_size;
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> hf;  // ours -> (HF name, HF shape)
  hf["patch_embed.weight"] = {vp + "embeddings.patch_embeddings.projection.weight", {h, c.num_channels, p, p}};
  hf["patch_embed.bias"] = {vp + "embeddings.patch_embeddings.projection.bias", {h}};
  hf["cls_token"] = {vp + "embeddings.cls_token", {1, 1, h}};
  hf["pos_embed.weight"] = {vp + "embeddings.position_embeddings", {1, c.grid() * c.grid() + 1, h}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string hp = vp + "encoder.layer." + std::to_string(i) + ".", o = "blocks." + std::to_string(i) + ".";
    for (const char* part : {".weight", ".bias"}) {
      hf[o + "norm1" + part] = {hp + "layernorm_before" + part, {h}};
      hf[o + "norm2" + part] = {hp + "layernorm_after" + part, {h}};
      hf[o + "attention.linear_proj" + part] = {hp + "attention.projection_layer" + part, {}};
      hf[o + "mlp.linear_fc1" + part] = {hp + "mlp.fc1" + part, {}};
      hf[o + "mlp.linear_fc2" + part] = {hp + "mlp.fc2" + part, {}};
      for (const char* x : {"q", "k", "v"})
        hf[o + "attention.linear_" + x + part] = {hp + "attention." + x + "_proj" + part, {}};
    }
    hf[o + "attention.q_norm.weight"] = {hp + "attention.q_norm.weight", {}};
    hf[o + "attention.k_norm.weight"] = {hp + "attention.k_norm.weight", {}};
    hf[o + "ls1"] = {hp + "lambda_1", {}};
    hf[o + "ls2"] = {hp + "lambda_2", {}};
  }
  for (const char* part : {".weight", ".bias"}) {
    hf[std::string("final_norm") + part] = {vp + "layernorm" + part, {}};
    hf[std::string("projector.norm") + part] = {pp + "layer_norm" + part, {}};
    hf[std::string("projector.linear_fc1") + part] = {pp + "linear_1" + part, {}};
    hf[std::string("projector.linear_fc2") + part] = {pp + "linear_2" + part, {}};
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, shape] : intern_vision_tensors(c)) {
    const auto& [hf_name, hf_shape] = hf.at(name);
    const at::Tensor t = ours.at(name).detach().cpu();
    out.emplace_back(hf_name, (hf_shape.empty() ? t : t.reshape(hf_shape)).contiguous());
  }
  return out;
}

void InternVisionEncoder::load_hf_state(const std::map<std::string, at::Tensor>& tensors, const std::string& vp,
                                        const std::string& pp) {
  const auto full = intern_vision_from_hf(c_, tensors, vp, pp);
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    const std::string rel = p.name.substr(name_.size() + 1);
    auto it = full.find(rel);
    LF_CHECK(it != full.end(), "intern_vit ", name_, ": no HF tensor maps to parameter ", p.name);
    LF_CHECK(it->second.sizes() == p.tensor.sizes(), "intern_vit ", name_, ": ", p.name, " is ", p.tensor.sizes(),
             ", the HF tensor ", it->second.sizes());
    p.tensor.copy_(it->second);
  }
}

void register_intern_vision(Registry& r) {
  r.add(ComponentType{"intern_vit", "vision_encoder",
                      "InternViT (InternVL): CLS + patch embedding, learned positions, pre-norm blocks with layer "
                      "scale, then the pixel-shuffle MLP projector",
                      schema_loader<InternVisionConfig>()});
}

}  // namespace lf::models

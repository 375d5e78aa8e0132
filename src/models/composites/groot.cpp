#include "loongforge/models/composites/groot.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "loongforge/backend/fp8.h"
#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/media/qwen_vision_input.h"
#include "loongforge/models/blocks/param_builder.h"
#include "policy_streams.h"

namespace lf::models {
namespace {

const std::string kType = "groot";
const std::string kHead = "action_head.";
const std::string kBackbone = "backbone.model.";
// Masked keys of the cross-attention (a finite value: encode() refuses a sample with nothing to
// attend, so no row is fully masked).
constexpr double kMaskValue = -1e30;

// The action head's tensors, declared in one order for the model and for the records.
struct Declared {
  struct Attn {
    at::Tensor q, q_b, k, k_b, v, v_b, o, o_b;
  };
  struct Block {
    at::Tensor ada_w, ada_b, n1_w, n1_b, n3_w, n3_b, ff1, ff1_b, ff2, ff2_b;
    Attn attn;
    bool cross = false;
  };
  struct PerEmbodiment {
    at::Tensor w, b;
  };
  at::Tensor t1_w, t1_b, t2_w, t2_b, out1_w, out1_b, out2_w, out2_b, vlln_w, vlln_b, pos_emb;
  std::vector<Block> dit, vl;
  PerEmbodiment state1, state2, act1, act2, act3, dec1, dec2;
};

Declared declare(ParamBuilder& b, const GrootConfig& c, int64_t width) {
  using lf::parallel::Sharding;
  constexpr double kStd = 0.02;
  auto fill = [&](std::vector<int64_t> s, double v) {
    return b.meta() ? at::empty(s, at::TensorOptions().dtype(at::kFloat).device(c10::kMeta)) : at::full(s, v);
  };
  auto rep = Sharding::replicated();
  auto weight = [&](const std::string& n, std::vector<int64_t> s) { return b.add(kHead + n, b.normal(s, kStd), rep, false); };
  auto bias = [&](const std::string& n, int64_t s) { return b.add(kHead + n, fill({s}, 0.0), rep, true); };
  auto norm_w = [&](const std::string& n, int64_t s) { return b.add(kHead + n, fill({s}, 1.0), rep, true); };
  auto attn = [&](const std::string& p, int64_t dim, int64_t kv_in) {
    Declared::Attn a;
    a.q = weight(p + "to_q.weight", {dim, dim});
    a.q_b = bias(p + "to_q.bias", dim);
    a.k = weight(p + "to_k.weight", {dim, kv_in});
    a.k_b = bias(p + "to_k.bias", dim);
    a.v = weight(p + "to_v.weight", {dim, kv_in});
    a.v_b = bias(p + "to_v.bias", dim);
    a.o = weight(p + "to_out.0.weight", {dim, dim});
    a.o_b = bias(p + "to_out.0.bias", dim);
    return a;
  };
  auto ff = [&](Declared::Block& blk, const std::string& p, int64_t dim) {
    blk.ff1 = weight(p + "ff.net.0.proj.weight", {4 * dim, dim});
    blk.ff1_b = bias(p + "ff.net.0.proj.bias", 4 * dim);
    blk.ff2 = weight(p + "ff.net.2.weight", {dim, 4 * dim});
    blk.ff2_b = bias(p + "ff.net.2.bias", dim);
  };
  auto per_embodiment = [&](const std::string& p, int64_t in, int64_t out) {
    return Declared::PerEmbodiment{b.add(kHead + p + ".W", b.normal({c.max_num_embodiments, in, out}, kStd), rep, false),
                                   b.add(kHead + p + ".b", fill({c.max_num_embodiments, out}, 0.0), rep, true)};
  };
  Declared d;
  const int64_t dim = c.dit_dim();
  d.t1_w = weight("model.timestep_encoder.timestep_embedder.linear_1.weight", {dim, 256});
  d.t1_b = bias("model.timestep_encoder.timestep_embedder.linear_1.bias", dim);
  d.t2_w = weight("model.timestep_encoder.timestep_embedder.linear_2.weight", {dim, dim});
  d.t2_b = bias("model.timestep_encoder.timestep_embedder.linear_2.bias", dim);
  for (int64_t i = 0; i < c.dit_num_layers; ++i) {
    const std::string p = "model.transformer_blocks." + std::to_string(i) + ".";
    Declared::Block blk;
    blk.cross = !(c.dit_interleave_self_attention && i % 2 == 1);
    blk.ada_w = weight(p + "norm1.linear.weight", {2 * dim, dim});
    blk.ada_b = bias(p + "norm1.linear.bias", 2 * dim);
    blk.attn = attn(p + "attn1.", dim, blk.cross ? width : dim);
    ff(blk, p, dim);
    d.dit.push_back(blk);
  }
  d.out1_w = weight("model.proj_out_1.weight", {2 * dim, dim});
  d.out1_b = bias("model.proj_out_1.bias", 2 * dim);
  d.out2_w = weight("model.proj_out_2.weight", {c.dit_output_dim, dim});
  d.out2_b = bias("model.proj_out_2.bias", c.dit_output_dim);
  d.state1 = per_embodiment("state_encoder.layer1", c.max_state_dim * c.state_history_length, c.hidden_size);
  d.state2 = per_embodiment("state_encoder.layer2", c.hidden_size, c.input_embedding_dim);
  d.act1 = per_embodiment("action_encoder.W1", c.max_action_dim, c.input_embedding_dim);
  d.act2 = per_embodiment("action_encoder.W2", 2 * c.input_embedding_dim, c.input_embedding_dim);
  d.act3 = per_embodiment("action_encoder.W3", c.input_embedding_dim, c.input_embedding_dim);
  d.dec1 = per_embodiment("action_decoder.layer1", c.hidden_size, c.hidden_size);
  d.dec2 = per_embodiment("action_decoder.layer2", c.hidden_size, c.max_action_dim);
  if (c.use_vlln) {
    d.vlln_w = norm_w("vlln.weight", width);
    d.vlln_b = bias("vlln.bias", width);
  }
  for (int64_t i = 0; i < c.vl_num_layers; ++i) {
    const std::string p = "vl_self_attention.transformer_blocks." + std::to_string(i) + ".";
    const int64_t vd = c.vl_dim();
    Declared::Block blk;
    blk.n1_w = norm_w(p + "norm1.weight", vd);
    blk.n1_b = bias(p + "norm1.bias", vd);
    blk.attn = attn(p + "attn1.", vd, vd);
    blk.n3_w = norm_w(p + "norm3.weight", vd);
    blk.n3_b = bias(p + "norm3.bias", vd);
    ff(blk, p, vd);
    d.vl.push_back(blk);
  }
  if (c.add_pos_embed) d.pos_emb = weight("position_embedding.weight", {c.max_seq_len, c.input_embedding_dim});
  return d;
}

bool is_backbone_state(const std::string& name) {
  return name.starts_with("decoder.final_layernorm") || name.starts_with("output_layer");
}

}  // namespace

void GrootConfig::validate(int64_t width, int64_t backbone_layers, const std::string& prefix,
                           lf::config::ErrorList& errors) const {
  auto err = [&](const std::string& key, const std::string& what, const std::string& fix) {
    errors.add(prefix + key, {}, what, fix);
  };
  if (dit_dim() != input_embedding_dim)
    err("input_embedding_dim",
        "the DiT runs on the state/action tokens: dit_num_attention_heads x dit_attention_head_dim (" +
            std::to_string(dit_dim()) + ") must equal input_embedding_dim (" + std::to_string(input_embedding_dim) + ")",
        "change one of them");
  if (input_embedding_dim % 2 != 0)
    err("input_embedding_dim",
        "input_embedding_dim " + std::to_string(input_embedding_dim) +
            " must be even (the action encoder's sine-cosine time encoding has input_embedding_dim / 2 of each)",
        "use an even width");
  if (dit_output_dim != hidden_size)
    err("dit_output_dim",
        "the action decoder reads the DiT's output: dit_output_dim (" + std::to_string(dit_output_dim) +
            ") must equal hidden_size (" + std::to_string(hidden_size) + ")",
        "change one of them");
  if (vl_num_layers > 0 && vl_dim() != width)
    err("vl_num_attention_heads",
        "the VL self-attention runs on the backbone features: vl_num_attention_heads x vl_attention_head_dim (" +
            std::to_string(vl_dim()) + ") must equal the backbone width (" + std::to_string(width) + ")",
        "change them, or set vl_num_layers: 0");
  if (select_layer > backbone_layers)
    err("select_layer",
        "select_layer " + std::to_string(select_layer) + " exceeds the backbone's " + std::to_string(backbone_layers) +
            " decoder layers",
        "use at most " + std::to_string(backbone_layers));
  if (add_pos_embed && action_horizon > max_seq_len)
    err("max_seq_len", "the position table has " + std::to_string(max_seq_len) + " rows for " +
                           std::to_string(action_horizon) + " action tokens",
        "raise max_seq_len to at least action_horizon");
  if (action_dim > max_action_dim)
    err("action_dim", "action_dim " + std::to_string(action_dim) + " exceeds max_action_dim " +
                          std::to_string(max_action_dim),
        "use at most max_action_dim");
  if (use_alternate_vl_dit && !dit_interleave_self_attention)
    err("use_alternate_vl_dit", "AlternateVLDiT needs dit_interleave_self_attention: true",
        "set dit_interleave_self_attention: true or use_alternate_vl_dit: false");
}

Groot::Groot(const GrootBackbone& backbone, const GrootConfig& config, const lf::backend::DeviceBackend& backend,
             uint64_t seed, at::ScalarType dtype, const lf::dist::ParallelContext* parallel, GrootFreeze freeze)
    : backend_(backend), parallel_(parallel), backbone_config_(backbone), config_(config), seed_(seed) {
  LF_CHECK(!parallel || parallel->tp_size() == 1, "groot runs at tensor-parallel size 1 (this job: ",
           parallel ? parallel->tp_size() : 1, ")", lf::hint("set --tensor-model-parallel-size 1"));
  lf::config::ErrorList errors;
  config.validate(backbone.foundation.hidden_size, backbone.foundation.num_layers, "model.", errors);
  errors.throw_if_any();
  DecoderConfig cut = backbone.foundation;
  cut.num_layers = config.select_layer;
  backbone_ = std::make_unique<Qwen3Vl>(cut, backbone.vision, backbone.ids, backend, component_seed(seed, "backbone"),
                                        dtype, parallel, false, PipelineStage{}, !freeze.foundation, nullptr,
                                        !freeze.vision_encoder);
  for (auto& g : backbone_->parameter_groups())
    for (auto& p : g.params)
      if (is_backbone_state(p.name)) p.tensor.requires_grad_(false);

  ParamBuilder b(at::make_generator<at::CPUGeneratorImpl>(component_seed(seed, "action_head")), dtype,
                 backend.device(), tensor_parallel_of(parallel, false), true);
  auto d = declare(b, config, backbone.foundation.hidden_size);
  t1_w_ = d.t1_w, t1_b_ = d.t1_b, t2_w_ = d.t2_w, t2_b_ = d.t2_b;
  out1_w_ = d.out1_w, out1_b_ = d.out1_b, out2_w_ = d.out2_w, out2_b_ = d.out2_b;
  vlln_w_ = d.vlln_w, vlln_b_ = d.vlln_b, pos_emb_ = d.pos_emb;
  auto blocks = [](const std::vector<Declared::Block>& in) {
    std::vector<Block> out;
    for (const auto& x : in)
      out.push_back({x.ada_w, x.ada_b, x.n1_w, x.n1_b, x.n3_w, x.n3_b,
                     {x.attn.q, x.attn.q_b, x.attn.k, x.attn.k_b, x.attn.v, x.attn.v_b, x.attn.o, x.attn.o_b}, x.ff1,
                     x.ff1_b, x.ff2, x.ff2_b, x.cross});
    return out;
  };
  dit_blocks_ = blocks(d.dit);
  vl_blocks_ = blocks(d.vl);
  auto pe = [](const Declared::PerEmbodiment& x) { return PerEmbodiment{x.w, x.b}; };
  state1_ = pe(d.state1), state2_ = pe(d.state2), act1_ = pe(d.act1), act2_ = pe(d.act2), act3_ = pe(d.act3);
  dec1_ = pe(d.dec1), dec2_ = pe(d.dec2);
  for (auto& p : b.take()) {
    head_named_.emplace_back(p.name, p.tensor);
    head_params_.push_back(std::move(p));
  }
}

Groot::~Groot() = default;

const std::string& Groot::type() const { return kType; }

std::vector<ParameterGroup> Groot::parameter_groups() const {
  std::vector<ParameterGroup> out;
  ParameterGroup state{"model_state", {}, parallel_, false};
  for (auto g : backbone_->parameter_groups()) {
    if (!g.context) g.context = parallel_;  // the tower runs on the job's layout (TP 1)
    if (g.name == "model") {
      g.name = "foundation";
      std::vector<Parameter> kept;
      for (auto& p : g.params) (is_backbone_state(p.name) ? state.params : kept).push_back(p);
      g.params = std::move(kept);
    } else if (g.name == "model_state") {
      for (auto& p : g.params) state.params.push_back(p);
      continue;
    }
    out.push_back(std::move(g));
  }
  out.push_back(ParameterGroup{"action_head", head_params_, parallel_, true});
  if (!state.params.empty()) out.push_back(std::move(state));
  return out;
}

std::vector<std::string> Groot::batch_fields() const {
  return {"input_ids", "pixel_values", "image_grid_thw", "state", "actions", "action_mask", "embodiment_id"};
}

std::map<std::string, double> Groot::loss_counts(const Batch& batch) const {
  return {{kLoss, action_mask_of(batch).to(at::kDouble).sum().item<double>()}};
}

at::Tensor Groot::action_mask_of(const Batch& batch) const {
  if (batch.contains("action_mask")) return batch.at("action_mask");
  LF_CHECK(batch.contains("actions"), "groot: the batch has no field 'actions'");
  auto mask = at::zeros(batch.at("actions").sizes(), at::kFloat);
  mask.narrow(2, 0, config_.action_dim).fill_(1);
  return mask;
}

GrootInputs Groot::vla_inputs(const at::Tensor& images, const at::Tensor& prompt_tokens, const at::Tensor& state) const {
  const auto& c = config_;
  const auto& v = backbone_config_.vision;
  LF_CHECK(images.dim() == 5 && images.size(2) == 3 && images.size(3) == c.image_size && images.size(4) == c.image_size,
           "groot: images must be [b, cameras, 3, ", c.image_size, ", ", c.image_size, "] (model.image_size), got ",
           images.sizes());
  const int64_t b = images.size(0), cams = images.size(1);
  LF_CHECK(prompt_tokens.dim() == 2 && prompt_tokens.size(0) == b, "groot: prompt_tokens must be [b, L] with b = ", b,
           ", got ", prompt_tokens.sizes());
  const auto& ids = backbone_config_.ids;
  auto tokens = prompt_tokens.to(at::kCPU, at::kLong);
  LF_CHECK(tokens.ne(ids.image_token_id).all().item<bool>() && tokens.ne(ids.video_token_id).all().item<bool>(),
           "groot: a prompt token equals model.image_token_id ", ids.image_token_id, " or video_token_id ",
           ids.video_token_id, lf::hint("give the placeholders ids above the prompt vocabulary"));
  lf::media::QwenVisionPreprocess pre;
  pre.patch_size = v.patch_size;
  pre.temporal_patch_size = v.temporal_patch_size;
  pre.merge_size = v.spatial_merge_size;
  pre.image_mean = {0.5, 0.5, 0.5};
  pre.image_std = {0.5, 0.5, 0.5};
  // [-1, 1] back to the uint8 the store holds (x = u / 127.5 - 1 is exact in float32), then the
  // Qwen3-VL processor's rows ((u / 255 - 0.5) / 0.5: the same values).
  auto u8 = ((images.to(at::kCPU, at::kFloat) + 1.0) * 127.5).round().clamp(0, 255).to(at::kByte);
  std::vector<at::Tensor> rows, grids, prompts;
  for (int64_t i = 0; i < b; ++i) {
    std::vector<at::Tensor> sample;
    for (int64_t k = 0; k < cams; ++k) {
      lf::media::Image img;
      img.height = img.width = c.image_size;
      auto hwc = u8[i][k].permute({1, 2, 0}).contiguous();
      img.rgb.assign(hwc.data_ptr<uint8_t>(), hwc.data_ptr<uint8_t>() + hwc.numel());
      auto patches = lf::media::qwen_patches_of_resized({&img}, pre);
      rows.push_back(patches.pixel_values);
      grids.push_back(at::tensor(std::vector<int64_t>(patches.grid.begin(), patches.grid.end()), at::kLong));
      sample.push_back(at::full({lf::media::qwen_placeholder_count(patches.grid, pre.merge_size)}, ids.image_token_id,
                                at::kLong));
    }
    sample.push_back(tokens[i]);
    prompts.push_back(at::cat(sample));
  }
  GrootInputs in;
  in.input_ids = at::stack(prompts);
  in.pixel_values = at::cat(rows);
  in.image_grid_thw = at::stack(grids);
  LF_CHECK(state.dim() == 3 && state.size(0) == b && state.size(1) == c.state_history_length &&
               state.size(2) <= c.max_state_dim,
           "groot: state must be [b, state_history_length, <= max_state_dim] = [", b, ", ", c.state_history_length,
           ", <= ", c.max_state_dim, "], got ", state.sizes());
  in.state = at::zeros({b, c.state_history_length, c.max_state_dim}, at::kFloat);
  in.state.narrow(2, 0, state.size(2)).copy_(state.to(at::kCPU, at::kFloat));
  in.embodiment_id = at::zeros({b}, at::kLong);
  return in;
}

GrootInputs Groot::inputs_of(const Batch& batch) const {
  if (batch.contains("images") && batch.contains("prompt_tokens")) {
    LF_CHECK(batch.contains("state"), "groot: the VLA batch has no field 'state'");
    LF_CHECK(!batch.contains("prompt_ar_mask"), "groot: the prompts carry located answers (prompt_ar_mask), which "
             "only a pi05 policy decodes before acting",
             lf::hint("train groot on a store made without make-demo-reach --located"));
    return vla_inputs(batch.at("images"), batch.at("prompt_tokens"), batch.at("state"));
  }
  for (const auto& f : batch_fields())
    LF_CHECK(batch.contains(f), "groot: the batch has no field '", f,
             "' (it reads input_ids, pixel_values, image_grid_thw, state, actions, action_mask, embodiment_id)");
  GrootInputs in;
  in.input_ids = batch.at("input_ids");
  in.pixel_values = batch.at("pixel_values");
  in.image_grid_thw = batch.at("image_grid_thw");
  in.state = batch.at("state");
  in.embodiment_id = batch.at("embodiment_id");
  return in;
}

// --- the pieces ---------------------------------------------------------------------------------

at::Tensor Groot::drop(const at::Tensor& x, double p) const {
  if (!training_ || p <= 0) return x;
  // A stream keyed by (seed, step, data-parallel rank, call within the step): a resumed run draws
  // what an uninterrupted one does.
  const uint64_t rank = parallel_ ? static_cast<uint64_t>(parallel_->dp_rank()) : 0;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step_) * 1000003ull +
                                                     rank * 7919ull + (dropout_calls_++) * 31ull + 11);
  auto keep = at::empty(x.sizes(), at::kFloat).bernoulli_(1.0 - p, gen).to(x.device(), x.scalar_type());
  return x * keep * (1.0 / (1.0 - p));
}

at::Tensor Groot::linear(const PerEmbodiment& l, const at::Tensor& x, const at::Tensor& ids) const {
  // CategorySpecificLinear: bmm(x, W[id]) + b[id]
  return at::bmm(x, l.w.index_select(0, ids)) + l.b.index_select(0, ids).unsqueeze(1);
}

bool Groot::set_fp8(const lf::ops::Fp8Policy* fp8) {
  std::vector<Block*> blocks;
  for (auto& b : vl_blocks_) blocks.push_back(&b);
  for (auto& b : dit_blocks_) blocks.push_back(&b);
  const auto n = static_cast<int64_t>(blocks.size());
  const std::vector<bool> on = fp8 ? fp8->layers_in_fp8(n, "blocks") : std::vector<bool>(blocks.size(), false);
  fp8_ = fp8;
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i]->fp8 = on[i];
  return fp8 == nullptr || std::find(on.begin(), on.end(), true) != on.end();
}

at::Tensor Groot::block(const Block& blk, const at::Tensor& x, const at::Tensor& context, const at::Tensor& mask,
                        const at::Tensor& temb, int64_t heads, double p, bool final_dropout) const {
  const int64_t b = x.size(0), s = x.size(1), dim = x.size(2), hd = dim / heads;
  // A linear of this block, in FP8 where the policy picks it at x's rows (TP 1: no amax group).
  auto gemm = [&](lf::ops::Fp8Gemm kind, const at::Tensor& in, const at::Tensor& w, const at::Tensor& bias) {
    const auto* f = blk.fp8 && fp8_ != nullptr ? fp8_->choose(kind, in.numel() / in.size(-1)) : nullptr;
    return f ? lf::ops::fp8_linear(in, w, bias, *f, nullptr, nullptr) : at::linear(in, w, bias);
  };
  using lf::ops::Fp8Gemm;
  at::Tensor h;
  if (blk.ada_w.defined()) {  // AdaLayerNorm: LayerNorm without affine, then (1 + scale), shift
    auto mod = at::linear(at::silu(temb), blk.ada_w, blk.ada_b);
    auto scale = mod.narrow(1, 0, dim).unsqueeze(1), shift = mod.narrow(1, dim, dim).unsqueeze(1);
    h = at::layer_norm(x, {dim}, {}, {}, 1e-5) * (1 + scale) + shift;
  } else {
    h = lf::ops::layer_norm(backend_, x, blk.n1_w, blk.n1_b, 1e-5);
  }
  const at::Tensor& kv = context.defined() ? context : h;
  const int64_t t = kv.size(1);
  auto split = [&](const at::Tensor& y, int64_t n) { return y.view({b, n, heads, hd}).transpose(1, 2); };
  auto q = split(gemm(Fp8Gemm::qkv, h, blk.attn.q, blk.attn.q_b), s);
  auto k = split(gemm(Fp8Gemm::qkv, kv, blk.attn.k, blk.attn.k_b), t);
  auto v = split(gemm(Fp8Gemm::qkv, kv, blk.attn.v, blk.attn.v_b), t);
  auto m = mask.defined() ? lf::backend::AttentionMask::additive(mask.expand({b, 1, s, t}))
                          : lf::backend::AttentionMask::none();
  auto o = lf::ops::sdpa(backend_, q, k, v, m).transpose(1, 2).reshape({b, s, dim});
  o = drop(gemm(Fp8Gemm::proj, o, blk.attn.o, blk.attn.o_b), p);  // to_out: linear, dropout
  if (final_dropout) o = drop(o, p);
  auto y = x + o;
  auto n3 = blk.n3_w.defined() ? lf::ops::layer_norm(backend_, y, blk.n3_w, blk.n3_b, 1e-5)
                               : at::layer_norm(y, {dim}, {}, {}, 1e-5);
  auto f = drop(lf::ops::gelu_tanh(backend_, gemm(Fp8Gemm::fc1, n3, blk.ff1, blk.ff1_b)), p);
  f = gemm(Fp8Gemm::fc2, f, blk.ff2, blk.ff2_b);
  if (final_dropout) f = drop(f, p);
  return y + f;
}

Groot::Features Groot::encode(const GrootInputs& in) const {
  const auto dev = backend_.device();
  LF_CHECK(in.input_ids.dim() == 2, "groot: input_ids must be [b, s], got ", in.input_ids.sizes());
  const int64_t b = in.input_ids.size(0);
  if (in.attention_mask.defined())
    LF_CHECK(in.attention_mask.sizes() == in.input_ids.sizes() && in.attention_mask.ne(0).all().item<bool>(),
             "groot: attention_mask must be all ones ([b, s] = ", in.input_ids.sizes(),
             "): padded prompts are not supported",
             lf::hint("give the samples of a batch prompts of one length (docs/vla.md \"The GR00T policy\")"));
  const auto& c = config_;
  LF_CHECK(in.state.dim() == 3 && in.state.size(0) == b && in.state.size(1) == c.state_history_length &&
               in.state.size(2) == c.max_state_dim,
           "groot: state must be [b, state_history_length, max_state_dim] = [", b, ", ", c.state_history_length, ", ",
           c.max_state_dim, "], got ", in.state.sizes());
  LF_CHECK(in.embodiment_id.dim() == 1 && in.embodiment_id.size(0) == b, "groot: embodiment_id must be [b] = [", b,
           "], got ", in.embodiment_id.sizes());
  auto ids = in.embodiment_id.to(dev, at::kLong);
  LF_CHECK(ids.ge(0).all().item<bool>() && ids.lt(c.max_num_embodiments).all().item<bool>(),
           "groot: embodiment_id must lie in [0, max_num_embodiments = ", c.max_num_embodiments, "), got ",
           ids.min().item<int64_t>(), "..", ids.max().item<int64_t>());
  Features f;
  auto tokens = in.input_ids.to(dev, at::kLong);
  auto x = backbone_->hidden_states(tokens, in.pixel_values, in.image_grid_thw);  // [b, s, width]
  f.image_mask = tokens.eq(backbone_config_.ids.image_token_id);
  f.text_mask = f.image_mask.logical_not();
  if (c.use_alternate_vl_dit) {
    const auto images = f.image_mask.sum(1), texts = f.text_mask.sum(1);
    LF_CHECK(images.gt(0).all().item<bool>() && texts.gt(0).all().item<bool>(),
             "groot: every sample needs image and text tokens (AlternateVLDiT cross-attends each in turn); a sample "
             "has ", images.min().item<int64_t>(), " image and ", texts.min().item<int64_t>(), " text tokens");
  }
  if (c.use_vlln) x = lf::ops::layer_norm(backend_, x, vlln_w_, vlln_b_, 1e-5);
  for (const auto& blk : vl_blocks_)
    x = block(blk, x, {}, {}, {}, c.vl_num_attention_heads, c.vl_dropout, c.vl_final_dropout);
  f.embs = x;
  auto state = in.state.to(dev, x.scalar_type()).reshape({b, 1, -1});
  f.state = linear(state2_, at::relu(linear(state1_, state, ids)), ids);
  if (training_ && c.state_dropout_prob > 0) {
    const uint64_t rank = parallel_ ? static_cast<uint64_t>(parallel_->dp_rank()) : 0;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 2654435761ull + static_cast<uint64_t>(step_) * 104729ull +
                                                       rank * 613ull + (dropout_calls_++) * 31ull + 5);
    auto dropped = at::rand({b}, gen, at::kFloat).lt(c.state_dropout_prob).to(dev, f.state.scalar_type());
    f.state = f.state * (1 - dropped).view({b, 1, 1});
  }
  return f;
}

at::Tensor Groot::velocity(const Features& f, const at::Tensor& x_t, const at::Tensor& t, const at::Tensor& ids) const {
  const auto& c = config_;
  const auto dtype = f.embs.scalar_type();
  const int64_t b = x_t.size(0), horizon = x_t.size(1), dim = c.input_embedding_dim;
  // The action encoder: W1(x_t), a sine-cosine encoding of t per action token, swish(W2(.)), W3.
  auto a = linear(act1_, x_t.to(dtype), ids);
  const int64_t half = dim / 2;
  auto step = at::log(at::scalar_tensor(10000.0, at::kFloat)) / static_cast<double>(half);
  auto freqs = t.to(at::kFloat).view({b, 1, 1}).expand({b, horizon, 1}) *
               at::exp(-at::arange(half, at::kFloat) * step).to(t.device());
  auto time = at::cat({at::sin(freqs), at::cos(freqs)}, -1).to(dtype);
  auto h = at::silu(linear(act2_, at::cat({a, time}, -1), ids));
  auto actions = linear(act3_, h, ids);
  if (pos_emb_.defined()) actions = actions + pos_emb_.narrow(0, 0, horizon).unsqueeze(0);
  auto x = at::cat({f.state, actions}, 1);

  // The DiT's time: diffusers' Timesteps(256, flip_sin_to_cos, downscale_freq_shift 1) -> MLP.
  auto exponent = at::arange(128, at::kFloat) * (-std::log(10000.0)) / 127;
  auto arg = t.to(at::kFloat).unsqueeze(1) * at::exp(exponent).to(t.device()).unsqueeze(0);
  auto proj = at::cat({at::cos(arg), at::sin(arg)}, 1).to(dtype);
  auto temb = at::linear(at::silu(at::linear(proj, t1_w_, t1_b_)), t2_w_, t2_b_);

  auto additive = [&](const at::Tensor& keep) {
    return at::zeros(keep.sizes(), at::TensorOptions().dtype(dtype).device(keep.device()))
        .masked_fill(keep.logical_not(), kMaskValue)
        .view({b, 1, 1, -1});
  };
  at::Tensor text, image;
  if (c.use_alternate_vl_dit) text = additive(f.text_mask), image = additive(f.image_mask);
  for (size_t i = 0; i < dit_blocks_.size(); ++i) {
    const auto& blk = dit_blocks_[i];
    at::Tensor mask;
    if (blk.cross && c.use_alternate_vl_dit)
      mask = static_cast<int64_t>(i) % (2 * c.attend_text_every_n_blocks) == 0 ? text : image;
    x = block(blk, x, blk.cross ? f.embs : at::Tensor(), mask, temb, c.dit_num_attention_heads, c.dit_dropout,
              c.dit_final_dropout);
  }
  auto mod = at::linear(at::silu(temb), out1_w_, out1_b_);
  auto shift = mod.narrow(1, 0, dim).unsqueeze(1), scale = mod.narrow(1, dim, dim).unsqueeze(1);
  x = at::layer_norm(x, {dim}, {}, {}, 1e-6) * (1 + scale) + shift;
  auto out = at::linear(x, out2_w_, out2_b_);
  auto pred = linear(dec2_, at::relu(linear(dec1_, out, ids)), ids);
  return pred.narrow(1, pred.size(1) - horizon, horizon).to(at::kFloat);
}

at::Tensor Groot::losses(const GrootInputs& in, const at::Tensor& actions, const at::Tensor& action_mask,
                         const at::Tensor& noise, const at::Tensor& time) const {
  const auto& c = config_;
  const int64_t b = in.input_ids.size(0);
  LF_CHECK(actions.dim() == 3 && actions.size(0) == b && actions.size(1) == c.action_horizon &&
               actions.size(2) == c.max_action_dim,
           "groot: actions must be [b, action_horizon, max_action_dim] = [", b, ", ", c.action_horizon, ", ",
           c.max_action_dim, "], got ", actions.sizes());
  LF_CHECK(noise.sizes() == actions.sizes() && action_mask.sizes() == actions.sizes(), "groot: noise ", noise.sizes(),
           " and action_mask ", action_mask.sizes(), " must have the actions' shape ", actions.sizes());
  LF_CHECK(time.dim() == 1 && time.size(0) == b, "groot: time must be [b] = [", b, "], got ", time.sizes());
  const auto dev = backend_.device();
  auto f = encode(in);
  auto a = actions.to(dev, at::kFloat), eps = noise.to(dev, at::kFloat);
  auto tf = time.to(dev, at::kFloat);
  auto t = tf.view({b, 1, 1});
  auto x_t = (1 - t) * eps + t * a;
  auto target = a - eps;
  auto discrete = (tf * static_cast<double>(c.num_timestep_buckets)).to(at::kLong);
  auto v = velocity(f, x_t, discrete, in.embodiment_id.to(dev, at::kLong));
  return (v - target).square() * action_mask.to(dev, at::kFloat);
}

at::Tensor Groot::sample_actions(const GrootInputs& in, const at::Tensor& noise, int64_t steps) const {
  const auto& c = config_;
  if (steps <= 0) steps = c.num_inference_timesteps;
  const int64_t b = in.input_ids.size(0);
  LF_CHECK(noise.dim() == 3 && noise.size(0) == b && noise.size(1) == c.action_horizon &&
               noise.size(2) == c.max_action_dim,
           "groot: noise must be [b, action_horizon, max_action_dim] = [", b, ", ", c.action_horizon, ", ",
           c.max_action_dim, "], got ", noise.sizes());
  at::NoGradGuard no_grad;
  struct Eval {  // no dropout while sampling; the mode is restored after
    bool& flag;
    bool was;
    ~Eval() { flag = was; }
  } eval{training_, training_};
  training_ = false;
  const auto dev = backend_.device();
  auto f = encode(in);
  auto ids = in.embodiment_id.to(dev, at::kLong);
  auto x = noise.to(dev, at::kFloat);
  const double dt = 1.0 / static_cast<double>(steps);
  for (int64_t s = 0; s < steps; ++s) {
    const auto t = static_cast<int64_t>(static_cast<double>(s) / static_cast<double>(steps) *
                                        static_cast<double>(c.num_timestep_buckets));
    x = x + dt * velocity(f, x, at::full({b}, t, at::TensorOptions().dtype(at::kLong).device(dev)), ids);
  }
  return x;
}

// --- training -----------------------------------------------------------------------------------

at::Tensor Groot::sample_time(const at::Tensor& ids) const {
  // t = (1 - Beta(alpha, beta)) x noise_s per sample, from a stream keyed by (seed, step, sample):
  // the same draw on every layout. Beta from two Gammas.
  std::vector<float> out;
  for (double beta : policy_streams::beta_draws(seed_, step_, ids, config_.noise_beta_alpha, config_.noise_beta_beta))
    out.push_back(static_cast<float>((1.0 - beta) * config_.noise_s));
  return at::tensor(out, at::kFloat);
}

StageOutput Groot::stage_forward(const Batch& batch, const TensorMap&, int64_t, Pass pass) {
  auto in = inputs_of(batch);
  const auto& actions = batch.at("actions");
  const int64_t b = actions.size(0);
  LF_CHECK(static_cast<int64_t>(batch.sample_indices.size()) == b, "groot: the batch has ", b, " samples but ",
           batch.sample_indices.size(), " sample indices");
  const auto noise =
      policy_streams::noise_draws(seed_, step_, batch.sample_indices, {config_.action_horizon, config_.max_action_dim});
  auto time = sample_time(at::tensor(batch.sample_indices, at::kLong));
  const auto mask = action_mask_of(batch);
  StageOutput out;
  if (pass == Pass::eval) {
    at::NoGradGuard g;
    const bool was = training_;
    training_ = false;  // evaluation runs without dropout
    auto l = losses(in, actions, mask, noise, time);
    training_ = was;
    out.metrics[kLoss] = Metric{l.sum().item<double>(), mask.to(at::kDouble).sum().item<double>()};
    return out;
  }
  out.losses.push_back({kLoss, losses(in, actions, mask, noise, time).sum()});
  return out;
}


double Groot::flops_per_sample(int64_t) const {
  // 6 x parameters x tokens: the backbone over its prompt (mock_tokens text + the image's merged
  // patches), the action head over its 1 + horizon tokens; attention ignored (short sequences).
  int64_t backbone = 0, head = 0;
  for (const auto& g : backbone_->parameter_groups())
    for (const auto& p : g.params) backbone += p.tensor.numel();
  for (const auto& p : head_params_) head += p.tensor.numel();
  const auto& v = backbone_config_.vision;
  const int64_t side = config_.image_size / v.patch_size / v.spatial_merge_size;
  const double prompt = static_cast<double>(config_.mock_tokens + side * side);
  return 6.0 * (static_cast<double>(backbone) * prompt +
                static_cast<double>(head) * static_cast<double>(1 + config_.action_horizon));
}

void Groot::load_full(const std::map<std::string, at::Tensor>& full, const std::string& source) {
  std::map<std::string, at::Tensor> backbone;
  std::set<std::string> used;
  for (const auto& [name, t] : full)
    if (name.starts_with(kBackbone)) backbone[name.substr(kBackbone.size())] = t;
  if (!backbone.count("lm_head.weight") && backbone.count("model.language_model.embed_tokens.weight"))
    backbone["lm_head.weight"] = backbone.at("model.language_model.embed_tokens.weight");  // tied, not saved
  try {
    backbone_->load_hf_state(backbone);
  } catch (const lf::Error& e) {
    LF_FAIL(source, ": the backbone (", kBackbone, "*): ", e.what());
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : head_named_) {
    auto it = full.find(name);
    LF_CHECK(it != full.end(), source, ": no tensor ", name, " (the model's config needs it)");
    LF_CHECK(it->second.sizes() == t.sizes(), source, ": ", name, " has shape ", it->second.sizes(), ", the model ",
             t.sizes());
    t.copy_(it->second);
    used.insert(name);
  }
  for (const auto& [name, t] : full)
    LF_CHECK(name.starts_with(kBackbone) || used.count(name), source, ": tensor ", name,
             " is not part of the model its config describes");
}

void Groot::load_checkpoint_tensors(const std::map<std::string, at::Tensor>& full, const std::string& source) {
  at::NoGradGuard no_grad;
  size_t used = 0;
  for (const auto& g : parameter_groups())
    for (const auto& p : g.params) {
      auto it = full.find(p.name);
      LF_CHECK(it != full.end(), source, ": no tensor ", p.name, " (the model's config needs it)");
      LF_CHECK(it->second.sizes() == p.tensor.sizes(), source, ": ", p.name, " has shape ", it->second.sizes(),
               ", the model ", p.tensor.sizes());
      p.tensor.copy_(it->second);
      ++used;
    }
  LF_CHECK(used == full.size(), source, ": ", full.size() - used, " tensors are not part of the model its config "
           "describes");
}

std::vector<GrootRecord> groot_head_records(const GrootConfig& config, int64_t width) {
  auto b = ParamBuilder::records_only();
  declare(b, config, width);
  std::vector<GrootRecord> out;
  for (const auto& p : b.params()) out.push_back({p.name, p.tensor.sizes().vec()});
  return out;
}

}  // namespace lf::models

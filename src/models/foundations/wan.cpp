#include "loongforge/models/foundations/wan.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>

#include "loongforge/backend/fp8.h"
#include "loongforge/backend/functional.h"
#include "loongforge/core/config/config_error.h"
#include "loongforge/core/error.h"
#include "loongforge/models/recompute.h"
#include "loongforge/parallel/context/context_parallel.h"
#include "loongforge/parallel/tensor/layers.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {

int64_t WanConfig::num_parameters() const {
  const int64_t h = inner_dim(), f = ffn_dim;
  int64_t n = in_channels * patch_volume() * h + h;                  // patch embedding
  n += freq_dim * h + h + h * h + h + h * 6 * h + 6 * h;             // time embedder, time_proj
  n += text_dim * h + h + h * h + h;                                  // text embedder
  if (image_dim > 0) n += 2 * image_dim + image_dim * image_dim + image_dim + image_dim * h + h + 2 * h +
                          pos_embed_seq_len * image_dim;
  int64_t block = 6 * h;                                              // scale_shift_table
  block += 2 * (4 * (h * h + h) + 2 * h);                             // attn1, attn2 (+ norm_q, norm_k)
  if (added_kv_proj_dim > 0) block += 2 * (added_kv_proj_dim * h + h) + h;
  if (cross_attn_norm) block += 2 * h;
  block += h * f + f + f * h + h;                                     // ffn
  return n + num_layers * block + h * out_dim() * patch_volume() + out_dim() * patch_volume() + 2 * h;
}

void WanConfig::validate(const lf::config::Node& tree, const std::string& prefix, lf::config::ErrorList& errors) const {
  auto origin = [&](const char* k) {
    const auto* n = tree.find(k);
    return n ? n->origin() : lf::config::Origin::from_default();
  };
  if (patch_size.size() != 3 || patch_size[0] < 1 || patch_size[1] < 1 || patch_size[2] < 1)
    errors.add(prefix + ".patch_size", origin("patch_size"), "patch_size must be three positive sizes (frames, height, width)",
               "Wan uses [1, 2, 2]");
  if (attention_head_dim % 2 != 0 || rope_t_dim() % 2 != 0 || rope_hw_dim() < 2)
    errors.add(prefix + ".attention_head_dim", origin("attention_head_dim"),
               "the 3D RoPE needs an even attention_head_dim of at least 6 whose frame part (d - 4 (d / 6)) is even, got " +
                   std::to_string(attention_head_dim),
               "Wan uses 128");
  if (freq_dim % 2 != 0)
    errors.add(prefix + ".freq_dim", origin("freq_dim"), "freq_dim must be even (cos and sin halves)");
  if ((image_dim > 0) != (added_kv_proj_dim > 0))
    errors.add(prefix + ".added_kv_proj_dim", origin("added_kv_proj_dim"),
               "image_dim and added_kv_proj_dim go together (I2V): both 0 or both set",
               "Wan 2.1 I2V: image_dim 1280, added_kv_proj_dim = num_attention_heads x attention_head_dim");
  if (added_kv_proj_dim > 0 && added_kv_proj_dim != inner_dim())
    errors.add(prefix + ".added_kv_proj_dim", origin("added_kv_proj_dim"),
               "added_kv_proj_dim " + std::to_string(added_kv_proj_dim) +
                   " must equal num_attention_heads x attention_head_dim " + std::to_string(inner_dim()) +
                   " (the image embedder's output width)");
  if (pos_embed_seq_len > 0 && image_dim == 0)
    errors.add(prefix + ".pos_embed_seq_len", origin("pos_embed_seq_len"), "pos_embed_seq_len needs image_dim (I2V)");
}

at::Tensor wan_timestep_embedding(const at::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  auto opts = at::TensorOptions().dtype(at::kFloat).device(t.device());
  auto exponent = at::arange(half, opts) * (-std::log(10000.0) / static_cast<double>(half));
  auto args = t.to(at::kFloat).reshape({-1, 1}) * at::exp(exponent).unsqueeze(0);
  return at::cat({at::cos(args), at::sin(args)}, 1);
}

namespace {

at::Tensor layer_norm(const at::Tensor& x, double eps, const at::Tensor& w = {}, const at::Tensor& b = {}) {
  return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, w.defined() ? w.to(at::kFloat) : w,
                        b.defined() ? b.to(at::kFloat) : b, eps);
}

// The 3D RoPE tables of a (f, h, w) token grid: cos, sin [f h w, d / 2] fp32, one angle per
// channel pair: the first t_dim / 2 pairs rotate by the frame index, then h_dim / 2 by the row, then
// w_dim / 2 by the column (frequencies theta^(-2j / part) within each part, as diffusers).
std::pair<at::Tensor, at::Tensor> rope_3d(const WanConfig& c, int64_t f, int64_t h, int64_t w, c10::Device device) {
  auto d64 = at::TensorOptions().dtype(at::kDouble);
  auto part = [&](int64_t dim, int64_t n) {  // [n, dim / 2]
    auto inv = at::pow(c.rope_theta, -at::arange(0, dim, 2, d64) / static_cast<double>(dim));
    return at::outer(at::arange(n, d64), inv);
  };
  const int64_t td = c.rope_t_dim(), hd = c.rope_hw_dim();
  auto ft = part(td, f).view({f, 1, 1, td / 2}).expand({f, h, w, td / 2});
  auto fh = part(hd, h).view({1, h, 1, hd / 2}).expand({f, h, w, hd / 2});
  auto fw = part(hd, w).view({1, 1, w, hd / 2}).expand({f, h, w, hd / 2});
  auto angles = at::cat({ft, fh, fw}, 3).reshape({f * h * w, c.attention_head_dim / 2});
  return {at::cos(angles).to(at::kFloat).to(device), at::sin(angles).to(at::kFloat).to(device)};
}

// Interleaved-pair rotation of x [s, b, n, d] by cos/sin [s, d / 2]. fp32: one complex product
// (each pair a complex number times e^{i angle}: one kernel forward and backward).
at::Tensor apply_rope_pairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (x.scalar_type() == at::kFloat) {
    auto xc = at::view_as_complex(x.contiguous().unflatten(-1, {-1, 2}));
    auto rot = at::complex(cos, sin).unsqueeze(1).unsqueeze(1);  // [s, 1, 1, d / 2]
    return at::view_as_real(xc * rot).flatten(-2);
  }
  const auto sizes = x.sizes();
  auto pairs = x.unflatten(-1, {-1, 2});
  auto x1 = pairs.select(-1, 0), x2 = pairs.select(-1, 1);
  auto c = cos.unsqueeze(1).unsqueeze(1), s = sin.unsqueeze(1).unsqueeze(1);
  return at::stack({x1 * c - x2 * s, x1 * s + x2 * c}, -1).reshape(sizes).to(x.scalar_type());
}

}  // namespace

WanDit::Attention WanDit::make_attention(ParamBuilder& b, const std::string& p, bool cross) const {
  const int64_t h = c_.inner_dim();
  const double std = c_.init_method_std;
  Attention a;
  auto col = [&](const std::string& name, int64_t in, at::Tensor& w, at::Tensor& bias) {
    w = b.add(p + "." + name + ".weight", b.normal({h, in}, std), Sharding::along(0), false);
    bias = b.add(p + "." + name + ".bias", at::zeros({h}), Sharding::along(0), true);
  };
  col("to_q", h, a.q, a.q_bias);
  col("to_k", h, a.k, a.k_bias);
  col("to_v", h, a.v, a.v_bias);
  a.out = b.add(p + ".to_out.0.weight", b.normal({h, h}, std), Sharding::along(1), false);
  a.out_bias = b.add(p + ".to_out.0.bias", at::zeros({h}), Sharding::replicated(), true);
  a.norm_q = b.add(p + ".norm_q.weight", at::ones({h}), Sharding::along(0), true);
  a.norm_k = b.add(p + ".norm_k.weight", at::ones({h}), Sharding::along(0), true);
  if (cross && c_.added_kv_proj_dim > 0) {
    col("add_k_proj", c_.added_kv_proj_dim, a.add_k, a.add_k_bias);
    col("add_v_proj", c_.added_kv_proj_dim, a.add_v, a.add_v_bias);
    a.norm_added_k = b.add(p + ".norm_added_k.weight", at::ones({h}), Sharding::along(0), true);
  }
  return a;
}

WanDit::WanDit(const WanConfig& c, const lf::backend::DeviceBackend& backend, ParamBuilder& b, uint64_t seed,
               int tp_rank)
    : c_(c), backend_(backend), tp_(b.tp()), rng_(seed, tp_rank, 0) {
  const int64_t tp = tp_.size(), h = c.inner_dim();
  LF_CHECK(c.num_attention_heads % tp == 0 && c.ffn_dim % tp == 0, "wan: num_attention_heads ", c.num_attention_heads,
           " and ffn_dim ", c.ffn_dim, " must be divisible by the tensor-parallel size ", tp);
  const double std = c.init_method_std;
  auto rep = [&](const std::string& name, std::vector<int64_t> shape, at::Tensor& w, at::Tensor& bias) {
    w = b.add(name + ".weight", b.normal(shape, std), Sharding::replicated(), false);
    bias = b.add(name + ".bias", at::zeros({shape[0]}), Sharding::replicated(), true);
  };
  const auto& ps = c.patch_size;
  patch_w_ = b.add("patch_embedding.weight", b.normal({h, c.in_channels, ps[0], ps[1], ps[2]}, std),
                   Sharding::replicated(), false);
  patch_b_ = b.add("patch_embedding.bias", at::zeros({h}), Sharding::replicated(), true);
  rep("condition_embedder.time_embedder.linear_1", {h, c.freq_dim}, time1_, time1_b_);
  rep("condition_embedder.time_embedder.linear_2", {h, h}, time2_, time2_b_);
  rep("condition_embedder.time_proj", {6 * h, h}, time_proj_, time_proj_b_);
  rep("condition_embedder.text_embedder.linear_1", {h, c.text_dim}, text1_, text1_b_);
  rep("condition_embedder.text_embedder.linear_2", {h, h}, text2_, text2_b_);
  if (c.image_dim > 0) {
    const int64_t di = c.image_dim;
    const std::string p = "condition_embedder.image_embedder";
    img_norm1_w_ = b.add(p + ".norm1.weight", at::ones({di}), Sharding::replicated(), true);
    img_norm1_b_ = b.add(p + ".norm1.bias", at::zeros({di}), Sharding::replicated(), true);
    rep(p + ".ff.net.0.proj", {di, di}, img_ff1_, img_ff1_b_);
    rep(p + ".ff.net.2", {h, di}, img_ff2_, img_ff2_b_);
    img_norm2_w_ = b.add(p + ".norm2.weight", at::ones({h}), Sharding::replicated(), true);
    img_norm2_b_ = b.add(p + ".norm2.bias", at::zeros({h}), Sharding::replicated(), true);
    if (c.pos_embed_seq_len > 0)
      img_pos_ = b.add(p + ".pos_embed", at::zeros({1, c.pos_embed_seq_len, di}), Sharding::replicated(), true);
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "blocks." + std::to_string(i);
    Block blk;
    blk.self = make_attention(b, p + ".attn1", false);
    blk.cross = make_attention(b, p + ".attn2", true);
    if (c.cross_attn_norm) {
      blk.norm2_w = b.add(p + ".norm2.weight", at::ones({h}), Sharding::replicated(), true);
      blk.norm2_b = b.add(p + ".norm2.bias", at::zeros({h}), Sharding::replicated(), true);
    }
    blk.ffn_in = b.add(p + ".ffn.net.0.proj.weight", b.normal({c.ffn_dim, h}, std), Sharding::along(0), false);
    blk.ffn_in_bias = b.add(p + ".ffn.net.0.proj.bias", at::zeros({c.ffn_dim}), Sharding::along(0), true);
    blk.ffn_out = b.add(p + ".ffn.net.2.weight", b.normal({h, c.ffn_dim}, std), Sharding::along(1), false);
    blk.ffn_out_bias = b.add(p + ".ffn.net.2.bias", at::zeros({h}), Sharding::replicated(), true);
    blk.table = b.add(p + ".scale_shift_table", b.normal({1, 6, h}, 1.0 / std::sqrt(static_cast<double>(h))),
                      Sharding::replicated(), true);
    blocks_.push_back(std::move(blk));
  }
  // The zero-initialised head (Wan's init): the first steps train it alone.
  proj_out_ = b.add("proj_out.weight", at::zeros({c.out_dim() * c.patch_volume(), h}), Sharding::replicated(), false);
  proj_out_b_ = b.add("proj_out.bias", at::zeros({c.out_dim() * c.patch_volume()}), Sharding::replicated(), true);
  table_out_ = b.add("scale_shift_table", b.normal({1, 2, h}, 1.0 / std::sqrt(static_cast<double>(h))),
                     Sharding::replicated(), true);
}

bool WanDit::set_fp8(const lf::ops::Fp8Policy* fp8) {
  const auto n = static_cast<int64_t>(blocks_.size());
  const std::vector<bool> on = fp8 ? fp8->layers_in_fp8(n, "blocks") : std::vector<bool>(blocks_.size(), false);
  fp8_ = fp8;
  for (size_t i = 0; i < blocks_.size(); ++i) blocks_[i].fp8 = on[i];
  return fp8 == nullptr || std::find(on.begin(), on.end(), true) != on.end();
}

namespace {
// The recipe the policy picks for one GEMM kind at this rank's rows (null: training dtype).
const lf::ops::Fp8Recipe* pick(const lf::ops::Fp8Policy* fp8, lf::ops::Fp8Gemm kind, int64_t rows) {
  return fp8 ? fp8->choose(kind, rows) : nullptr;
}
}  // namespace

at::Tensor WanDit::linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
  return lf::ops::linear(x, w, b, slots_);
}

at::Tensor WanDit::head_rms_norm(const at::Tensor& x, const at::Tensor& w) const {
  // torch.nn.RMSNorm over the full width in x's dtype; the width's squares summed over the TP ranks'
  // heads (forward all-reduce; backward all-reduce too, each rank's heads using the same sum).
  if (tp_.size() == 1) return lf::ops::rms_norm(backend_, x, w, c_.eps);  // the backend's fused kernels
  at::Tensor ss = (x * x).sum(-1, /*keepdim=*/true);
  if (tp_.size() > 1) ss = lf::parallel::reduce_from_tp(lf::parallel::copy_to_tp(ss, *tp_.tp), *tp_.tp);
  return x * at::rsqrt(ss / static_cast<double>(c_.inner_dim()) + c_.eps) * w;
}

at::Tensor WanDit::self_attention(const Attention& a, const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin, const lf::ops::Fp8Policy* fp8) const {
  using lf::parallel::column_parallel_linear;
  const int64_t b = x.size(1), n = c_.num_attention_heads / tp_.size(), d = c_.attention_head_dim;
  const int64_t rows = x.size(0) * b * (tp_.sequence_parallel ? tp_.size() : 1);  // this rank's GEMM rows
  const auto* fqkv = pick(fp8, lf::ops::Fp8Gemm::qkv, rows);
  auto q = head_rms_norm(column_parallel_linear(x, a.q, a.q_bias, tp_, false, slots_, fqkv), a.norm_q);
  const int64_t s = q.size(0);  // the whole (CP-local) sequence, gathered under SP
  q = q.view({s, b, n, d});
  auto k = head_rms_norm(column_parallel_linear(x, a.k, a.k_bias, tp_, false, slots_, fqkv), a.norm_k)
               .view({s, b, n, d});
  auto v = column_parallel_linear(x, a.v, a.v_bias, tp_, false, slots_, fqkv).view({s, b, n, d});
  q = apply_rope_pairs(q, cos, sin);
  k = apply_rope_pairs(k, cos, sin);
  auto perm = [](const at::Tensor& t) { return t.permute({1, 2, 0, 3}); };  // [b, n, s, d]
  at::Tensor o;
  if (cp_.on()) {
    // Ulysses: all-to-all to [heads / CP, every token], bidirectional attention, and back.
    auto whole = [this](const at::Tensor& wq, const at::Tensor& wk, const at::Tensor& wv, const at::Tensor&) {
      return lf::ops::sdpa(backend_, wq, wk, wv, lf::backend::AttentionMask::none());
    };
    o = lf::parallel::context_parallel_attention(backend_, cp_, perm(q), perm(k), perm(v), {},
                                                 1.0 / std::sqrt(static_cast<double>(d)), whole);
  } else {
    o = lf::ops::sdpa(backend_, perm(q), perm(k), perm(v), lf::backend::AttentionMask::none());
  }
  o = o.permute({2, 0, 1, 3}).reshape({s, b, n * d}).contiguous();  // a view when b is 1
  return lf::parallel::row_parallel_linear(o, a.out, a.out_bias, tp_, slots_, pick(fp8, lf::ops::Fp8Gemm::proj, rows));
}

at::Tensor WanDit::cross_attention(const Attention& a, const at::Tensor& x, const at::Tensor& text,
                                   const at::Tensor& image, const lf::ops::Fp8Policy* fp8) const {
  using lf::parallel::column_parallel_linear;
  const int64_t b = x.size(1), n = c_.num_attention_heads / tp_.size(), d = c_.attention_head_dim;
  const int64_t rows = x.size(0) * b * (tp_.sequence_parallel ? tp_.size() : 1);  // this rank's GEMM rows
  auto heads = [&](const at::Tensor& t) { return t.view({t.size(0), b, n, d}).permute({1, 2, 0, 3}); };
  // The context (text, image) is replicated over TP. Without SP its projection enters the TP region
  // (the backward sums its gradient over TP: every rank's embedders get the whole gradient); under
  // SP every replicated tensor's gradient is summed over TP by the trainer, so each rank keeps its
  // heads' part.
  // In FP8 at the context's own rows; under SP the replicated context times this rank's heads is
  // one shard of the full GEMM, so its amax is reduced over TP as column_parallel_linear's is.
  auto context = [&](const at::Tensor& t, const at::Tensor& w, const at::Tensor& bias) {
    const auto* f = pick(fp8, lf::ops::Fp8Gemm::qkv, t.size(0) * t.size(1));
    if (tp_.sequence_parallel && tp_.size() > 1)
      return f ? lf::ops::fp8_linear(t, w, bias, *f, nullptr, tp_.amax_group()) : at::linear(t, w, bias);
    lf::parallel::TensorParallel plain = tp_;
    plain.sequence_parallel = false;
    return column_parallel_linear(t, w, bias, plain, false, slots_, f);
  };
  auto q = head_rms_norm(
      column_parallel_linear(x, a.q, a.q_bias, tp_, false, slots_, pick(fp8, lf::ops::Fp8Gemm::qkv, rows)), a.norm_q);
  const int64_t s = q.size(0);
  q = heads(q);
  auto k = heads(head_rms_norm(context(text, a.k, a.k_bias), a.norm_k));
  auto v = heads(context(text, a.v, a.v_bias));
  auto o = lf::ops::sdpa(backend_, q, k, v, lf::backend::AttentionMask::none());
  if (image.defined()) {
    auto ki = heads(head_rms_norm(context(image, a.add_k, a.add_k_bias), a.norm_added_k));
    auto vi = heads(context(image, a.add_v, a.add_v_bias));
    o = o + lf::ops::sdpa(backend_, q, ki, vi, lf::backend::AttentionMask::none());
  }
  o = o.permute({2, 0, 1, 3}).reshape({s, b, n * d}).contiguous();  // a view when b is 1
  return lf::parallel::row_parallel_linear(o, a.out, a.out_bias, tp_, slots_, pick(fp8, lf::ops::Fp8Gemm::proj, rows));
}

at::Tensor WanDit::block_forward(const Block& blk, const at::Tensor& x, const at::Tensor& mod, const at::Tensor& text,
                                 const at::Tensor& image, const at::Tensor& cos, const at::Tensor& sin) const {
  // mod: [6, 1|s, b, h] fp32 (the shared modulation); the block adds its own table.
  auto m = mod + blk.table.to(at::kFloat).view({6, 1, 1, -1});
  auto shift = m[0], scale = m[1], gate = m[2], c_shift = m[3], c_scale = m[4], c_gate = m[5];
  const auto dt = x.scalar_type();
  // adaLN: shift + norm(x) (1 + scale), and the gated residuals x + branch gate, one kernel each.
  auto n1 = at::addcmul(shift, layer_norm(x, c_.eps), scale + 1).to(dt);
  const lf::ops::Fp8Policy* fp8 = blk.fp8 ? fp8_ : nullptr;
  auto h = at::addcmul(x.to(at::kFloat), self_attention(blk.self, n1, cos, sin, fp8), gate).to(dt);
  auto n2 = c_.cross_attn_norm ? layer_norm(h, c_.eps, blk.norm2_w, blk.norm2_b).to(dt) : h;
  h = h + cross_attention(blk.cross, n2, text, image, fp8);
  auto n3 = at::addcmul(c_shift, layer_norm(h, c_.eps), c_scale + 1).to(dt);
  const int64_t rows = n3.size(0) * n3.size(1) * (tp_.sequence_parallel ? tp_.size() : 1);
  auto f = lf::parallel::column_parallel_linear(n3, blk.ffn_in, blk.ffn_in_bias, tp_, false, slots_,
                                                pick(fp8, lf::ops::Fp8Gemm::fc1, rows));
  f = lf::parallel::row_parallel_linear(lf::ops::gelu_tanh(backend_, f), blk.ffn_out, blk.ffn_out_bias, tp_, slots_,
                                        pick(fp8, lf::ops::Fp8Gemm::fc2, rows));
  return at::addcmul(h.to(at::kFloat), f.to(at::kFloat), c_gate).to(dt);
}

WanTokens WanDit::forward_tokens(const WanInputs& in) const {
  const auto& x0 = in.latents;
  LF_CHECK(x0.dim() == 5 && x0.size(1) == c_.in_channels, "wan: latents must be [b, ", c_.in_channels,
           ", frames, height, width], got ", x0.sizes());
  const auto& ps = c_.patch_size;
  const int64_t b = x0.size(0), f = x0.size(2) / ps[0], hh = x0.size(3) / ps[1], ww = x0.size(4) / ps[2];
  LF_CHECK(x0.size(2) % ps[0] == 0 && x0.size(3) % ps[1] == 0 && x0.size(4) % ps[2] == 0, "wan: latents ", x0.sizes(),
           " do not divide into patches of ", ps[0], "x", ps[1], "x", ps[2]);
  LF_CHECK(std::max({f, hh, ww}) <= c_.rope_max_seq_len, "wan: a latent grid of ", f, "x", hh, "x", ww,
           " patches exceeds rope_max_seq_len ", c_.rope_max_seq_len);
  const int64_t s = f * hh * ww, h = c_.inner_dim();
  LF_CHECK(in.text.dim() == 3 && in.text.size(0) == b && in.text.size(2) == c_.text_dim,
           "wan: text embeddings must be [", b, ", length, ", c_.text_dim, "], got ", in.text.sizes());
  LF_CHECK(in.image.defined() == (c_.image_dim > 0),
           c_.image_dim > 0 ? "wan: this I2V model needs image embeddings" : "wan: image embeddings given to a text-only model");
  const auto dt = patch_w_.scalar_type();
  // Patch embedding (the Conv3d with stride = kernel as one matmul): tokens in (f, h, w) order.
  auto patches = x0.to(dt)
                     .view({b, c_.in_channels, f, ps[0], hh, ps[1], ww, ps[2]})
                     .permute({2, 4, 6, 0, 1, 3, 5, 7})
                     .reshape({s, b, c_.in_channels * c_.patch_volume()});
  at::Tensor x = linear(patches, patch_w_.reshape({h, -1}), patch_b_);  // [s, b, h]

  // Timestep embedding: per sample [b] or per token [b, s].
  const bool per_token = in.timestep.dim() == 2;
  LF_CHECK((in.timestep.dim() == 1 && in.timestep.size(0) == b) || (per_token && in.timestep.size(0) == b &&
                                                                     in.timestep.size(1) == s),
           "wan: timestep must be [", b, "] or [", b, ", ", s, "] (one per patch token), got ", in.timestep.sizes());
  auto t_freq = wan_timestep_embedding(in.timestep.reshape({-1}).to(x.device()), c_.freq_dim).to(time1_.scalar_type());
  auto temb = linear(at::silu(linear(t_freq, time1_, time1_b_)), time2_, time2_b_);  // [n, h]
  auto tproj = linear(at::silu(temb), time_proj_, time_proj_b_).to(at::kFloat);      // [n, 6h]
  at::Tensor mod, final_temb;  // mod [6, 1|s, b, h]; final_temb [1|s, b, h]
  if (per_token) {
    mod = tproj.view({b, s, 6, h}).permute({2, 1, 0, 3});
    final_temb = temb.to(at::kFloat).view({b, s, h}).transpose(0, 1);
  } else {
    mod = tproj.view({b, 6, h}).permute({1, 0, 2}).unsqueeze(1);
    final_temb = temb.to(at::kFloat).unsqueeze(0);
  }
  auto text = linear(lf::ops::gelu_tanh(backend_, linear(in.text.to(dt), text1_, text1_b_)), text2_, text2_b_).transpose(0, 1);
  at::Tensor image;
  if (in.image.defined()) {
    LF_CHECK(in.image.dim() == 3 && in.image.size(0) == (img_pos_.defined() ? 2 * b : b) && in.image.size(2) == c_.image_dim,
             "wan: image embeddings must be [", b, ", tokens, ", c_.image_dim, "], got ", in.image.sizes());
    at::Tensor e = in.image.to(dt);
    if (img_pos_.defined()) {
      // FLF2V: the first and the last frame's features, stacked along the batch, side by side.
      LF_CHECK(e.size(0) == 2 * b && 2 * e.size(1) == c_.pos_embed_seq_len, "wan: an FLF2V model takes [2 x ", b,
               ", ", c_.pos_embed_seq_len / 2, ", ", c_.image_dim, "] image embeddings, got ", e.sizes());
      e = e.reshape({b, 2 * e.size(1), c_.image_dim}) + img_pos_;
    }
    e = layer_norm(e, 1e-5, img_norm1_w_, img_norm1_b_).to(dt);
    e = linear(at::gelu(linear(e, img_ff1_, img_ff1_b_)), img_ff2_, img_ff2_b_);
    image = layer_norm(e, 1e-5, img_norm2_w_, img_norm2_b_).to(dt).transpose(0, 1);
  }
  auto [cos, sin] = rope_3d(c_, f, hh, ww, x.device());
  at::Tensor positions = at::arange(s, at::kLong);
  if (cp_.on()) {
    // This CP rank's tokens; the gradients of the others' are zero here (the trainer sums over CP).
    const int n = cp_.size(), r = cp_.rank();
    LF_CHECK(s % (2 * n) == 0, "wan: ", s, " video tokens do not split into 2 x ", n,
             " context-parallel chunks", lf::hint("choose a latent grid whose patch count divides by 2 x CP"));
    positions = lf::parallel::cp_positions(s, n, r);
    x = lf::parallel::cp_slice(x, 0, n, r);
    if (per_token) {
      mod = lf::parallel::cp_slice(mod, 1, n, r);
      final_temb = lf::parallel::cp_slice(final_temb, 0, n, r);
    }
    const auto idx = positions.to(cos.device());
    cos = cos.index_select(0, idx);
    sin = sin.index_select(0, idx);
  }
  const bool sp = tp_.sequence_parallel && tp_.size() > 1;
  if (sp) {
    // Sequence parallelism: this TP rank's contiguous chunk (narrow: the replicated producers'
    // gradients stay partial per rank and the trainer sums them over TP).
    const int64_t sl = x.size(0), t = tp_.size();
    LF_CHECK(sl % t == 0, "wan: ", sl, " video tokens per rank do not split over ", t,
             " tensor-parallel ranks (sequence parallelism)");
    x = x.narrow(0, tp_.rank() * (sl / t), sl / t);
    if (per_token) {
      mod = mod.narrow(1, tp_.rank() * (sl / t), sl / t);
      final_temb = final_temb.narrow(0, tp_.rank() * (sl / t), sl / t);
    }
  }

  // Recomputation: full, per block (uniform: groups of num_layers blocks; block: the first
  // num_layers blocks).
  const RecomputeOptions r = training_ ? recompute_ : RecomputeOptions{};
  const int64_t nl = static_cast<int64_t>(blocks_.size());
  for (int64_t i = 0; i < nl;) {
    const BlockGroup g = recompute_group(r, i, nl);
    const int64_t group = g.size;
    if (!g.recomputed) {
      x = block_forward(blocks_[i], x, mod, text, image, cos, sin);
    } else {
      const int64_t first = i;
      RecomputeFn fn = [this, first, group, cos, sin](const std::vector<at::Tensor>& v) {
        at::Tensor y = v[0];
        for (int64_t j = first; j < first + group; ++j)
          y = block_forward(blocks_[j], y, v[1], v[2], v.size() > 3 ? v[3] : at::Tensor(), cos, sin);
        return y;
      };
      std::vector<at::Tensor> inputs = {x, mod, text};
      if (image.defined()) inputs.push_back(image);
      x = recompute(fn, inputs, &rng_);
    }
    i += group;
  }

  // Output norm with its modulation, projection, unpatchify.
  auto so = table_out_.to(at::kFloat).view({2, 1, 1, h}) + final_temb.unsqueeze(0);
  auto y = (layer_norm(x, c_.eps) * (1 + so[1]) + so[0]).to(dt);
  y = linear(y, proj_out_, proj_out_b_);  // [s_r, b, pv c]
  // Under SP every TP rank needs all of its CP rank's tokens (the loss is the same on every TP
  // rank): gathered, the backward keeps each rank's own chunk.
  if (sp) y = lf::parallel::gather_from_shares(y, *tp_.tp);
  return {y, positions};
}

at::Tensor WanDit::forward(const WanInputs& in) const {
  LF_CHECK(!cp_.on(), "wan: the whole prediction is computed without context parallelism",
           lf::hint("forward_tokens() gives this rank's tokens"));
  const auto& ps = c_.patch_size;
  const int64_t b = in.latents.size(0), f = in.latents.size(2) / ps[0], hh = in.latents.size(3) / ps[1],
                ww = in.latents.size(4) / ps[2], oc = c_.out_dim();
  at::Tensor y = forward_tokens(in).tokens;
  return y.transpose(0, 1)
      .reshape({b, f, hh, ww, ps[0], ps[1], ps[2], oc})
      .permute({0, 7, 1, 4, 2, 5, 3, 6})
      .reshape({b, oc, f * ps[0], hh * ps[1], ww * ps[2]});
}

at::Tensor WanDit::patchify_like_output(const at::Tensor& x) const {
  const auto& ps = c_.patch_size;
  const int64_t b = x.size(0), c = x.size(1), f = x.size(2) / ps[0], hh = x.size(3) / ps[1], ww = x.size(4) / ps[2];
  return x.view({b, c, f, ps[0], hh, ps[1], ww, ps[2]})
      .permute({2, 4, 6, 0, 3, 5, 7, 1})
      .reshape({f * hh * ww, b, ps[0] * ps[1] * ps[2] * c});
}

void WanDit::set_context_parallel(lf::backend::Communicator* group) {
  cp_ = lf::parallel::ContextParallel{};
  cp_.group = group;
  cp_.comm = lf::parallel::CpCommType::a2a;
}

}  // namespace lf::models

#include "loongforge/models/encoders/qwen2_5_vl_vision.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <set>

#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/models/blocks/attention.h"
#include "loongforge/models/registry.h"

namespace lf::models {
namespace {

constexpr double kNormEps = 1e-6;  // transformers hard-codes the vision RMSNorms' epsilon

struct Grid {
  int64_t t, h, w;
};

// The order of tokens inside the tower and the attention segments over it, from grid_thw alone.
// Token order on input (the processor's): per medium, per frame, per merge unit (row-major over
// the h/m x w/m units), the m x m patches of the unit row-major. Inside the tower the merge units
// are regrouped window by window (transformers' get_window_index).
struct VisionLayout {
  at::Tensor token_order;            // [n] int64: position i of the window order holds input token token_order[i]
  at::Tensor unit_inverse;           // [n / m^2] int64: input unit u is at window-order unit unit_inverse[u]
  at::Tensor pos_h, pos_w;           // [n] int64: each input token's patch row and column in its frame
  std::vector<int64_t> frames;       // full attention: each frame's tokens
  std::vector<int64_t> windows;      // window attention: each (non-empty) window's tokens
};

VisionLayout vision_layout(const std::vector<Grid>& grids, const Qwen25VisionConfig& c) {
  const int64_t m = c.spatial_merge_size, unit = m * m, win = c.window_size / c.spatial_merge_size / c.patch_size;
  int64_t n = 0;
  for (const auto& g : grids) n += g.t * g.h * g.w;
  std::vector<int64_t> order_units, ph, pw;
  order_units.reserve(n / unit);
  ph.reserve(n);
  pw.reserve(n);
  VisionLayout out;
  int64_t base = 0;  // first unit of this medium
  for (const auto& g : grids) {
    const int64_t lh = g.h / m, lw = g.w / m;
    for (int64_t f = 0; f < g.t; ++f) {
      out.frames.push_back(g.h * g.w);
      for (int64_t by = 0; by < lh; ++by)
        for (int64_t bx = 0; bx < lw; ++bx)
          for (int64_t iy = 0; iy < m; ++iy)
            for (int64_t ix = 0; ix < m; ++ix) {
              ph.push_back(by * m + iy);
              pw.push_back(bx * m + ix);
            }
      for (int64_t wy = 0; wy < lh; wy += win)
        for (int64_t wx = 0; wx < lw; wx += win) {
          int64_t count = 0;
          for (int64_t y = wy; y < std::min(wy + win, lh); ++y)
            for (int64_t x = wx; x < std::min(wx + win, lw); ++x, ++count)
              order_units.push_back(base + (f * lh + y) * lw + x);
          if (count > 0) out.windows.push_back(count * unit);
        }
    }
    base += g.t * lh * lw;
  }
  auto units = at::tensor(order_units, at::kLong);  // [n / unit]
  out.unit_inverse = at::argsort(units);
  out.token_order = (units.unsqueeze(1) * unit + at::arange(unit, at::kLong).unsqueeze(0)).reshape({-1});
  out.pos_h = at::tensor(ph, at::kLong);
  out.pos_w = at::tensor(pw, at::kLong);
  return out;
}

// Segment by segment bidirectional attention: q, k, v [1, n, s, d] -> [1, n, s, d]. Each
// segment attends over its own rows only (no [s, s] mask). A run of consecutive segments of one
// length (the windows of an image, the frames of a video, same-sized images) is one batched call
// ([run, n, len, d]: each (segment, head) is its own task, the same math as a call per segment),
// so the autograd graph holds one slice per run, not one per window (whose backward each
// zero-fills and copies a whole [1, n, s, d] gradient).
at::Tensor attend_segments(const lf::backend::DeviceBackend& be, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const std::vector<int64_t>& segments) {
  const int64_t n = q.size(1);
  auto batched = [&](int64_t start, int64_t len, int64_t run) {
    auto cut = [&](const at::Tensor& x) {
      at::Tensor part = run * len == x.size(2) ? x : x.narrow(2, start, run * len);
      if (run == 1) return part;
      return part.reshape({n, run, len, x.size(3)}).transpose(0, 1);  // [run, n, len, d]
    };
    at::Tensor o = lf::ops::sdpa(be, cut(q), cut(k), cut(v), lf::backend::AttentionMask::none());
    return run == 1 ? o : o.transpose(0, 1).reshape({1, n, run * len, o.size(3)});
  };
  std::vector<at::Tensor> parts;
  int64_t start = 0;
  for (size_t i = 0; i < segments.size();) {
    size_t j = i + 1;
    while (j < segments.size() && segments[j] == segments[i]) ++j;
    const int64_t len = segments[i], run = static_cast<int64_t>(j - i);
    parts.push_back(batched(start, len, run));
    start += len * run;
    i = j;
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, 2);
}

void check_config(const Qwen25VisionConfig& c, const std::string& name, int tp) {
  LF_CHECK(c.out_hidden_size > 0, "qwen2_5_vl_vision ", name, ": out_hidden_size is not resolved");
  LF_CHECK(c.hidden_size % c.num_heads == 0, "qwen2_5_vl_vision ", name, ": hidden_size ", c.hidden_size,
           " is not divisible by num_heads ", c.num_heads);
  LF_CHECK(c.head_dim() % 4 == 0, "qwen2_5_vl_vision ", name, ": head_dim ", c.head_dim(),
           " must be a multiple of 4 (the 2D rotary embedding gives a quarter of it to each axis, twice)");
  LF_CHECK(c.window_size / c.spatial_merge_size / c.patch_size >= 1, "qwen2_5_vl_vision ", name, ": window_size ",
           c.window_size, " holds no ", c.spatial_merge_size, "x", c.spatial_merge_size, " unit of ", c.patch_size,
           "-pixel patches", lf::hint("set window_size >= patch_size * spatial_merge_size"));
  for (int64_t i : c.fullatt_block_indexes)
    LF_CHECK(i >= 0 && i < c.depth, "qwen2_5_vl_vision ", name, ": fullatt_block_indexes holds ", i,
             ", outside the ", c.depth, " blocks");
  const int64_t merged = c.hidden_size * c.spatial_merge_size * c.spatial_merge_size;
  LF_CHECK(c.num_heads % tp == 0 && c.intermediate_size % tp == 0 && merged % tp == 0, "qwen2_5_vl_vision ", name,
           ": num_heads ", c.num_heads, ", intermediate_size ", c.intermediate_size, " and the merger width ", merged,
           " must be divisible by its tensor-parallel size ", tp,
           lf::hint("set model." + name + ".tensor_model_parallel_size to a common divisor"));
}

}  // namespace

int64_t Qwen25VisionConfig::num_parameters() const {
  const int64_t h = hidden_size, f = intermediate_size, merged = h * spatial_merge_size * spatial_merge_size;
  const int64_t block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (2 * f * h + 2 * f) + (h * f + h);
  return h * patch_dim() + depth * block + h + (merged * merged + merged) + (out_hidden_size * merged + out_hidden_size);
}

Qwen25VisionEncoder::Qwen25VisionEncoder(const Qwen25VisionConfig& c, const lf::backend::DeviceBackend& backend,
                                         ParamBuilder& b, const std::string& name)
    : c_(c), name_(name), backend_(&backend), tp_(b.tp()) {
  // Images are short sequences replicated over the encoder's TP group: no sequence parallelism.
  tp_.sequence_parallel = false;
  check_config(c, name, tp_.size());
  const size_t first = b.params().size();
  const int64_t h = c.hidden_size, d = c.head_dim(), nh = c.num_heads;
  const double std = c.initializer_range;
  patch_embed_ = b.add(name + ".patch_embed.weight", b.normal({h, c.patch_dim()}, std), Sharding::replicated(), false);
  MlpConfig mc;
  mc.hidden_size = h;
  mc.ffn_hidden_size = c.intermediate_size;
  mc.swiglu = true;
  mc.bias = true;
  mc.init_std = mc.out_std = std;
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string p = name + ".blocks." + std::to_string(i);
    Block blk;
    blk.norm1 = Norm(b, p + ".norm1", h, NormSpec{false, kNormEps});
    blk.qkv = b.add(p + ".attention.linear_qkv.weight", b.normal({3 * nh * d, h}, std), Sharding::along(0), false);
    blk.qkv_bias = b.add(p + ".attention.linear_qkv.bias", at::zeros({3 * nh * d}), Sharding::along(0), true);
    blk.proj = b.add(p + ".attention.linear_proj.weight", b.normal({h, nh * d}, std), Sharding::along(1), false);
    blk.proj_bias = b.add(p + ".attention.linear_proj.bias", at::zeros({h}), Sharding::replicated(), true);
    blk.norm2 = Norm(b, p + ".norm2", h, NormSpec{false, kNormEps});
    blk.mlp = Mlp(b, p + ".mlp", mc);
    blocks_.push_back(std::move(blk));
  }
  ln_q_ = Norm(b, name + ".merger.ln_q", h, NormSpec{false, kNormEps});
  const int64_t merged = h * c.spatial_merge_size * c.spatial_merge_size;
  MlpConfig pc;
  pc.hidden_size = merged;
  pc.ffn_hidden_size = merged;
  pc.output_size = c.out_hidden_size;
  pc.swiglu = false;  // GELU (erf), as torch.nn.GELU()
  pc.bias = true;
  pc.init_std = pc.out_std = std;
  merger_ = Mlp(b, name + ".merger.mlp", pc);
  params_.assign(b.params().begin() + static_cast<std::ptrdiff_t>(first), b.params().end());
}

at::Tensor Qwen25VisionEncoder::attention(const Block& blk, const at::Tensor& x, const at::Tensor& cos,
                                          const at::Tensor& sin, const std::vector<int64_t>& segments) const {
  const auto& be = *backend_;
  const int64_t d = c_.head_dim(), heads = c_.num_heads / tp_.size();
  auto qkv = lf::parallel::column_parallel_linear(x, blk.qkv, blk.qkv_bias, tp_);  // [s, 1, heads 3 d]
  const int64_t s = qkv.size(0);
  qkv = qkv.view({s, 1, heads, 3, d});
  auto q = apply_rope(be, qkv.select(3, 0).contiguous(), cos, sin);  // [s, 1, heads, d]
  auto k = apply_rope(be, qkv.select(3, 1).contiguous(), cos, sin);
  auto v = qkv.select(3, 2).contiguous();
  // [s, 1, n, d] -> [1, n, s, d]
  auto o = attend_segments(be, q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}), v.permute({1, 2, 0, 3}), segments);
  o = o.permute({2, 0, 1, 3}).reshape({s, 1, heads * d});
  return lf::parallel::row_parallel_linear(o, blk.proj, blk.proj_bias, tp_);
}

at::Tensor Qwen25VisionEncoder::forward(const at::Tensor& pixel_values, const at::Tensor& grid_thw) const {
  LF_CHECK(pixel_values.dim() == 2 && pixel_values.size(1) == c_.patch_dim(), "qwen2_5_vl_vision ", name_,
           ": pixel_values must be [num_patches, ", c_.patch_dim(), "] (C T P P = ", c_.in_channels, " x ",
           c_.temporal_patch_size, " x ", c_.patch_size, " x ", c_.patch_size, "), got ", pixel_values.sizes());
  LF_CHECK(grid_thw.dim() == 2 && grid_thw.size(1) == 3 && grid_thw.size(0) >= 1, "qwen2_5_vl_vision ", name_,
           ": grid_thw must be [num_images, 3] (t, h, w in patches), got ", grid_thw.sizes());
  const at::Tensor g = grid_thw.to(at::kCPU, at::kLong).contiguous();
  const int64_t* gp = g.data_ptr<int64_t>();
  const int64_t m = c_.spatial_merge_size;
  std::vector<Grid> grids;
  int64_t n = 0;
  for (int64_t i = 0; i < g.size(0); ++i) {
    Grid gr{gp[3 * i], gp[3 * i + 1], gp[3 * i + 2]};
    LF_CHECK(gr.t >= 1 && gr.h >= m && gr.w >= m && gr.h % m == 0 && gr.w % m == 0, "qwen2_5_vl_vision ", name_,
             ": grid_thw row ", i, " is (", gr.t, ", ", gr.h, ", ", gr.w, "); h and w must be positive multiples of ",
             "spatial_merge_size ", m, lf::hint("resize images to multiples of patch_size * spatial_merge_size"));
    grids.push_back(gr);
    n += gr.t * gr.h * gr.w;
  }
  LF_CHECK(n == pixel_values.size(0), "qwen2_5_vl_vision ", name_, ": grid_thw covers ", n,
           " patches but pixel_values has ", pixel_values.size(0), " rows");
  const auto layout = vision_layout(grids, c_);
  const auto& be = *backend_;
  const auto device = patch_embed_.device();

  // The processor's rows are Conv3d patches with kernel = stride: the conv is one linear map.
  auto x = at::linear(pixel_values.to(device, patch_embed_.scalar_type()), patch_embed_);  // [n, hidden]
  auto order = layout.token_order.to(device);
  x = x.index_select(0, order).unsqueeze(1);  // [n, 1, hidden], window order

  // 2D RoPE: a quarter of the head's dims rotates by the row, a quarter by the column (halves
  // layout: [h angles, w angles | the same]); inv_freq in fp32 as transformers computes it.
  const int64_t quarter = c_.head_dim() / 4;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  auto inv_freq = at::pow(c_.rope_theta, at::arange(0, 2 * quarter, 2, f32) / static_cast<double>(2 * quarter))
                      .reciprocal();  // [d/4]
  auto ph = layout.pos_h.index_select(0, layout.token_order).to(at::kFloat).unsqueeze(1);
  auto pw = layout.pos_w.index_select(0, layout.token_order).to(at::kFloat).unsqueeze(1);
  auto half = at::cat({ph * inv_freq, pw * inv_freq}, 1);  // [n, d/2]
  auto angles = at::cat({half, half}, 1);                 // [n, d]
  auto cos = angles.cos().to(device, x.scalar_type()), sin = angles.sin().to(device, x.scalar_type());

  const std::set<int64_t> full(c_.fullatt_block_indexes.begin(), c_.fullatt_block_indexes.end());
  // The blocks (run again in backward under recomputation: they own what they read).
  x = run_blocks(static_cast<int64_t>(blocks_.size()), x, recompute_,
                 [this, full, frames = layout.frames, windows = layout.windows, cos, sin](int64_t i, const at::Tensor& in) {
                   const auto& be = *backend_;
                   const auto& blk = blocks_[static_cast<size_t>(i)];
                   at::Tensor y = in + attention(blk, blk.norm1(be, in), cos, sin, full.count(i) ? frames : windows);
                   return y + blk.mlp.forward(be, tp_, blk.norm2(be, y));
                 });
  // Merger: each merge unit's m^2 consecutive tokens (in window order, units stay whole) as one row.
  const int64_t units = n / (m * m);
  auto merged = ln_q_(be, x).reshape({units, 1, -1});                // [units, 1, m^2 hidden]
  auto out = merger_.forward(be, tp_, merged).squeeze(1);            // [units, out_hidden_size]
  return out.index_select(0, layout.unit_inverse.to(device));        // input order
}

std::map<std::string, at::Tensor> qwen25_vision_from_hf(const Qwen25VisionConfig& c,
                                                        const std::map<std::string, at::Tensor>& tensors,
                                                        const std::string& prefix) {
  const int64_t h = c.hidden_size, d = c.head_dim(), nh = c.num_heads, f = c.intermediate_size,
                merged = h * c.spatial_merge_size * c.spatial_merge_size;
  auto get = [&](const std::string& name, std::vector<int64_t> shape) {
    auto it = tensors.find(prefix + name);
    LF_CHECK(it != tensors.end(), "Qwen2.5-VL vision weights: tensor ", prefix + name, " is missing",
             lf::hint("pass every tensor of the checkpoint's vision tower (names under '" + prefix + "')"));
    LF_CHECK(it->second.sizes().vec() == shape, "Qwen2.5-VL vision weights: tensor ", prefix + name, " is ",
             it->second.sizes(), ", the config (hidden_size ", h, ", num_heads ", nh, ", intermediate_size ", f,
             ", out_hidden_size ", c.out_hidden_size, ") says ", at::IntArrayRef(shape));
    return it->second.detach();
  };
  std::map<std::string, at::Tensor> out;
  out["patch_embed.weight"] =
      get("patch_embed.proj.weight", {h, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size})
          .reshape({h, c.patch_dim()});
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string hp = "blocks." + std::to_string(i) + ".", p = hp;
    out[p + "norm1.weight"] = get(hp + "norm1.weight", {h});
    out[p + "norm2.weight"] = get(hp + "norm2.weight", {h});
    // HF's rows are (q | k | v) x heads x d; ours per head (q, k, v) x d, so TP splits by heads.
    out[p + "attention.linear_qkv.weight"] =
        get(hp + "attn.qkv.weight", {3 * h, h}).view({3, nh, d, h}).transpose(0, 1).reshape({3 * nh * d, h});
    out[p + "attention.linear_qkv.bias"] =
        get(hp + "attn.qkv.bias", {3 * h}).view({3, nh, d}).transpose(0, 1).reshape({3 * nh * d});
    out[p + "attention.linear_proj.weight"] = get(hp + "attn.proj.weight", {h, h});
    out[p + "attention.linear_proj.bias"] = get(hp + "attn.proj.bias", {h});
    out[p + "mlp.linear_fc1.weight"] =
        at::cat({get(hp + "mlp.gate_proj.weight", {f, h}), get(hp + "mlp.up_proj.weight", {f, h})}, 0);
    out[p + "mlp.linear_fc1.bias"] = at::cat({get(hp + "mlp.gate_proj.bias", {f}), get(hp + "mlp.up_proj.bias", {f})}, 0);
    out[p + "mlp.linear_fc2.weight"] = get(hp + "mlp.down_proj.weight", {h, f});
    out[p + "mlp.linear_fc2.bias"] = get(hp + "mlp.down_proj.bias", {h});
  }
  out["merger.ln_q.weight"] = get("merger.ln_q.weight", {h});
  out["merger.mlp.linear_fc1.weight"] = get("merger.mlp.0.weight", {merged, merged});
  out["merger.mlp.linear_fc1.bias"] = get("merger.mlp.0.bias", {merged});
  out["merger.mlp.linear_fc2.weight"] = get("merger.mlp.2.weight", {c.out_hidden_size, merged});
  out["merger.mlp.linear_fc2.bias"] = get("merger.mlp.2.bias", {c.out_hidden_size});
  // Stray tensors under the prefix: a config that does not describe this checkpoint.
  const size_t expected = 1 + 12 * static_cast<size_t>(c.depth) + 5;
  size_t under = 0;
  std::string stray;
  for (const auto& [k, v] : tensors)
    if (k.rfind(prefix, 0) == 0) {
      ++under;
      const std::string rest = k.substr(prefix.size());
      const bool known = rest == "patch_embed.proj.weight" || rest.rfind("merger.", 0) == 0 ||
                         (rest.rfind("blocks.", 0) == 0 && std::stoll(rest.substr(7)) < c.depth);
      if (!known && stray.empty()) stray = k;
    }
  LF_CHECK(stray.empty() && under == expected, "Qwen2.5-VL vision weights: ", under, " tensors under '", prefix,
           "', the config's ", c.depth, " blocks need ", expected, stray.empty() ? "" : "; unexpected: ", stray,
           lf::hint("check depth in the config against the checkpoint"));
  return out;
}

void Qwen25VisionEncoder::load_hf_state(const std::map<std::string, at::Tensor>& tensors, const std::string& prefix) {
  const auto full = qwen25_vision_from_hf(c_, tensors, prefix);
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    const std::string rel = p.name.substr(name_.size() + 1);
    auto it = full.find(rel);
    LF_CHECK(it != full.end(), "qwen2_5_vl_vision ", name_, ": no HF tensor maps to parameter ", p.name);
    auto shard = p.sharding.shard(it->second, p.tp_rank, p.tp_size);
    LF_CHECK(shard.sizes() == p.tensor.sizes(), "qwen2_5_vl_vision ", name_, ": ", p.name, " is ", p.tensor.sizes(),
             " on this rank, the HF tensor's shard is ", shard.sizes());
    p.tensor.copy_(shard);
  }
}

void register_qwen25_vision(Registry& r) {
  // Its own kind: spliced_lm's `encoder` slot takes mlp_encoder's fields; the vlm composite's
  // vision slot takes this one.
  r.add(ComponentType{"qwen2_5_vl_vision", "vision_encoder",
                      "Qwen2.5-VL vision tower: patch embedding, 2D RoPE, window/full attention, 2x2 patch merger",
                      schema_loader<Qwen25VisionConfig>()});
}

}  // namespace lf::models

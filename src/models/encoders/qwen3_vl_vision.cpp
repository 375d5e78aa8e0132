#include "loongforge/models/encoders/qwen3_vl_vision.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/models/blocks/attention.h"
#include "loongforge/models/registry.h"

namespace lf::models {
namespace {

constexpr double kNormEps = 1e-6;  // transformers hard-codes the vision LayerNorms' epsilon

struct Grid {
  int64_t t, h, w;
};

// Per input token (the processor's order: per medium, per frame, per merge unit row-major over the
// h/m x w/m units, the m x m patches of the unit row-major) its patch row and column in its frame
// and its frame's height and width; the frames' token counts (the attention segments).
struct VisionLayout {
  std::vector<int64_t> row, col, height, width;
  std::vector<int64_t> frames;
};

VisionLayout vision_layout(const std::vector<Grid>& grids, int64_t m) {
  VisionLayout out;
  for (const auto& g : grids)
    for (int64_t f = 0; f < g.t; ++f) {
      out.frames.push_back(g.h * g.w);
      for (int64_t by = 0; by < g.h / m; ++by)
        for (int64_t bx = 0; bx < g.w / m; ++bx)
          for (int64_t iy = 0; iy < m; ++iy)
            for (int64_t ix = 0; ix < m; ++ix) {
              out.row.push_back(by * m + iy);
              out.col.push_back(bx * m + ix);
              out.height.push_back(g.h);
              out.width.push_back(g.w);
            }
    }
  return out;
}

std::vector<Grid> grids_of(const at::Tensor& grid_thw, int64_t m, const std::string& name) {
  LF_CHECK(grid_thw.dim() == 2 && grid_thw.size(1) == 3 && grid_thw.size(0) >= 1, "qwen3_vl_vision ", name,
           ": grid_thw must be [num_media, 3] (t, h, w in patches), got ", grid_thw.sizes());
  const at::Tensor g = grid_thw.to(at::kCPU, at::kLong).contiguous();
  const int64_t* gp = g.data_ptr<int64_t>();
  std::vector<Grid> grids;
  for (int64_t i = 0; i < g.size(0); ++i) {
    Grid gr{gp[3 * i], gp[3 * i + 1], gp[3 * i + 2]};
    LF_CHECK(gr.t >= 1 && gr.h >= m && gr.w >= m && gr.h % m == 0 && gr.w % m == 0, "qwen3_vl_vision ", name,
             ": grid_thw row ", i, " is (", gr.t, ", ", gr.h, ", ", gr.w, "); h and w must be positive multiples of ",
             "spatial_merge_size ", m, lf::hint("resize images to multiples of patch_size * spatial_merge_size"));
    grids.push_back(gr);
  }
  return grids;
}

// One axis of the bilinear taps (align_corners: the ends of the axis map to the table's ends), in
// fp32 as transformers computes them: taps [n, 2] int64 and weights [n, 2].
std::pair<at::Tensor, at::Tensor> axis_taps(const at::Tensor& index, const at::Tensor& size, int64_t side) {
  const auto src = index.to(at::kFloat) * static_cast<double>(side - 1) / at::clamp_min(size - 1, 1);
  const auto floor = at::floor(src);
  const auto offsets = at::arange(0, 2, at::kLong);
  const auto taps = (floor.to(at::kLong).unsqueeze(1) + offsets).clamp(0, side - 1);
  const auto distance = (src.unsqueeze(1) - floor.unsqueeze(1) - offsets).abs();
  return {taps, (1 - distance).clamp_min(0)};
}

void check_config(const Qwen3VisionConfig& c, const std::string& name, int tp) {
  LF_CHECK(c.out_hidden_size > 0, "qwen3_vl_vision ", name, ": out_hidden_size is not resolved");
  LF_CHECK(c.hidden_size % c.num_heads == 0, "qwen3_vl_vision ", name, ": hidden_size ", c.hidden_size,
           " is not divisible by num_heads ", c.num_heads);
  LF_CHECK(c.head_dim() % 4 == 0, "qwen3_vl_vision ", name, ": head_dim ", c.head_dim(),
           " must be a multiple of 4 (the 2D rotary embedding gives a quarter of it to each axis, twice)");
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(c.num_position_embeddings))));
  LF_CHECK(side * side == c.num_position_embeddings && side >= 2, "qwen3_vl_vision ", name,
           ": num_position_embeddings ", c.num_position_embeddings, " is not the square of a side >= 2",
           lf::hint("Qwen3-VL uses 2304 (48 x 48)"));
  int64_t last = -1;
  for (int64_t i : c.deepstack_visual_indexes) {
    LF_CHECK(i >= 0 && i < c.depth, "qwen3_vl_vision ", name, ": deepstack_visual_indexes holds ", i,
             ", outside the ", c.depth, " blocks");
    // Increasing: transformers hands the features over in block order (the list's order then).
    LF_CHECK(i > last, "qwen3_vl_vision ", name, ": deepstack_visual_indexes must be strictly increasing, got ", i,
             " after ", last);
    last = i;
  }
  LF_CHECK(c.num_heads % tp == 0 && c.intermediate_size % tp == 0 && c.merged_size() % tp == 0, "qwen3_vl_vision ",
           name, ": num_heads ", c.num_heads, ", intermediate_size ", c.intermediate_size, " and the merger width ",
           c.merged_size(), " must be divisible by its tensor-parallel size ", tp,
           lf::hint("set model." + name + ".tensor_model_parallel_size to a common divisor"));
}

// The four bilinear taps of every token of `layout` into a side x side table and their weights.
std::pair<at::Tensor, at::Tensor> taps_of(const VisionLayout& layout, int64_t side) {
  const auto [h_taps, h_weights] =
      axis_taps(at::tensor(layout.row, at::kLong), at::tensor(layout.height, at::kLong), side);
  const auto [w_taps, w_weights] =
      axis_taps(at::tensor(layout.col, at::kLong), at::tensor(layout.width, at::kLong), side);
  // The outer product of the two axes: (h0 w0, h0 w1, h1 w0, h1 w1).
  const auto indices = (h_taps.unsqueeze(2) * side + w_taps.unsqueeze(1)).reshape({-1, 4});
  const auto weights = (h_weights.unsqueeze(2) * w_weights.unsqueeze(1)).reshape({-1, 4});
  return {indices, weights};
}

}  // namespace

std::pair<at::Tensor, at::Tensor> qwen3_vision_position_taps(const at::Tensor& grid_thw, int64_t side, int64_t m) {
  return taps_of(vision_layout(grids_of(grid_thw, m, "position table"), m), side);
}

int64_t Qwen3VisionConfig::num_parameters() const {
  const int64_t h = hidden_size, f = intermediate_size, m = merged_size(), o = out_hidden_size;
  const int64_t block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (f * h + f) + (h * f + h);
  const int64_t merger_mlp = (m * m + m) + (o * m + o);
  return (h * patch_dim() + h) + num_position_embeddings * h + depth * block + (2 * h + merger_mlp) +
         static_cast<int64_t>(deepstack_visual_indexes.size()) * (2 * m + merger_mlp);
}

Qwen3VisionEncoder::Merger Qwen3VisionEncoder::make_merger(ParamBuilder& b, const std::string& prefix,
                                                           bool postshuffle) const {
  Merger m;
  m.postshuffle = postshuffle;
  m.norm = Norm(b, prefix + ".norm", postshuffle ? c_.merged_size() : c_.hidden_size, NormSpec{true, kNormEps});
  MlpConfig pc;
  pc.hidden_size = c_.merged_size();
  pc.ffn_hidden_size = c_.merged_size();
  pc.output_size = c_.out_hidden_size;
  pc.swiglu = false;  // GELU (erf), as torch.nn.GELU()
  pc.bias = true;
  pc.init_std = pc.out_std = c_.initializer_range;
  m.mlp = Mlp(b, prefix, pc);  // prefix.linear_fc1.*, prefix.linear_fc2.*
  return m;
}

Qwen3VisionEncoder::Qwen3VisionEncoder(const Qwen3VisionConfig& c, const lf::backend::DeviceBackend& backend,
                                       ParamBuilder& b, const std::string& name)
    : c_(c), name_(name), backend_(&backend), tp_(b.tp()) {
  // Images are short sequences replicated over the encoder's TP group: no sequence parallelism.
  tp_.sequence_parallel = false;
  check_config(c, name, tp_.size());
  const size_t first = b.params().size();
  const int64_t h = c.hidden_size, d = c.head_dim(), nh = c.num_heads, f = c.intermediate_size;
  const double std = c.initializer_range;
  patch_embed_ = b.add(name + ".patch_embed.weight", b.normal({h, c.patch_dim()}, std), Sharding::replicated(), false);
  patch_bias_ = b.add(name + ".patch_embed.bias", at::zeros({h}), Sharding::replicated(), true);
  pos_embed_ = b.add(name + ".pos_embed.weight", b.normal({c.num_position_embeddings, h}, std), Sharding::replicated(),
                     false);
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string p = name + ".blocks." + std::to_string(i);
    Block blk;
    blk.norm1 = Norm(b, p + ".norm1", h, NormSpec{true, kNormEps});
    blk.qkv = b.add(p + ".attention.linear_qkv.weight", b.normal({3 * nh * d, h}, std), Sharding::along(0), false);
    blk.qkv_bias = b.add(p + ".attention.linear_qkv.bias", at::zeros({3 * nh * d}), Sharding::along(0), true);
    blk.proj = b.add(p + ".attention.linear_proj.weight", b.normal({h, nh * d}, std), Sharding::along(1), false);
    blk.proj_bias = b.add(p + ".attention.linear_proj.bias", at::zeros({h}), Sharding::replicated(), true);
    blk.norm2 = Norm(b, p + ".norm2", h, NormSpec{true, kNormEps});
    blk.fc1 = b.add(p + ".mlp.linear_fc1.weight", b.normal({f, h}, std), Sharding::along(0), false);
    blk.fc1_bias = b.add(p + ".mlp.linear_fc1.bias", at::zeros({f}), Sharding::along(0), true);
    blk.fc2 = b.add(p + ".mlp.linear_fc2.weight", b.normal({h, f}, std), Sharding::along(1), false);
    blk.fc2_bias = b.add(p + ".mlp.linear_fc2.bias", at::zeros({h}), Sharding::replicated(), true);
    blocks_.push_back(std::move(blk));
  }
  merger_ = make_merger(b, name + ".merger", false);
  for (size_t k = 0; k < c.deepstack_visual_indexes.size(); ++k)
    deepstack_.push_back(make_merger(b, name + ".deepstack_merger." + std::to_string(k), true));
  params_.assign(b.params().begin() + static_cast<std::ptrdiff_t>(first), b.params().end());
}

at::Tensor Qwen3VisionEncoder::attention(const Block& blk, const at::Tensor& x, const at::Tensor& cos,
                                         const at::Tensor& sin, const std::vector<int64_t>& frames) const {
  const auto& be = *backend_;
  const int64_t d = c_.head_dim(), heads = c_.num_heads / tp_.size();
  auto qkv = lf::parallel::column_parallel_linear(x, blk.qkv, blk.qkv_bias, tp_);  // [s, 1, heads 3 d]
  const int64_t s = qkv.size(0);
  qkv = qkv.view({s, 1, heads, 3, d});
  auto q = apply_rope(be, qkv.select(3, 0).contiguous(), cos, sin);  // [s, 1, heads, d]
  auto k = apply_rope(be, qkv.select(3, 1).contiguous(), cos, sin);
  auto v = qkv.select(3, 2).contiguous();
  q = q.permute({1, 2, 0, 3});  // [1, heads, s, d]
  k = k.permute({1, 2, 0, 3});
  v = v.permute({1, 2, 0, 3});
  // Frame by frame, each frame's rows sliced out and attended on their own (no [s, s] mask).
  at::Tensor o;
  if (frames.size() == 1) {
    o = lf::ops::sdpa(be, q, k, v, lf::backend::AttentionMask::none());
  } else {
    std::vector<at::Tensor> parts;
    parts.reserve(frames.size());
    int64_t start = 0;
    for (int64_t len : frames) {
      auto cut = [&](const at::Tensor& t) { return t.narrow(2, start, len); };
      parts.push_back(lf::ops::sdpa(be, cut(q), cut(k), cut(v), lf::backend::AttentionMask::none()));
      start += len;
    }
    o = at::cat(parts, 2);
  }
  o = o.permute({2, 0, 1, 3}).reshape({s, 1, heads * d});
  return lf::parallel::row_parallel_linear(o, blk.proj, blk.proj_bias, tp_);
}

at::Tensor Qwen3VisionEncoder::mlp(const Block& blk, const at::Tensor& x) const {
  auto a = lf::parallel::column_parallel_linear(x, blk.fc1, blk.fc1_bias, tp_);
  a = c_.hidden_act == "gelu" ? lf::ops::gelu(*backend_, a) : lf::ops::gelu_tanh(*backend_, a);
  return lf::parallel::row_parallel_linear(a, blk.fc2, blk.fc2_bias, tp_);
}

// x [n, 1, hidden] (input order: merge units are m^2 consecutive tokens) -> [n / m^2, out].
at::Tensor Qwen3VisionEncoder::merge(const Merger& m, const at::Tensor& x) const {
  const int64_t units = x.size(0) / (c_.spatial_merge_size * c_.spatial_merge_size);
  at::Tensor rows = m.postshuffle ? m.norm(*backend_, x.reshape({units, 1, -1}))
                                  : m.norm(*backend_, x).reshape({units, 1, -1});
  return m.mlp.forward(*backend_, tp_, rows).squeeze(1);
}

Qwen3VisionOutput Qwen3VisionEncoder::forward(const at::Tensor& pixel_values, const at::Tensor& grid_thw) const {
  LF_CHECK(pixel_values.dim() == 2 && pixel_values.size(1) == c_.patch_dim(), "qwen3_vl_vision ", name_,
           ": pixel_values must be [num_patches, ", c_.patch_dim(), "] (C T P P = ", c_.in_channels, " x ",
           c_.temporal_patch_size, " x ", c_.patch_size, " x ", c_.patch_size, "), got ", pixel_values.sizes());
  const int64_t m = c_.spatial_merge_size;
  const auto grids = grids_of(grid_thw, m, name_);
  int64_t n = 0;
  for (const auto& g : grids) n += g.t * g.h * g.w;
  LF_CHECK(n == pixel_values.size(0), "qwen3_vl_vision ", name_, ": grid_thw covers ", n,
           " patches but pixel_values has ", pixel_values.size(0), " rows");
  const auto layout = vision_layout(grids, m);
  const auto device = patch_embed_.device();
  const auto dtype = patch_embed_.scalar_type();

  // The processor's rows are Conv3d patches with kernel = stride: the conv is one linear map.
  auto x = at::linear(pixel_values.to(device, dtype), patch_embed_, patch_bias_);  // [n, hidden]
  // The learned position table, resampled bilinearly to each grid (4 taps per patch).
  const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(c_.num_position_embeddings))));
  const auto [taps, weights] = taps_of(layout, side);
  auto pos = pos_embed_.index_select(0, taps.reshape({-1}).to(device)).view({n, 4, -1});
  x = x + (pos * weights.to(device, dtype).unsqueeze(-1)).sum(1);
  x = x.unsqueeze(1);  // [n, 1, hidden]

  // 2D RoPE: a quarter of the head's dims rotates by the row, a quarter by the column (halves
  // layout: [h angles, w angles | the same]); in fp32 as transformers computes it.
  const int64_t quarter = c_.head_dim() / 4;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  auto inv_freq = at::pow(c_.rope_theta, at::arange(0, 2 * quarter, 2, f32) / static_cast<double>(2 * quarter))
                      .reciprocal();  // [d/4]
  auto ph = at::tensor(layout.row, at::kLong).to(at::kFloat).unsqueeze(1);
  auto pw = at::tensor(layout.col, at::kLong).to(at::kFloat).unsqueeze(1);
  auto half = at::cat({ph * inv_freq, pw * inv_freq}, 1);  // [n, d/2]
  auto angles = at::cat({half, half}, 1);                 // [n, d]
  auto cos = angles.cos().to(device, x.scalar_type()), sin = angles.sin().to(device, x.scalar_type());

  Qwen3VisionOutput out;
  out.deepstack.resize(deepstack_.size());
  // The blocks (run again in backward under recomputation: they own what they read); a
  // recomputed group ends at each DeepStack block, whose output is merged.
  x = run_blocks(
      static_cast<int64_t>(blocks_.size()), x, recompute_,
      [this, frames = layout.frames, cos, sin](int64_t i, const at::Tensor& in) {
        const auto& be = *backend_;
        const auto& blk = blocks_[static_cast<size_t>(i)];
        at::Tensor y = in + attention(blk, blk.norm1(be, in), cos, sin, frames);
        return y + mlp(blk, blk.norm2(be, y));
      },
      c_.deepstack_visual_indexes, [&](int64_t i, const at::Tensor& y) {
        for (size_t k = 0; k < deepstack_.size(); ++k)
          if (c_.deepstack_visual_indexes[k] == i) out.deepstack[k] = merge(deepstack_[k], y);
      });
  out.merged = merge(merger_, x);
  return out;
}

std::map<std::string, at::Tensor> qwen3_vision_from_hf(const Qwen3VisionConfig& c,
                                                       const std::map<std::string, at::Tensor>& tensors,
                                                       const std::string& prefix) {
  const int64_t h = c.hidden_size, d = c.head_dim(), nh = c.num_heads, f = c.intermediate_size, m = c.merged_size(),
                o = c.out_hidden_size;
  auto get = [&](const std::string& name, std::vector<int64_t> shape) {
    auto it = tensors.find(prefix + name);
    LF_CHECK(it != tensors.end(), "Qwen3-VL vision weights: tensor ", prefix + name, " is missing",
             lf::hint("pass every tensor of the checkpoint's vision tower (names under '" + prefix + "')"));
    LF_CHECK(it->second.sizes().vec() == shape, "Qwen3-VL vision weights: tensor ", prefix + name, " is ",
             it->second.sizes(), ", the config (hidden_size ", h, ", num_heads ", nh, ", intermediate_size ", f,
             ", out_hidden_size ", o, ", num_position_embeddings ", c.num_position_embeddings, ") says ",
             at::IntArrayRef(shape));
    return it->second.detach();
  };
  std::map<std::string, at::Tensor> out;
  out["patch_embed.weight"] =
      get("patch_embed.proj.weight", {h, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size})
          .reshape({h, c.patch_dim()});
  out["patch_embed.bias"] = get("patch_embed.proj.bias", {h});
  out["pos_embed.weight"] = get("pos_embed.weight", {c.num_position_embeddings, h});
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    for (const char* norm : {"norm1", "norm2"}) {
      out[p + norm + ".weight"] = get(p + norm + ".weight", {h});
      out[p + norm + ".bias"] = get(p + norm + ".bias", {h});
    }
    // HF's rows are (q | k | v) x heads x d; ours per head (q, k, v) x d, so TP splits by heads.
    out[p + "attention.linear_qkv.weight"] =
        get(p + "attn.qkv.weight", {3 * h, h}).view({3, nh, d, h}).transpose(0, 1).reshape({3 * nh * d, h});
    out[p + "attention.linear_qkv.bias"] =
        get(p + "attn.qkv.bias", {3 * h}).view({3, nh, d}).transpose(0, 1).reshape({3 * nh * d});
    out[p + "attention.linear_proj.weight"] = get(p + "attn.proj.weight", {h, h});
    out[p + "attention.linear_proj.bias"] = get(p + "attn.proj.bias", {h});
    out[p + "mlp.linear_fc1.weight"] = get(p + "mlp.linear_fc1.weight", {f, h});
    out[p + "mlp.linear_fc1.bias"] = get(p + "mlp.linear_fc1.bias", {f});
    out[p + "mlp.linear_fc2.weight"] = get(p + "mlp.linear_fc2.weight", {h, f});
    out[p + "mlp.linear_fc2.bias"] = get(p + "mlp.linear_fc2.bias", {h});
  }
  auto merger = [&](const std::string& hf, const std::string& ours, int64_t norm_width) {
    out[ours + "norm.weight"] = get(hf + "norm.weight", {norm_width});
    out[ours + "norm.bias"] = get(hf + "norm.bias", {norm_width});
    out[ours + "linear_fc1.weight"] = get(hf + "linear_fc1.weight", {m, m});
    out[ours + "linear_fc1.bias"] = get(hf + "linear_fc1.bias", {m});
    out[ours + "linear_fc2.weight"] = get(hf + "linear_fc2.weight", {o, m});
    out[ours + "linear_fc2.bias"] = get(hf + "linear_fc2.bias", {o});
  };
  merger("merger.", "merger.", h);
  for (size_t k = 0; k < c.deepstack_visual_indexes.size(); ++k)
    merger("deepstack_merger_list." + std::to_string(k) + ".", "deepstack_merger." + std::to_string(k) + ".", m);
  // Stray tensors under the prefix: a config that does not describe this checkpoint.
  const size_t expected = 3 + 12 * static_cast<size_t>(c.depth) + 6 * (1 + c.deepstack_visual_indexes.size());
  size_t under = 0;
  std::string stray;
  for (const auto& [k, v] : tensors)
    if (k.rfind(prefix, 0) == 0) {
      ++under;
      const std::string rest = k.substr(prefix.size());
      const auto index = [&](size_t at) -> int64_t {
        try {
          return std::stoll(rest.substr(at));
        } catch (...) {
          return int64_t{-1};
        }
      };
      const bool known =
          rest.rfind("patch_embed.proj.", 0) == 0 || rest == "pos_embed.weight" || rest.rfind("merger.", 0) == 0 ||
          (rest.rfind("blocks.", 0) == 0 && index(7) >= 0 && index(7) < c.depth) ||
          (rest.rfind("deepstack_merger_list.", 0) == 0 && index(22) >= 0 &&
           index(22) < static_cast<int64_t>(c.deepstack_visual_indexes.size()));
      if (!known && stray.empty()) stray = k;
    }
  LF_CHECK(stray.empty() && under == expected, "Qwen3-VL vision weights: ", under, " tensors under '", prefix,
           "', the config's ", c.depth, " blocks and ", c.deepstack_visual_indexes.size(), " DeepStack mergers need ",
           expected, stray.empty() ? "" : "; unexpected: ", stray,
           lf::hint("check depth and deepstack_visual_indexes in the config against the checkpoint"));
  return out;
}

void Qwen3VisionEncoder::load_hf_state(const std::map<std::string, at::Tensor>& tensors, const std::string& prefix) {
  const auto full = qwen3_vision_from_hf(c_, tensors, prefix);
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    const std::string rel = p.name.substr(name_.size() + 1);
    auto it = full.find(rel);
    LF_CHECK(it != full.end(), "qwen3_vl_vision ", name_, ": no HF tensor maps to parameter ", p.name);
    auto shard = p.sharding.shard(it->second, p.tp_rank, p.tp_size);
    LF_CHECK(shard.sizes() == p.tensor.sizes(), "qwen3_vl_vision ", name_, ": ", p.name, " is ", p.tensor.sizes(),
             " on this rank, the HF tensor's shard is ", shard.sizes());
    p.tensor.copy_(shard);
  }
}

void register_qwen3_vision(Registry& r) {
  r.add(ComponentType{"qwen3_vl_vision", "vision_encoder",
                      "Qwen3-VL vision tower: patch embedding + interpolated learned positions, 2D RoPE, full "
                      "attention per frame, 2x2 patch merger and DeepStack mergers",
                      schema_loader<Qwen3VisionConfig>()});
}

}  // namespace lf::models

// FP8 quantization, the FP8 linear layer (an autograd Function whose three GEMMs multiply
// quantized operands) and the adaptive FP8 policy's file. See backend/fp8.h.
#include "loongforge/backend/fp8.h"

#include <ATen/Functions.h>
#include <ATen/ops/_scaled_mm.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "loongforge/backend/communicator.h"
#include "loongforge/backend/fp8_delayed.h"
#include "loongforge/backend/fp8_grouped.h"
#include "loongforge/backend/gemm.h"
#include "loongforge/core/error.h"

namespace lf::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The tile edges for x [rows, cols]: 0 means the whole extent.
std::pair<int64_t, int64_t> tile_edges(const at::Tensor& x, int64_t tr, int64_t tc) {
  LF_CHECK(x.dim() == 2, "fp8: expected a 2-d tensor, got ", x.sizes());
  LF_CHECK(tr >= 0 && tc >= 0, "fp8: negative tile ", tr, " x ", tc);
  return {tr == 0 ? std::max<int64_t>(x.size(0), 1) : tr, tc == 0 ? std::max<int64_t>(x.size(1), 1) : tc};
}

// One value per tile -> one per element of a [rows, cols] tensor.
at::Tensor expand_tiles(const at::Tensor& per_tile, int64_t rows, int64_t cols, int64_t tr, int64_t tc) {
  if (per_tile.numel() == 1) return per_tile.reshape({1, 1});
  return per_tile.repeat_interleave(tr, 0).repeat_interleave(tc, 1).narrow(0, 0, rows).narrow(1, 0, cols);
}

bool tensorwise_tiles(const Fp8Tensor& t) { return t.scale_inv.numel() == 1; }

// The row-wise (1 x 128) or column-wise (128 x 1) tiles of the blockwise recipe, or the whole tensor.
struct Tiles {
  int64_t rows, cols;
};
// MX blocks: 1 x 32 along rows, 32 x 1 along columns.
Tiles input_tiles(const Fp8Recipe& r, bool along_rows) {
  if (r.scaling == Fp8Scaling::mxfp8) return along_rows ? Tiles{1, Fp8Recipe::kMxBlock} : Tiles{Fp8Recipe::kMxBlock, 1};
  if (r.scaling != Fp8Scaling::blockwise) return {0, 0};
  return along_rows ? Tiles{1, Fp8Recipe::kBlock} : Tiles{Fp8Recipe::kBlock, 1};
}
// The weight for the forward GEMM (reduction along its input dim).
Tiles weight_tiles(const Fp8Recipe& r) {
  if (r.scaling == Fp8Scaling::mxfp8) return {1, Fp8Recipe::kMxBlock};
  if (r.scaling != Fp8Scaling::blockwise) return {0, 0};
  return {Fp8Recipe::kBlock, Fp8Recipe::kBlock};
}
// The weight for the input gradient's GEMM (reduction along its output dim): MX blocks run along
// the columns; the other recipes' tiles serve both GEMMs (one scale, or square blocks).
Tiles weight_dgrad_tiles(const Fp8Recipe& r) {
  return r.scaling == Fp8Scaling::mxfp8 ? Tiles{Fp8Recipe::kMxBlock, 1} : weight_tiles(r);
}
// x in `fp8` under r's tiles and scale rule (MX: power-of-two scales).
Fp8Tensor quantize_as(const Fp8Recipe& r, const at::Tensor& x, at::ScalarType fp8, Tiles t, const at::Tensor& amax = {}) {
  return quantize(x, fp8, t.rows, t.cols, r.margin, amax, r.scaling == Fp8Scaling::mxfp8);
}

// Tensorwise under TP: the amax of each of `parts` over the group (one all-reduce for all).
std::vector<at::Tensor> group_amax(const std::vector<at::Tensor>& parts, lf::backend::Communicator* group) {
  std::vector<at::Tensor> amax;
  for (const auto& p : parts) amax.push_back(tile_amax(p, 0, 0).reshape({1}));
  if (group == nullptr || group->size() == 1) return amax;
  at::Tensor both = at::cat(amax);
  group->all_reduce(both, lf::backend::ReduceOp::max);
  for (size_t i = 0; i < amax.size(); ++i) amax[i] = both.narrow(0, static_cast<int64_t>(i), 1).reshape({1, 1});
  return amax;
}

// t^T with its tiles transposed.
Fp8Tensor transposed(const Fp8Tensor& t) {
  return {t.data.t().contiguous(), t.scale_inv.t().contiguous(), t.tile_cols, t.tile_rows};
}

// a [m, k] x b [n, k]^T -> fp32 [m, n], both quantized. One scale each (tensorwise): ATen's
// _scaled_mm, the FP8 GEMM itself (cuBLASLt on CUDA, which needs Ada/Hopper and k and n multiples
// of 16; ATen's CPU kernel here); per-tile scales (blockwise), or CUDA shapes cuBLASLt does
// not take: the operands dequantized to fp32 and multiplied (the same products and fp32
// accumulation).
at::Tensor quantized_gemm(const Fp8Tensor& a, const Fp8Tensor& b) {
  const bool tensorwise = tensorwise_tiles(a) && tensorwise_tiles(b);
  const bool cuda_shapes = a.data.size(1) % 16 == 0 && b.data.size(0) % 16 == 0;  // k and n
  if (!tensorwise || (a.data.is_cuda() && !cuda_shapes)) return gemm::mm(a.dequantize(), b.dequantize().t());
  if (!a.data.is_cuda()) {
    // ATen's CPU _scaled_mm emulation, written out (the same operations, so the same bits): on a
    // host with AMX, ATen sends _scaled_mm to oneDNN's FP8 matmul instead, which ran ~800x slower
    // on a Xeon with AMX (torch 2.11: 2.6 s against 3.4 ms for 256 x 512 x 512) and rounds
    // differently from every other host.
    at::Tensor fa = at::mul(a.data.contiguous().to(at::kFloat), a.scale_inv.item<float>());
    at::Tensor fb = at::mul(b.data.contiguous().t().contiguous().to(at::kFloat), b.scale_inv.item<float>());
    return at::matmul(fa, fb);
  }
  try {
    // mat2 [k, n] column-major: b's rows are its columns.
    return at::_scaled_mm(a.data.contiguous(), b.data.contiguous().t(), a.scale_inv.reshape({}),
                          b.scale_inv.reshape({}), std::nullopt, std::nullopt, at::kFloat);
  } catch (const c10::Error& e) {
    LF_FAIL("FP8 GEMM (at::_scaled_mm) on ", a.data.device(), " failed: ", e.what_without_backtrace(),
            lf::hint("FP8 GEMMs on a GPU need compute capability 8.9 or newer (Ada, Hopper); drop --fp8-format"));
  }
}

// Delayed scaling: a GEMM's entry (columns base, base + 1, base + 2: input, weight, output
// gradient; base = 3g for group g of a grouped weight) and whether its forward records amaxes.
struct Delayed {
  Fp8DelayedScaling::Site site;
  int64_t base = 0;
  bool record = false;
};
std::optional<Delayed> delayed_of(const Fp8Recipe& r, const at::Tensor& w, bool record) {
  if (r.scaling != Fp8Scaling::delayed) return std::nullopt;
  LF_CHECK(r.delayed != nullptr, "fp8: the delayed recipe without its scaling state (Fp8Recipe::delayed)");
  return Delayed{r.delayed->site(w), 0, record};
}
Delayed group_of(const Delayed& d, int64_t g) { return {d.site, d.base + 3 * g, d.record}; }

// The forward's GEMM on quantized x and w, and what the backward keeps: w, and x quantized for
// the weight gradient's GEMM (tensorwise: the forward's copy; blockwise: 128 x 1 tiles, since that
// GEMM reduces over the tokens).
struct Fp8Forward {
  at::Tensor y;  // fp32 [n, out]
  Fp8Tensor qxc, qw;  // qw: the weight as the input gradient's GEMM needs it (kept when asked)
};
// amax: x2's and w's tensorwise amax when the caller reduced them already (else computed here,
// reduced over `group`).
Fp8Forward fp8_forward(const Fp8Recipe& r, lf::backend::Communicator* group, const at::Tensor& x2, const at::Tensor& w,
                       const std::optional<at::Tensor>& b, bool keep, std::vector<at::Tensor> amax = {},
                       const std::optional<Delayed>& d = std::nullopt) {
  Fp8Forward f;
  Fp8Tensor qx;
  if (d) {  // the history's scales; this call's amaxes recorded for the next steps
    qx = quantize_scaled(x2, r.forward_dtype(), d->site.scale(d->base));
    f.qw = quantize_scaled(w, r.forward_dtype(), d->site.scale(d->base + 1));
    if (d->record) {
      d->site.record(d->base, x2);
      d->site.record(d->base + 1, w);
    }
  } else {
    if (amax.empty() && r.scaling == Fp8Scaling::tensorwise) amax = group_amax({x2, w}, group);
    if (amax.empty()) amax = {at::Tensor(), at::Tensor()};
    qx = quantize_as(r, x2, r.forward_dtype(), input_tiles(r, true), amax[0]);
    f.qw = quantize_as(r, w, r.forward_dtype(), weight_tiles(r), amax[1]);
  }
  f.y = quantized_gemm(qx, f.qw);
  if (keep) {
    // One scale per tensor (tensorwise, delayed): the forward's copy serves the weight gradient too.
    const bool one_scale = r.scaling == Fp8Scaling::tensorwise || r.scaling == Fp8Scaling::delayed;
    f.qxc = one_scale ? qx : quantize_as(r, x2, r.forward_dtype(), input_tiles(r, false));
    if (r.scaling == Fp8Scaling::mxfp8) f.qw = quantize_as(r, w, r.forward_dtype(), weight_dgrad_tiles(r));
  }
  if (b) f.y.add_(b->to(at::kFloat));
  return f;
}

at::Tensor output_of(const at::Tensor& y, const at::Tensor& x, int64_t out) {
  auto sizes = x.sizes().vec();
  sizes.back() = out;
  return y.to(x.scalar_type()).view(sizes);
}

// A GEMM's output gradient d2 [n, out] quantized for the backward's two GEMMs: qd with the input
// gradient's tiles (along out), qdc with the weight gradient's (along the tokens). One scale per
// tensor (tensorwise, delayed): qd serves both and qdc stays empty. Quantized once, whichever
// GEMMs then run and when (tensorwise: one amax reduction over `group`; delayed: one record).
struct Fp8GradOperand {
  Fp8Tensor qd, qdc;
  const Fp8Tensor& for_dx() const {
    LF_CHECK(qd.data.defined(), "fp8: the output gradient was not quantized for the input gradient's GEMM");
    return qd;
  }
  const Fp8Tensor& for_dw() const {
    const Fp8Tensor& q = qdc.data.defined() ? qdc : qd;
    LF_CHECK(q.data.defined() && (qdc.data.defined() || tensorwise_tiles(qd)),
             "fp8: the output gradient was not quantized for the weight gradient's GEMM");
    return q;
  }
};
Fp8GradOperand quantize_grad(const Fp8Recipe& r, lf::backend::Communicator* group, const at::Tensor& d2, bool for_dx,
                             bool for_dw, at::Tensor amax = {}, const std::optional<Delayed>& d = std::nullopt) {
  const bool tensorwise = r.scaling == Fp8Scaling::tensorwise || r.scaling == Fp8Scaling::delayed;
  Fp8GradOperand q;
  if (!for_dx && !for_dw) return q;
  if (d) {
    q.qd = quantize_scaled(d2, r.grad_dtype(), d->site.scale(d->base + 2));
    d->site.record(d->base + 2, d2);
    return q;
  }
  if (r.scaling == Fp8Scaling::tensorwise && !amax.defined()) amax = group_amax({d2}, group)[0];
  if (tensorwise || for_dx) q.qd = quantize_as(r, d2, r.grad_dtype(), input_tiles(r, true), amax);
  if (!tensorwise && for_dw) q.qdc = quantize_as(r, d2, r.grad_dtype(), input_tiles(r, false));
  return q;
}

// One FP8 GEMM's backward from its quantized output gradient (fp32 results): x's gradient
// Q(dy) Q(w) and w's Q(dy)^T Q(x), each when asked.
struct Fp8Grads {
  at::Tensor dx, dw;
};
Fp8Grads fp8_grads(const Fp8GradOperand& q, const Fp8Tensor& qxc, const Fp8Tensor& qw, bool want_dx, bool want_dw) {
  Fp8Grads g;
  if (want_dx) g.dx = quantized_gemm(q.for_dx(), transposed(qw));  // [n, out] x [out, in]
  if (want_dw) g.dw = quantized_gemm(transposed(q.for_dw()), transposed(qxc));  // [out, n] x [n, in]
  return g;
}
Fp8Grads fp8_backward(const Fp8Recipe& r, lf::backend::Communicator* group, const at::Tensor& d2,
                      const Fp8Tensor& qxc, const Fp8Tensor& qw, bool want_dx, bool want_dw,
                      const std::optional<Delayed>& d = std::nullopt) {
  return fp8_grads(quantize_grad(r, group, d2, want_dx, want_dw, {}, d), qxc, qw, want_dx, want_dw);
}

// The delayed-scaling entry a forward saved (none for the other recipes).
std::optional<Delayed> saved_site(AutogradContext* ctx) {
  if (!ctx->saved_data.count("site")) return std::nullopt;
  const auto v = ctx->saved_data["site"].toIntVector();
  return Delayed{{reinterpret_cast<Fp8AmaxTable*>(v[0]), v[1]}, 0, true};
}

struct Fp8LinearFn : torch::autograd::Function<Fp8LinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const Fp8Recipe* recipe, const WeightGradSlots* slots,
                            lf::backend::Communicator* group, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& b) {
    const auto d = delayed_of(*recipe, w, true);
    const Fp8Forward f = fp8_forward(*recipe, group, x.reshape({-1, w.size(1)}), w, b, true, {}, d);
    ctx->saved_data["recipe"] = reinterpret_cast<int64_t>(recipe);
    if (d) ctx->saved_data["site"] = std::vector<int64_t>{reinterpret_cast<int64_t>(d->site.table), d->site.offset};
    ctx->saved_data["slots"] = reinterpret_cast<int64_t>(slots);
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["x_grad"] = x.requires_grad();
    ctx->saved_data["w_grad"] = w.requires_grad();
    ctx->saved_data["b_grad"] = b.has_value() && b->requires_grad();
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["xc_tiles"] = std::vector<int64_t>{f.qxc.tile_rows, f.qxc.tile_cols};
    ctx->saved_data["w_tiles"] = std::vector<int64_t>{f.qw.tile_rows, f.qw.tile_cols};
    ctx->save_for_backward({w, f.qxc.data, f.qxc.scale_inv, f.qw.data, f.qw.scale_inv});
    return output_of(f.y, x, w.size(0));
  }

  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    auto s = ctx->get_saved_variables();
    const at::Tensor& w = s[0];
    const auto& r = *reinterpret_cast<const Fp8Recipe*>(ctx->saved_data["recipe"].toInt());
    auto* group = reinterpret_cast<lf::backend::Communicator*>(ctx->saved_data["group"].toInt());
    const auto xc_tiles = ctx->saved_data["xc_tiles"].toIntVector(), w_tiles = ctx->saved_data["w_tiles"].toIntVector();
    const Fp8Tensor qxc{s[1], s[2], xc_tiles[0], xc_tiles[1]}, qw{s[3], s[4], w_tiles[0], w_tiles[1]};
    const int64_t out = w.size(0);
    const at::Tensor d2 = dy[0].reshape({-1, out});
    const Fp8Grads g = fp8_backward(r, group, d2, qxc, qw, ctx->saved_data["x_grad"].toBool(),
                                    ctx->saved_data["w_grad"].toBool(), saved_site(ctx));
    at::Tensor dx, dw, db;
    if (g.dx.defined()) {
      const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
      dx = g.dx.to(dtype).view(ctx->saved_data["x_sizes"].toIntVector());
    }
    // w's gradient into the slot when there is one.
    if (g.dw.defined())
      dw = store_weight_grad(reinterpret_cast<const WeightGradSlots*>(ctx->saved_data["slots"].toInt()), w, g.dw);
    // The bias gradient from the unquantized output gradient (as Transformer Engine's).
    if (ctx->saved_data["b_grad"].toBool()) db = d2.sum(0);
    return {at::Tensor(), at::Tensor(), at::Tensor(), dx, dw, db};
  }
};

// Tensorwise: every non-empty group's x and w amax, [x_0, w_0, x_1, w_1, ...], in one reduction
// over `group` (empty: blockwise, or no rows).
std::vector<at::Tensor> grouped_amax(const Fp8Recipe& r, lf::backend::Communicator* group, const at::Tensor& x,
                                     const at::Tensor& w, const std::vector<int64_t>& counts) {
  if (r.scaling != Fp8Scaling::tensorwise) return {};
  std::vector<at::Tensor> parts;
  int64_t off = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) parts.insert(parts.end(), {x.narrow(0, off, counts[g]), w.select(0, static_cast<int64_t>(g))});
    off += counts[g];
  }
  return parts.empty() ? parts : group_amax(parts, group);
}
// The k-th non-empty group's pair of grouped_amax, or none.
std::vector<at::Tensor> pair_of(const std::vector<at::Tensor>& amax, size_t k) {
  if (amax.empty()) return {};
  return {amax[2 * k], amax[2 * k + 1]};
}

// The experts' GEMMs through Fp8GroupedGemm (its passes kept in the autograd context).
struct Fp8GroupedFn : torch::autograd::Function<Fp8GroupedFn> {
  struct Holder : torch::CustomClassHolder {
    explicit Holder(Fp8GroupedGemm g) : gemm(std::move(g)) {}
    Fp8GroupedGemm gemm;
  };
  static at::Tensor forward(AutogradContext* ctx, const Fp8Recipe* recipe, lf::backend::Communicator* group,
                            const at::Tensor& x, const at::Tensor& w, std::vector<int64_t> counts) {
    Fp8GroupedGemm gemm(x, w, counts, *recipe, group, true, true);
    at::Tensor y = gemm.take_output();
    ctx->saved_data["gemm"] = c10::IValue::make_capsule(c10::make_intrusive<Holder>(std::move(gemm)));
    ctx->saved_data["x_grad"] = x.requires_grad();
    ctx->saved_data["w_grad"] = w.requires_grad();
    ctx->save_for_backward({w});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    const at::Tensor w = ctx->get_saved_variables()[0];
    const auto& gemm = static_cast<Holder*>(ctx->saved_data["gemm"].toCapsule().get())->gemm;
    auto [dx, dw] = gemm.backward(dy[0], ctx->saved_data["x_grad"].toBool(), ctx->saved_data["w_grad"].toBool());
    ctx->saved_data.erase("gemm");  // the FP8 copies go now, not with the graph
    if (dw.defined()) dw = dw.to(w.scalar_type());
    return {at::Tensor(), at::Tensor(), dx, dw, at::Tensor()};
  }
};

}  // namespace

struct Fp8GroupedGemm::State {
  const Fp8Recipe* recipe = nullptr;
  lf::backend::Communicator* group = nullptr;  // tensorwise only
  std::vector<int64_t> counts;
  std::optional<Delayed> delayed;
  at::ScalarType x_dtype;
  std::vector<int64_t> w_sizes;
  int64_t rows = 0;  // x's
  bool kept = false;  // the quantized operands are kept for backward()
  std::vector<Fp8Tensor> qxc, qw;  // per non-empty group (keep)
};

Fp8GroupedGemm::Fp8GroupedGemm(const at::Tensor& x, const at::Tensor& w, const std::vector<int64_t>& counts,
                               const Fp8Recipe& recipe, lf::backend::Communicator* amax_group, bool keep,
                               bool record) {
  LF_CHECK(x.dim() == 2 && w.dim() == 3 && x.size(1) == w.size(2), "fp8 grouped GEMM: x ", x.sizes(), " and w ",
           w.sizes(), " do not multiply");
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  LF_CHECK(static_cast<int64_t>(counts.size()) == w.size(0) && total == x.size(0), "fp8 grouped GEMM: ",
           counts.size(), " counts summing to ", total, " for ", x.size(0), " rows and ", w.size(0), " groups");
  auto st = std::make_shared<State>();
  st->recipe = &recipe;
  st->group = recipe.scaling == Fp8Scaling::tensorwise ? amax_group : nullptr;
  st->counts = counts;
  st->delayed = delayed_of(recipe, w, record);
  st->x_dtype = x.scalar_type();
  st->w_sizes = w.sizes().vec();
  st->rows = x.size(0);
  std::vector<at::Tensor> ys;
  const auto amax = grouped_amax(recipe, st->group, x, w, counts);
  int64_t off = 0;
  size_t k = 0;  // index of the non-empty group
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] == 0) continue;
    const auto d = st->delayed ? std::optional<Delayed>(group_of(*st->delayed, static_cast<int64_t>(g))) : std::nullopt;
    Fp8Forward f = fp8_forward(recipe, st->group, x.narrow(0, off, counts[g]), w.select(0, static_cast<int64_t>(g)),
                               std::nullopt, keep, pair_of(amax, k++), d);
    off += counts[g];
    ys.push_back(std::move(f.y));
    if (keep) st->qxc.push_back(std::move(f.qxc)), st->qw.push_back(std::move(f.qw));
  }
  y_ = ys.empty() ? at::zeros({0, w.size(1)}, x.options()) : at::cat(ys).to(x.scalar_type());
  st->kept = keep;
  s_ = std::move(st);
}

at::Tensor Fp8GroupedGemm::take_output() {
  LF_CHECK(y_.defined(), "fp8 grouped GEMM: the output was taken already");
  return std::move(y_);
}

struct Fp8GroupedGemm::GradState {
  const State* owner = nullptr;  // the forward whose operands it multiplies
  std::vector<Fp8GradOperand> groups;  // per non-empty group
  at::TensorOptions options;  // dy's
  bool for_dx = false, for_dw = false;
};

Fp8GroupedGemm::Grad Fp8GroupedGemm::quantize_grad(const at::Tensor& dy, bool for_dx, bool for_dw) const {
  const State& st = *s_;
  const Fp8Recipe& r = *st.recipe;
  LF_CHECK(st.kept, "fp8 grouped GEMM: backward of a forward that kept nothing");
  LF_CHECK(dy.dim() == 2 && dy.size(0) == st.rows && dy.size(1) == st.w_sizes[1], "fp8 grouped GEMM: output gradient ",
           dy.sizes(), " for an output of ", st.rows, " x ", st.w_sizes[1]);
  auto q = std::make_shared<GradState>();
  q->owner = &st;
  q->options = dy.options();
  q->for_dx = for_dx;
  q->for_dw = for_dw;
  std::vector<at::Tensor> chunks;
  int64_t off = 0;
  for (int64_t n : st.counts) {
    if (n > 0) chunks.push_back(dy.narrow(0, off, n));
    off += n;
  }
  // Tensorwise: every group's output-gradient amax in one reduction.
  const auto amax = r.scaling == Fp8Scaling::tensorwise && !chunks.empty() && (for_dx || for_dw)
                        ? group_amax(chunks, st.group)
                        : std::vector<at::Tensor>{};
  size_t k = 0;  // index of the non-empty group
  for (size_t g = 0; g < st.counts.size(); ++g) {
    if (st.counts[g] == 0) continue;
    const auto d = st.delayed ? std::optional<Delayed>(group_of(*st.delayed, static_cast<int64_t>(g))) : std::nullopt;
    q->groups.push_back(lf::ops::quantize_grad(r, st.group, chunks[k], for_dx, for_dw,
                                               amax.empty() ? at::Tensor() : amax[k], d));
    ++k;
  }
  Grad out;
  out.s_ = std::move(q);
  return out;
}

std::pair<at::Tensor, at::Tensor> Fp8GroupedGemm::backward(const Grad& q, bool want_dx, bool want_dw) const {
  const State& st = *s_;
  LF_CHECK(q.s_ != nullptr, "fp8 grouped GEMM: backward from an output gradient that was never quantized");
  const GradState& gs = *q.s_;
  LF_CHECK(gs.owner == &st, "fp8 grouped GEMM: an output gradient quantized by another grouped GEMM");
  LF_CHECK((!want_dx || gs.for_dx) && (!want_dw || gs.for_dw), "fp8 grouped GEMM: the ",
           want_dx && !gs.for_dx ? "input" : "weight", " gradient asked of an output gradient not quantized for it");
  at::Tensor dw = want_dw ? at::zeros(st.w_sizes, gs.options.dtype(at::kFloat)) : at::Tensor();
  std::vector<at::Tensor> dxs;
  size_t k = 0;  // index of the non-empty group
  for (size_t g = 0; g < st.counts.size(); ++g) {
    if (st.counts[g] == 0) continue;
    const Fp8Grads gr = fp8_grads(gs.groups[k], st.qxc[k], st.qw[k], want_dx, want_dw);
    if (want_dx) dxs.push_back(gr.dx);
    if (want_dw) dw.select(0, static_cast<int64_t>(g)).copy_(gr.dw);
    ++k;
  }
  at::Tensor dx;
  if (want_dx)
    dx = dxs.empty() ? at::zeros({0, st.w_sizes[2]}, gs.options.dtype(st.x_dtype)) : at::cat(dxs).to(st.x_dtype);
  return {dx, dw};
}

bool Fp8GroupedGemm::one_grad_copy() const {
  return s_->recipe->scaling == Fp8Scaling::tensorwise || s_->recipe->scaling == Fp8Scaling::delayed;
}

std::pair<at::Tensor, at::Tensor> Fp8GroupedGemm::backward(const at::Tensor& dy, bool want_dx, bool want_dw) const {
  return backward(quantize_grad(dy, want_dx, want_dw), want_dx, want_dw);
}

at::ScalarType Fp8Recipe::forward_dtype() const { return at::kFloat8_e4m3fn; }
at::ScalarType Fp8Recipe::grad_dtype() const {
  return format == Fp8Format::hybrid ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn;
}
std::string Fp8Recipe::describe() const {
  std::string s = std::string(to_string(scaling)) + " " + to_string(format) + " (margin " + std::to_string(margin);
  if (scaling == Fp8Scaling::delayed)
    s += ", amax history " + std::to_string(amax_history_len) + ", " + to_string(amax_compute_algo);
  return s + ")";
}
Fp8Recipe Fp8Recipe::from_names(const std::string& format, const std::string& scaling, int margin,
                                int64_t history_len, const std::string& algo) {
  LF_CHECK(format == "e4m3" || format == "hybrid", "fp8 format '", format, "' is not e4m3 or hybrid");
  LF_CHECK(scaling == "tensorwise" || scaling == "blockwise" || scaling == "delayed" || scaling == "mxfp8",
           "fp8 recipe '", scaling, "' is not tensorwise, blockwise, delayed or mxfp8");
  LF_CHECK(algo == "most_recent" || algo == "max", "fp8 amax compute algo '", algo, "' is not most_recent or max");
  LF_CHECK(history_len >= 1, "fp8 amax history length ", history_len, " (want >= 1)");
  Fp8Recipe r;
  r.format = format == "e4m3" ? Fp8Format::e4m3 : Fp8Format::hybrid;
  r.scaling = scaling == "blockwise" ? Fp8Scaling::blockwise
              : scaling == "delayed" ? Fp8Scaling::delayed
              : scaling == "mxfp8"   ? Fp8Scaling::mxfp8
                                     : Fp8Scaling::tensorwise;
  r.margin = margin;
  r.amax_history_len = history_len;
  r.amax_compute_algo = algo == "max" ? Fp8AmaxAlgo::max : Fp8AmaxAlgo::most_recent;
  return r;
}

const char* to_string(Fp8Scaling s) {
  switch (s) {
    case Fp8Scaling::tensorwise: return "tensorwise";
    case Fp8Scaling::blockwise: return "blockwise";
    case Fp8Scaling::delayed: return "delayed";
    case Fp8Scaling::mxfp8: return "mxfp8";
  }
  return "?";
}
const char* to_string(Fp8Format f) { return f == Fp8Format::hybrid ? "hybrid" : "e4m3"; }
const char* to_string(Fp8AmaxAlgo a) { return a == Fp8AmaxAlgo::max ? "max" : "most_recent"; }

double fp8_max(at::ScalarType fp8) {
  if (fp8 == at::kFloat8_e4m3fn) return 448.0;
  if (fp8 == at::kFloat8_e5m2) return 57344.0;
  LF_FAIL("fp8_max: ", fp8, " is not an FP8 dtype this engine uses (Float8_e4m3fn, Float8_e5m2)");
}

at::Tensor Fp8Tensor::dequantize() const {
  const at::Tensor v = data.to(at::kFloat);
  if (tensorwise_tiles(*this)) return v * scale_inv.reshape({});
  return v * expand_tiles(scale_inv, data.size(0), data.size(1), tile_rows, tile_cols);
}

at::Tensor tile_amax(const at::Tensor& x, int64_t tr, int64_t tc) {
  const auto [r, c] = tile_edges(x, tr, tc);
  const int64_t rows = x.size(0), cols = x.size(1);
  // An empty tensor: one zero per tile of its extent counted as at least 1 (quantize's count).
  if (x.numel() == 0)
    return at::zeros({ceil_div(std::max<int64_t>(rows, 1), r), ceil_div(std::max<int64_t>(cols, 1), c)},
                     x.options().dtype(at::kFloat));
  if (r >= rows && c >= cols) return x.abs().amax().to(at::kFloat).reshape({1, 1});
  const int64_t R = ceil_div(rows, r), C = ceil_div(cols, c);
  at::Tensor a = x.abs().to(at::kFloat);
  if (R * r != rows || C * c != cols) a = at::constant_pad_nd(a, {0, C * c - cols, 0, R * r - rows}, 0);
  return a.view({R, r, C, c}).amax(at::IntArrayRef{1, 3});
}

Fp8Tensor quantize(const at::Tensor& x, at::ScalarType fp8, int64_t tr, int64_t tc, int margin,
                   const at::Tensor& amax, bool pow2) {
  const auto [r, c] = tile_edges(x, tr, tc);
  const double max = fp8_max(fp8);
  at::Tensor a = amax.defined() ? amax.to(at::kFloat) : tile_amax(x, r, c);
  const int64_t R = ceil_div(std::max<int64_t>(x.size(0), 1), r), C = ceil_div(std::max<int64_t>(x.size(1), 1), c);
  LF_CHECK(a.numel() == R * C, "fp8 quantize: ", a.numel(), " amax values for ", x.sizes(), " in ", r, " x ", c,
           " tiles (want ", R * C, ")");
  // scale = 2^-margin max / amax, 1 where amax is 0 (an all-zero tile stays zero). MX: 1 / the
  // power of two at or above amax / (2^-margin max) (frexp: v = m 2^e, m in [0.5, 1); 2^e, or v
  // itself when m is 0.5), exact in fp32.
  at::Tensor scale;
  if (pow2) {
    const at::Tensor v = at::where(a > 0, a / (max * std::ldexp(1.0, -margin)), at::ones_like(a));
    const auto [m, e] = at::frexp(v);
    // The exponent within E8M0's normal range, so that the scale stays finite for tiny blocks.
    const at::Tensor p = at::where(m == 0.5, e - 1, e).clamp(-126, 127);
    scale = at::ldexp(at::ones_like(v), p).reciprocal();
  } else {
    scale = at::where(a > 0, (max * std::ldexp(1.0, -margin)) / a, at::ones_like(a));
  }
  const at::Tensor full = a.numel() == 1 ? scale.reshape({}) : expand_tiles(scale, x.size(0), x.size(1), r, c);
  Fp8Tensor q;
  q.data = (x.to(at::kFloat) * full).clamp(-max, max).to(fp8);
  q.scale_inv = scale.reciprocal().reshape({R, C});
  q.tile_rows = r, q.tile_cols = c;
  return q;
}

Fp8Tensor quantize_scaled(const at::Tensor& x, at::ScalarType fp8, const at::Tensor& scale) {
  const auto [r, c] = tile_edges(x, 0, 0);
  LF_CHECK(scale.numel() == 1, "fp8 quantize_scaled: ", scale.numel(), " scales (want 1)");
  const double max = fp8_max(fp8);
  const at::Tensor s = scale.to(at::kFloat).reshape({});
  Fp8Tensor q;
  q.data = (x.to(at::kFloat) * s).clamp(-max, max).to(fp8);
  q.scale_inv = s.reciprocal().reshape({1, 1});
  q.tile_rows = r, q.tile_cols = c;
  return q;
}

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const Fp8Recipe& recipe,
                      const WeightGradSlots* slots, lf::backend::Communicator* amax_group) {
  LF_CHECK(w.dim() == 2 && x.size(-1) == w.size(1), "fp8_linear: x ", x.sizes(), " and w ", w.sizes(),
           " do not multiply");
  RECORD_USER_SCOPE("lf::fp8_linear");
  auto* group = recipe.scaling == Fp8Scaling::tensorwise ? amax_group : nullptr;
  const auto bias = b.defined() ? std::optional<at::Tensor>(b) : std::nullopt;
  // Without a backward: amaxes recorded only in training (grad mode on), not in evaluation.
  if (!at::GradMode::is_enabled() || !(x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad())))
    return output_of(fp8_forward(recipe, group, x.reshape({-1, w.size(1)}), w, bias, false, {},
                                 delayed_of(recipe, w, at::GradMode::is_enabled())).y,
                     x, w.size(0));
  return Fp8LinearFn::apply(&recipe, slots, group, x, w, bias);
}

at::Tensor fp8_grouped_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts,
                              const Fp8Recipe& recipe, lf::backend::Communicator* amax_group) {
  const at::Tensor c = counts.to(at::kCPU, at::kLong).contiguous();
  LF_CHECK(c.dim() == 1, "fp8_grouped_linear: counts ", c.sizes(), " (want one count per group)");
  RECORD_USER_SCOPE("lf::fp8_grouped_linear");
  auto* group = recipe.scaling == Fp8Scaling::tensorwise ? amax_group : nullptr;
  std::vector<int64_t> n(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  // Without a backward: amaxes recorded only in training (grad mode on), not in evaluation.
  if (!at::GradMode::is_enabled() || !(x.requires_grad() || w.requires_grad()))
    return Fp8GroupedGemm(x, w, n, recipe, group, false, at::GradMode::is_enabled()).take_output();
  return Fp8GroupedFn::apply(&recipe, group, x, w, n);
}

}  // namespace lf::ops


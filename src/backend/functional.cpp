// Autograd Functions over the backend's op pairs (backend/functional.h). Each forward calls the
// backend's *_fwd and saves what its *_bwd needs; each backward calls *_bwd. Duality: backward
// returns exactly the vector-Jacobian product of forward, as pinned by the op harness.
#include "loongforge/backend/functional.h"

#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "loongforge/backend/gemm.h"
#include "loongforge/core/error.h"

namespace lf::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The backend travels to backward as an integer in saved_data (IValues cannot hold pointers);
// backends are process-lifetime singletons or outlive the graph by contract.
void save_backend(AutogradContext* ctx, const DeviceBackend* be) {
  ctx->saved_data["backend"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(be));
}
const DeviceBackend& saved_backend(AutogradContext* ctx) {
  return *reinterpret_cast<const DeviceBackend*>(
      static_cast<intptr_t>(ctx->saved_data["backend"].toInt()));
}

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& x,
                            const at::Tensor& w, double eps) {
    auto r = be->ops().rms_norm_fwd(x, w, eps);
    save_backend(ctx, be);
    ctx->save_for_backward({x, w, r.rstd});
    return r.y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    auto s = ctx->get_saved_variables();
    auto g = saved_backend(ctx).ops().rms_norm_bwd(dy[0], s[0], s[1], s[2]);
    return {at::Tensor(), g.dx, g.dw, at::Tensor()};
  }
};

struct LayerNormFn : torch::autograd::Function<LayerNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& x,
                            const at::Tensor& w, const std::optional<at::Tensor>& b, double eps) {
    const bool has_bias = b.has_value() && b->defined();
    auto r = be->ops().layer_norm_fwd(x, w, has_bias ? *b : at::Tensor(), eps);
    save_backend(ctx, be);
    ctx->saved_data["has_bias"] = has_bias;
    ctx->save_for_backward({x, w, r.mean, r.rstd});
    return r.y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    auto s = ctx->get_saved_variables();
    auto g = saved_backend(ctx).ops().layer_norm_bwd(dy[0], s[0], s[1],
                                                     ctx->saved_data["has_bias"].toBool(), s[2],
                                                     s[3]);
    return {at::Tensor(), g.dx, g.dw, g.db, at::Tensor()};
  }
};

struct RopeFn : torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
    save_backend(ctx, be);
    ctx->saved_data["interleaved"] = interleaved;
    ctx->save_for_backward({cos, sin});
    return be->ops().rope_fwd(x, cos, sin, interleaved);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    auto s = ctx->get_saved_variables();
    auto dx = saved_backend(ctx).ops().rope_bwd(dy[0], s[0], s[1],
                                                ctx->saved_data["interleaved"].toBool());
    return {at::Tensor(), dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// An element-wise activation y = f(x) whose backward needs only x: the op table's forward and
// backward by member pointer (SwiGLU, GELU in both forms). Each op names its own node type
// (Self), so the profile shows CppNode<...GeluFn>, not the template's arguments.
using lf::backend::OpTable;
using UnaryFwd = at::Tensor (OpTable::*)(const at::Tensor&) const;
using UnaryBwd = at::Tensor (OpTable::*)(const at::Tensor&, const at::Tensor&) const;

template <class Self, UnaryFwd Fwd, UnaryBwd Bwd>
struct ActivationFn : torch::autograd::Function<Self> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& x) {
    save_backend(ctx, be);
    ctx->save_for_backward({x});
    return (be->ops().*Fwd)(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    auto s = ctx->get_saved_variables();
    return {at::Tensor(), (saved_backend(ctx).ops().*Bwd)(dy[0], s[0])};
  }
};
struct SwigluFn : ActivationFn<SwigluFn, &OpTable::swiglu_fwd, &OpTable::swiglu_bwd> {};
struct GeluFn : ActivationFn<GeluFn, &OpTable::gelu_fwd, &OpTable::gelu_bwd> {};
struct GeluTanhFn : ActivationFn<GeluTanhFn, &OpTable::gelu_tanh_fwd, &OpTable::gelu_tanh_bwd> {};

struct GegluTanhFn : torch::autograd::Function<GegluTanhFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& gate, const at::Tensor& up) {
    save_backend(ctx, be);
    ctx->save_for_backward({gate, up});
    return be->ops().geglu_tanh_fwd(gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    auto s = ctx->get_saved_variables();
    auto g = saved_backend(ctx).ops().geglu_tanh_bwd(dy[0].contiguous(), s[0], s[1]);
    return {at::Tensor(), g.dgate, g.dup};
  }
};

struct CrossEntropyFn : torch::autograd::Function<CrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be,
                            const at::Tensor& logits, const at::Tensor& target,
                            int64_t ignore_index) {
    auto r = be->ops().softmax_cross_entropy_fwd(logits, target, ignore_index);
    save_backend(ctx, be);
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->save_for_backward({logits, target, r.lse});
    return r.loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list dloss) {
    auto s = ctx->get_saved_variables();
    auto dlogits = saved_backend(ctx).ops().softmax_cross_entropy_bwd(
        dloss[0], s[0], s[1], s[2], ctx->saved_data["ignore_index"].toInt());
    return {at::Tensor(), dlogits, at::Tensor(), at::Tensor()};
  }
};

// The gradients come out of the forward (for dL = 1); backward scales them by the incoming dL
// and hands them over (in place: a graph is backpropagated once). With a GradInto, w's gradient
// went into its destination in the forward, scaled by the weight backward must then receive.

struct LinearCrossEntropyFn : torch::autograd::Function<LinearCrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& x,
                            const at::Tensor& w, const at::Tensor& target, const at::Tensor& weight,
                            const lf::backend::VocabShard* shard, int64_t ignore_index, int64_t chunk,
                            const lf::backend::GradInto* into) {
    auto r = be->ops().linear_cross_entropy(x, w, target, weight, ignore_index, *shard, chunk,
                                            into ? *into : lf::backend::GradInto{});
    ctx->saved_data["dx"] = r.dx;
    if (into && into->skip) {
      ctx->saved_data["skip_dw"] = true;
    } else if (into) {
      ctx->saved_data["into_scale"] = static_cast<double>(static_cast<float>(into->scale));
    } else {
      ctx->saved_data["dw"] = r.dw;
    }
    return (r.loss * weight).sum();
  }
  static variable_list backward(AutogradContext* ctx, variable_list dl) {
    LF_CHECK(ctx->saved_data.count("dx") == 1,
             "linear_cross_entropy_sum: backpropagated twice (its gradients are handed over once)");
    at::Tensor dx = ctx->saved_data["dx"].toTensor();
    ctx->saved_data.erase("dx");
    const at::Tensor g = dl[0].to(at::kFloat);
    dx.mul_(g);
    at::Tensor dw;
    if (ctx->saved_data.count("skip_dw")) {
      // a frozen weight: no gradient
    } else if (ctx->saved_data.count("into_scale")) {
      const float want = static_cast<float>(ctx->saved_data["into_scale"].toDouble());
      const float got = g.item<float>();
      LF_CHECK(got == want, "linear_cross_entropy_sum: the output layer's weight gradient was written to the "
               "gradient buffer for a loss weight of ", want, ", but the loss sum's gradient is ", got,
               lf::hint("internal: the trainer's loss weights and its objective disagree; "
                        "--no-gradient-accumulation-fusion avoids the direct write"));
    } else {
      dw = ctx->saved_data["dw"].toTensor();
      ctx->saved_data.erase("dw");
      dw.mul_(g);
    }
    return {at::Tensor(), dx, dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The slot the sink names for w's fp32 gradient (gradient-accumulation fusion), or nullopt: no
// sink (slots null), no slot, or a gradient the caller cannot write there (`writable` false: the
// linear layers write only fp32 GEMM results, the embedding also bf16/fp16 rows it converts). A
// slot must be a contiguous fp32 tensor of w's shape. `op` names the layer in the error.
std::optional<lf::backend::GradInto> fp32_grad_slot(const WeightGradSlots* slots, const at::Tensor& w, bool writable,
                                                    const char* op) {
  if (!writable || slots == nullptr) return std::nullopt;
  auto into = slots->weight_grad_slot(w);
  if (!into || !into->dw.defined()) return std::nullopt;
  LF_CHECK(into->dw.sizes() == w.sizes() && into->dw.scalar_type() == at::kFloat && into->dw.is_contiguous(), op,
           ": the weight-gradient slot ", into->dw.sizes(), " ", into->dw.scalar_type(),
           " is not a contiguous fp32 tensor of the weight's shape ", w.sizes());
  return into;
}

}  // namespace

at::Tensor linear_weight_grad(const WeightGradSlots* slots, const at::Tensor& w, const at::Tensor& d2,
                              const at::Tensor& x2) {
  auto into = fp32_grad_slot(slots, w, d2.scalar_type() == at::kFloat && x2.scalar_type() == at::kFloat, "linear");
  if (!into) return gemm::mm(d2.t(), x2);
  gemm::mm_into(into->dw, d2.t(), x2, into->accumulate);
  return at::Tensor();
}

at::Tensor store_weight_grad(const WeightGradSlots* slots, const at::Tensor& w, const at::Tensor& g) {
  auto into = fp32_grad_slot(slots, w, g.scalar_type() == at::kFloat, "linear");
  if (!into) return g.to(w.scalar_type());
  if (into->accumulate)
    into->dw.add_(g);
  else
    into->dw.copy_(g);
  return at::Tensor();
}

namespace {

struct LinearFn : torch::autograd::Function<LinearFn> {
  // b: an optional (undefined tensors cannot be a custom function's inputs).
  static at::Tensor forward(AutogradContext* ctx, const WeightGradSlots* slots, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& b) {
    ctx->saved_data["slots"] = reinterpret_cast<int64_t>(slots);
    ctx->saved_data["x_grad"] = x.requires_grad();
    ctx->saved_data["w_grad"] = w.requires_grad();
    ctx->saved_data["b_grad"] = b.has_value() && b->requires_grad();
    ctx->save_for_backward({x, w});
    return gemm::linear(x, w, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w = s[1];
    const int64_t out = w.size(0), in = w.size(1);
    const auto d2 = dy[0].reshape({-1, out});
    at::Tensor dx, dw, db;
    if (ctx->saved_data["x_grad"].toBool()) dx = gemm::mm(d2, w).view(x.sizes());
    if (ctx->saved_data["w_grad"].toBool())
      dw = linear_weight_grad(reinterpret_cast<const WeightGradSlots*>(ctx->saved_data["slots"].toInt()), w, d2,
                              x.reshape({-1, in}));
    if (ctx->saved_data["b_grad"].toBool()) db = d2.sum(0);
    return {at::Tensor(), dx, dw, db};
  }
};

at::Tensor activation_fwd(const DeviceBackend& be, Activation act, const at::Tensor& pre) {
  switch (act) {
    case Activation::swiglu: return be.ops().swiglu_fwd(pre);
    case Activation::gelu: return be.ops().gelu_fwd(pre);
    case Activation::gelu_tanh: return be.ops().gelu_tanh_fwd(pre);
  }
  LF_FAIL("activated_linear: unknown activation ", static_cast<int>(act));
}

at::Tensor activation_bwd(const DeviceBackend& be, Activation act, const at::Tensor& dy, const at::Tensor& pre) {
  switch (act) {
    case Activation::swiglu: return be.ops().swiglu_bwd(dy, pre);
    case Activation::gelu: return be.ops().gelu_bwd(dy, pre);
    case Activation::gelu_tanh: return be.ops().gelu_tanh_bwd(dy, pre);
  }
  LF_FAIL("activated_linear: unknown activation ", static_cast<int>(act));
}

// y = rms_norm(x, g) w^T (+ b) saving x, g, rstd and w: backward recomputes the normed input for
// w's gradient and runs the norm's backward on its gradient, so the normed input never outlives
// the forward. The same kernels as rms_norm() then linear() with a sink: the same results.
struct RmsNormLinearFn : torch::autograd::Function<RmsNormLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const WeightGradSlots* slots,
                            const at::Tensor& x, const at::Tensor& g, double eps, const at::Tensor& w,
                            const std::optional<at::Tensor>& b) {
    save_backend(ctx, be);
    ctx->saved_data["slots"] = reinterpret_cast<int64_t>(slots);
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["norm_grad"] = x.requires_grad() || g.requires_grad();
    ctx->saved_data["w_grad"] = w.requires_grad();
    ctx->saved_data["b_grad"] = b.has_value() && b->requires_grad();
    auto r = be->ops().rms_norm_fwd(x, g, eps);
    ctx->save_for_backward({x, g, r.rstd, w});
    return gemm::linear(r.y, w, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &g = s[1], &rstd = s[2], &w = s[3];
    const auto& be = saved_backend(ctx);
    const int64_t out = w.size(0), in = w.size(1);
    const auto d2 = dy[0].reshape({-1, out});
    const at::Tensor normed = be.ops().rms_norm_fwd(x, g, ctx->saved_data["eps"].toDouble()).y;
    at::Tensor dw, db;
    if (ctx->saved_data["w_grad"].toBool())
      dw = linear_weight_grad(reinterpret_cast<const WeightGradSlots*>(ctx->saved_data["slots"].toInt()), w, d2,
                              normed.reshape({-1, in}));
    if (ctx->saved_data["b_grad"].toBool()) db = d2.sum(0);
    // The norm's backward whenever x or g wants a gradient (the op computes both).
    at::Tensor dx, dg;
    if (ctx->saved_data["norm_grad"].toBool()) {
      auto gn = be.ops().rms_norm_bwd(gemm::mm(d2, w).view(normed.sizes()), x, g, rstd);
      dx = gn.dx, dg = gn.dw;
    }
    return {at::Tensor(), at::Tensor(), dx, dg, at::Tensor(), dw, db};
  }
};

// y = act(pre) w^T (+ b) saving pre and w only: backward recomputes a = act(pre) for w's gradient
// and runs the activation's backward on a's gradient, so a never outlives the forward. The same
// kernels as activation() then linear(), in the same order: the results are those of the pair.
struct ActivatedLinearFn : torch::autograd::Function<ActivatedLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, int64_t act, const WeightGradSlots* slots,
                            const at::Tensor& pre, const at::Tensor& w, const std::optional<at::Tensor>& b) {
    save_backend(ctx, be);
    ctx->saved_data["act"] = act;
    ctx->saved_data["slots"] = reinterpret_cast<int64_t>(slots);
    ctx->saved_data["pre_grad"] = pre.requires_grad();
    ctx->saved_data["w_grad"] = w.requires_grad();
    ctx->saved_data["b_grad"] = b.has_value() && b->requires_grad();
    ctx->save_for_backward({pre, w});
    return gemm::linear(activation_fwd(*be, static_cast<Activation>(act), pre), w, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &pre = s[0], &w = s[1];
    const auto& be = saved_backend(ctx);
    const auto act = static_cast<Activation>(ctx->saved_data["act"].toInt());
    const int64_t out = w.size(0), in = w.size(1);
    const auto d2 = dy[0].reshape({-1, out});
    const at::Tensor a = activation_fwd(be, act, pre);
    at::Tensor dpre, dw, db;
    if (ctx->saved_data["w_grad"].toBool())
      dw = linear_weight_grad(reinterpret_cast<const WeightGradSlots*>(ctx->saved_data["slots"].toInt()), w, d2,
                              a.reshape({-1, in}));
    if (ctx->saved_data["pre_grad"].toBool())
      dpre = activation_bwd(be, act, gemm::mm(d2, w).view(a.sizes()), pre);
    if (ctx->saved_data["b_grad"].toBool()) db = d2.sum(0);
    return {at::Tensor(), at::Tensor(), at::Tensor(), dpre, dw, db};
  }
};

// The embedding's weight gradient is a scatter-add of the output gradient's rows: with a slot it
// goes there directly (the tied output layer may have written its part already), so the dense
// [rows, h] gradient never exists as a tensor of its own.
struct EmbeddingFn : torch::autograd::Function<EmbeddingFn> {
  static at::Tensor forward(AutogradContext* ctx, const WeightGradSlots* slots, const at::Tensor& w,
                            const at::Tensor& ids) {
    ctx->saved_data["slots"] = reinterpret_cast<int64_t>(slots);
    ctx->saved_data["rows"] = w.size(0);
    ctx->saved_data["w"] = w;  // for the slot lookup (by identity) and the gradient's dtype
    ctx->save_for_backward({ids});
    return at::embedding(w, ids);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    const at::Tensor ids = ctx->get_saved_variables()[0].reshape({-1});
    const at::Tensor w = ctx->saved_data["w"].toTensor();
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const at::Tensor g = dy[0].reshape({-1, dy[0].size(-1)});
    const auto* slots = reinterpret_cast<const WeightGradSlots*>(ctx->saved_data["slots"].toInt());
    // The fp32 slot takes the rows of a bf16/fp16 gradient too (converted, [tokens, h]): the dense
    // [vocab, h] gradient in the weight's dtype would otherwise be made, and added into the slot
    // through a full-size fp32 copy (at llama_100m in bf16: 48 + 96 MiB faulted in every step).
    auto into = fp32_grad_slot(slots, w, at::isFloatingType(g.scalar_type()), "embedding");
    if (into) {
      if (!into->accumulate) into->dw.zero_();
      into->dw.index_add_(0, ids, g.to(at::kFloat));
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    }
    return {at::Tensor(), at::embedding_backward(dy[0], ctx->get_saved_variables()[0], rows, -1, false, false),
            at::Tensor()};
  }
};

struct SdpaFn : torch::autograd::Function<SdpaFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, int64_t mask_kind,
                            const std::optional<at::Tensor>& mask, double scale) {
    AttentionMask m{static_cast<backend::MaskKind>(mask_kind), mask.value_or(at::Tensor())};
    auto r = be->ops().sdpa_fwd(q, k, v, m, scale);
    // The output in sequence-major memory ([b, s, nq, dv] seen as [b, nq, s, dv]), as ATen's flash
    // kernels and the CPU backend's own return it (a no-op for those): callers go back to [s, b, nq dv] or [b, s, nq dv]
    // with a view, so the input their output projection saves for backward is this storage, not a
    // second copy of it (at llama_100m, 12 x 0.75 MiB).
    const at::Tensor o = r.o.transpose(1, 2).contiguous().transpose(1, 2);
    save_backend(ctx, be);
    ctx->saved_data["mask_kind"] = mask_kind;
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q, k, v, o, r.lse, m.mask});
    return o;
  }
  static variable_list backward(AutogradContext* ctx, variable_list dout) {
    auto s = ctx->get_saved_variables();
    AttentionMask m{static_cast<backend::MaskKind>(ctx->saved_data["mask_kind"].toInt()), s[5]};
    auto g = saved_backend(ctx).ops().sdpa_bwd(dout[0], s[0], s[1], s[2], s[3], s[4], m,
                                               ctx->saved_data["scale"].toDouble());
    return {at::Tensor(), g.dq, g.dk, g.dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// o = softmax over [prefix keys | own keys] applied to [v_prefix | v]: the two parts' outputs
// weighted by exp(lse_part - lse). Backward: each part's gradient from the merged o and lse
// (the backend's sdpa_bwd contract).
struct SdpaAfterPrefixFn : torch::autograd::Function<SdpaAfterPrefixFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& q,
                            const at::Tensor& kp, const at::Tensor& vp, const at::Tensor& k,
                            const at::Tensor& v, double scale, int64_t own_kind, const std::optional<at::Tensor>& own_mask) {
    const AttentionMask own{static_cast<backend::MaskKind>(own_kind), own_mask.value_or(at::Tensor())};
    auto a = be->ops().sdpa_fwd(q, kp, vp, AttentionMask::none(), scale);
    auto b = be->ops().sdpa_fwd(q, k, v, own, scale);
    auto lse = at::logaddexp(a.lse, b.lse);  // [b, nq, s] fp32
    auto o = (a.o.to(at::kFloat) * (a.lse - lse).exp().unsqueeze(-1) +
              b.o.to(at::kFloat) * (b.lse - lse).exp().unsqueeze(-1))
                 .to(q.scalar_type());
    save_backend(ctx, be);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["own_kind"] = own_kind;
    ctx->save_for_backward({q, kp, vp, k, v, o, lse, own.mask});
    return o;
  }
  static variable_list backward(AutogradContext* ctx, variable_list dout) {
    auto s = ctx->get_saved_variables();
    const double scale = ctx->saved_data["scale"].toDouble();
    const AttentionMask own{static_cast<backend::MaskKind>(ctx->saved_data["own_kind"].toInt()), s[7]};
    const auto& ops = saved_backend(ctx).ops();
    auto a = ops.sdpa_bwd(dout[0], s[0], s[1], s[2], s[5], s[6], AttentionMask::none(), scale);
    auto b = ops.sdpa_bwd(dout[0], s[0], s[3], s[4], s[5], s[6], own, scale);
    return {at::Tensor(), a.dq + b.dq, a.dk, a.dv, b.dk, b.dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct MoePermuteFn : torch::autograd::Function<MoePermuteFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& x,
                            const at::Tensor& indices, int64_t num_experts, MoePermuted* out) {
    auto r = be->ops().moe_permute_fwd(x, indices, num_experts);
    save_backend(ctx, be);
    ctx->saved_data["tokens"] = x.size(0);
    ctx->save_for_backward({r.source});
    out->position = r.position;
    out->tokens_per_expert = r.tokens_per_expert;
    return r.permuted;
  }
  static variable_list backward(AutogradContext* ctx, variable_list d) {
    auto s = ctx->get_saved_variables();
    auto dx = saved_backend(ctx).ops().moe_permute_bwd(d[0], s[0], ctx->saved_data["tokens"].toInt());
    return {at::Tensor(), dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct MoeUnpermuteFn : torch::autograd::Function<MoeUnpermuteFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& y,
                            const at::Tensor& position, const at::Tensor& probs) {
    save_backend(ctx, be);
    ctx->save_for_backward({y, position, probs});
    return be->ops().moe_unpermute_fwd(y, position, probs);
  }
  static variable_list backward(AutogradContext* ctx, variable_list d) {
    auto s = ctx->get_saved_variables();
    auto g = saved_backend(ctx).ops().moe_unpermute_bwd(d[0], s[0], s[1], s[2]);
    return {at::Tensor(), g.dy, at::Tensor(), g.dprobs};
  }
};

struct GroupedGemmFn : torch::autograd::Function<GroupedGemmFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& x,
                            const at::Tensor& w, const at::Tensor& counts) {
    save_backend(ctx, be);
    ctx->save_for_backward({x, w, counts});
    return be->ops().grouped_gemm_fwd(x, w, counts);
  }
  static variable_list backward(AutogradContext* ctx, variable_list d) {
    auto s = ctx->get_saved_variables();
    // A frozen weight (or input) gets no gradient computed (edges count the tensor arguments: x 0, w 1).
    auto g = saved_backend(ctx).ops().grouped_gemm_bwd(
        d[0], s[0], s[1], s[2], lf::backend::GemmGrads{ctx->needs_input_grad(0), ctx->needs_input_grad(1)});
    return {at::Tensor(), g.dx, g.dw, at::Tensor()};
  }
};

struct DsaIndexerScoresFn : torch::autograd::Function<DsaIndexerScoresFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& qi, const at::Tensor& ki,
                            const at::Tensor& w, const at::Tensor& indices, double scale) {
    save_backend(ctx, be);
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({qi, ki, w, indices});
    return be->ops().dsa_indexer_scores_fwd(qi, ki, w, indices, scale);
  }
  static variable_list backward(AutogradContext* ctx, variable_list d) {
    auto s = ctx->get_saved_variables();
    auto g = saved_backend(ctx).ops().dsa_indexer_scores_bwd(d[0], s[0], s[1], s[2], s[3],
                                                              ctx->saved_data["scale"].toDouble());
    return {at::Tensor(), g.dq, g.dk, g.dw, at::Tensor(), at::Tensor()};
  }
};

struct DsaSparseAttentionFn : torch::autograd::Function<DsaSparseAttentionFn> {
  static variable_list forward(AutogradContext* ctx, const DeviceBackend* be, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& indices, double scale) {
    auto r = be->ops().dsa_sparse_attention_fwd(q, k, v, indices, scale);
    save_backend(ctx, be);
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q, k, v, indices, r.o, r.lse});
    ctx->mark_non_differentiable({r.head_prob});
    return {r.o, r.head_prob};
  }
  static variable_list backward(AutogradContext* ctx, variable_list d) {
    auto s = ctx->get_saved_variables();
    auto g = saved_backend(ctx).ops().dsa_sparse_attention_bwd(d[0], s[0], s[1], s[2], s[3], s[4], s[5],
                                                                ctx->saved_data["scale"].toDouble());
    return {at::Tensor(), g.dq, g.dk, g.dv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor dsa_indexer_topk(const DeviceBackend& be, const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                            double scale, int64_t topk) {
  RECORD_USER_SCOPE("lf::dsa_indexer_topk");
  at::NoGradGuard no_grad;
  return be.ops().dsa_indexer_topk(qi.detach(), ki.detach(), w.detach(), scale, topk);
}

at::Tensor dsa_indexer_scores(const DeviceBackend& be, const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& w,
                              const at::Tensor& indices, double scale) {
  RECORD_USER_SCOPE("lf::dsa_indexer_scores");
  return DsaIndexerScoresFn::apply(&be, qi, ki, w, indices.detach(), scale);
}

DsaAttention dsa_sparse_attention(const DeviceBackend& be, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& indices, double scale) {
  RECORD_USER_SCOPE("lf::dsa_sparse_attention");
  auto r = DsaSparseAttentionFn::apply(&be, q, k, v, indices.detach(), scale);
  return {r[0], r[1]};
}

MoePermuted moe_permute(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& indices,
                        int64_t num_experts) {
  RECORD_USER_SCOPE("lf::moe_permute");
  MoePermuted out;
  out.rows = MoePermuteFn::apply(&be, x, indices.detach(), num_experts, &out);
  return out;
}

at::Tensor moe_unpermute(const DeviceBackend& be, const at::Tensor& y, const at::Tensor& position,
                         const at::Tensor& probs) {
  RECORD_USER_SCOPE("lf::moe_unpermute");
  return MoeUnpermuteFn::apply(&be, y, position.detach(), probs);
}

at::Tensor grouped_gemm(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts) {
  RECORD_USER_SCOPE("lf::grouped_gemm");
  return GroupedGemmFn::apply(&be, x, w, counts.detach());
}

at::Tensor rms_norm(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& w,
                    double eps) {
  RECORD_USER_SCOPE("lf::rms_norm");
  return RmsNormFn::apply(&be, x, w, eps);
}

at::Tensor layer_norm(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& w,
                      const at::Tensor& b, double eps) {
  RECORD_USER_SCOPE("lf::layer_norm");
  // Optional, not undefined: custom Functions reject undefined tensor inputs.
  return LayerNormFn::apply(&be, x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt,
                            eps);
}

at::Tensor rope(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& cos,
                const at::Tensor& sin, bool interleaved) {
  RECORD_USER_SCOPE("lf::rope");
  return RopeFn::apply(&be, x, cos, sin, interleaved);
}

at::Tensor swiglu(const DeviceBackend& be, const at::Tensor& gate_up) {
  RECORD_USER_SCOPE("lf::swiglu");
  return SwigluFn::apply(&be, gate_up);
}

at::Tensor gelu(const DeviceBackend& be, const at::Tensor& x) {
  RECORD_USER_SCOPE("lf::gelu");
  return GeluFn::apply(&be, x);
}

at::Tensor gelu_tanh(const DeviceBackend& be, const at::Tensor& x) {
  RECORD_USER_SCOPE("lf::gelu_tanh");
  return GeluTanhFn::apply(&be, x);
}

at::Tensor embedding(const at::Tensor& w, const at::Tensor& ids, const WeightGradSlots* slots) {
  // CPU only: CUDA's index_add_ accumulates with atomics (run-to-run different sums), where its
  // embedding backward is deterministic.
  if (slots == nullptr || !at::GradMode::is_enabled() || !w.requires_grad() || !w.device().is_cpu())
    return at::embedding(w, ids);
  return EmbeddingFn::apply(slots, w, ids);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const WeightGradSlots* slots) {
  if (slots == nullptr || !at::GradMode::is_enabled() || !w.requires_grad()) return at::linear(x, w, b);
  return LinearFn::apply(slots, x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
}

at::Tensor activation(const DeviceBackend& be, Activation act, const at::Tensor& pre) {
  switch (act) {
    case Activation::swiglu: return swiglu(be, pre);
    case Activation::gelu: return gelu(be, pre);
    case Activation::gelu_tanh: return gelu_tanh(be, pre);
  }
  LF_FAIL("activation: unknown activation ", static_cast<int>(act));
}

at::Tensor activated_linear(const DeviceBackend& be, Activation act, const at::Tensor& pre, const at::Tensor& w,
                            const at::Tensor& b, const WeightGradSlots* slots) {
  if (!at::GradMode::is_enabled() || !(pre.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad())))
    return linear(activation(be, act, pre), w, b, slots);
  RECORD_USER_SCOPE("lf::activated_linear");
  return ActivatedLinearFn::apply(&be, static_cast<int64_t>(act), slots, pre, w,
                                  b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
}

at::Tensor rms_norm_linear(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& g, double eps,
                           const at::Tensor& w, const at::Tensor& b, const WeightGradSlots* slots) {
  if (!at::GradMode::is_enabled() ||
      !(x.requires_grad() || g.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad())))
    return linear(rms_norm(be, x, g, eps), w, b, slots);
  RECORD_USER_SCOPE("lf::rms_norm_linear");
  return RmsNormLinearFn::apply(&be, slots, x, g, eps, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
}

at::Tensor geglu_tanh(const DeviceBackend& be, const at::Tensor& gate, const at::Tensor& up) {
  RECORD_USER_SCOPE("lf::geglu_tanh");
  return GegluTanhFn::apply(&be, gate, up);
}

at::Tensor softmax_cross_entropy(const DeviceBackend& be, const at::Tensor& logits,
                                 const at::Tensor& target, int64_t ignore_index) {
  RECORD_USER_SCOPE("lf::cross_entropy");
  return CrossEntropyFn::apply(&be, logits, target, ignore_index);
}

at::Tensor linear_cross_entropy_sum(const DeviceBackend& be, const at::Tensor& x, const at::Tensor& w,
                                    const at::Tensor& target, const at::Tensor& weight,
                                    const lf::backend::VocabShard& shard, int64_t ignore_index,
                                    int64_t chunk_tokens, const lf::backend::GradInto* into) {
  RECORD_USER_SCOPE("lf::linear_cross_entropy");
  return LinearCrossEntropyFn::apply(&be, x, w, target, weight.detach(), &shard, ignore_index, chunk_tokens, into);
}

at::Tensor sdpa(const DeviceBackend& be, const at::Tensor& q, const at::Tensor& k,
                const at::Tensor& v, const AttentionMask& mask, std::optional<double> scale) {
  RECORD_USER_SCOPE("lf::sdpa");
  LF_CHECK(q.dim() == 4, "sdpa: q must be [b, nq, s, d]; got ", q.sizes());
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  // The explicit mask is passed detached: masks are inputs, not parameters.
  auto m = mask.mask.defined() ? std::optional<at::Tensor>(mask.mask.detach()) : std::nullopt;
  return SdpaFn::apply(&be, q, k, v, static_cast<int64_t>(mask.kind), m, sc);
}

at::Tensor sdpa_after_prefix(const DeviceBackend& be, const at::Tensor& q, const at::Tensor& k_prefix,
                             const at::Tensor& v_prefix, const at::Tensor& k, const at::Tensor& v,
                             std::optional<double> scale) {
  RECORD_USER_SCOPE("lf::sdpa");
  LF_CHECK(q.dim() == 4 && k.dim() == 4 && k_prefix.dim() == 4, "sdpa_after_prefix: q, k and k_prefix must be 4-d, got ",
           q.sizes(), ", ", k.sizes(), ", ", k_prefix.sizes());
  LF_CHECK(k.size(2) == q.size(2), "sdpa_after_prefix: the chunk's own keys (", k.size(2),
           ") must match its queries (", q.size(2), ")");
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  return SdpaAfterPrefixFn::apply(&be, q, k_prefix, v_prefix, k, v, sc, static_cast<int64_t>(backend::MaskKind::causal),
                                  std::nullopt);
}

at::Tensor sdpa_after_prefix(const DeviceBackend& be, const at::Tensor& q, const at::Tensor& k_prefix,
                             const at::Tensor& v_prefix, const at::Tensor& k, const at::Tensor& v, double scale,
                             const AttentionMask& own) {
  RECORD_USER_SCOPE("lf::sdpa");
  LF_CHECK(q.dim() == 4 && k.dim() == 4 && k_prefix.dim() == 4, "sdpa_after_prefix: q, k and k_prefix must be 4-d, got ",
           q.sizes(), ", ", k.sizes(), ", ", k_prefix.sizes());
  return SdpaAfterPrefixFn::apply(&be, q, k_prefix, v_prefix, k, v, scale, static_cast<int64_t>(own.kind),
                                  own.mask.defined() ? std::optional<at::Tensor>(own.mask) : std::nullopt);
}

}  // namespace lf::ops

// The reference op math (backend/reference_ops.h). Every formula is written out, forward and
// backward, in fp32 (fp64 stays fp64), so that it reads as the specification other backends
// are held to. Device-agnostic: the CUDA backend runs it on CUDA tensors.
#include "loongforge/backend/reference_ops.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>
#include <limits>

#include "loongforge/core/error.h"

namespace lf::backend {
namespace {

// fp64 stays fp64 (finite-difference checks); everything else computes in fp32.
at::ScalarType compute_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::string shape_str(const at::Tensor& t) {
  return t.defined() ? lf::str(t.sizes()) : std::string("(undefined)");
}

// Sums a [.., h] tensor over every leading dim -> [h].
at::Tensor sum_leading(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}).sum(0); }

// The RoPE rotation R with y = x * cos + R(x) * sin. R^T = -R for both layouts.
//   halves:      R([x1, x2]) = [-x2, x1]
//   interleaved: R(.., x[2i], x[2i+1], ..) = (.., -x[2i+1], x[2i], ..)
at::Tensor rope_rotate(const at::Tensor& x, bool interleaved) {
  const int64_t r = x.size(-1);
  if (!interleaved) {
    auto x1 = x.narrow(-1, 0, r / 2);
    auto x2 = x.narrow(-1, r / 2, r / 2);
    return at::cat({-x2, x1}, -1);
  }
  auto pairs = x.unflatten(-1, {r / 2, 2});  // [.., r/2, 2]
  return at::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
}

// x, cos, sin in the compute type; x: [s, b, n, d], cos/sin: [s, r].
// sign = +1: forward, y = x c + R(x) s.  sign = -1: backward, dx = dy c + R^T(dy s).
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      bool interleaved, bool transpose) {
  const int64_t s = x.size(0), d = x.size(3), r = cos.size(1);
  auto c = cos.view({s, 1, 1, r});
  auto sn = sin.view({s, 1, 1, r});
  auto xr = x.narrow(-1, 0, r);
  auto yr = transpose ? xr * c - rope_rotate(xr * sn, interleaved)
                      : xr * c + rope_rotate(xr, interleaved) * sn;
  if (r == d) return yr;
  return at::cat({yr, x.narrow(-1, r, d - r)}, -1);
}

// Keep-mask of causal attention aligned bottom-right: query i sees key j iff j <= i + t - s.
at::Tensor causal_keep(int64_t s, int64_t t, const at::Device& device) {
  return at::ones({s, t}, at::TensorOptions().dtype(at::kBool).device(device)).tril(t - s);
}

// scores: [b, nq, s, t] in the compute type -> masked scores.
at::Tensor apply_mask(const at::Tensor& scores, const AttentionMask& mask) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  switch (mask.kind) {
    case MaskKind::none:
      return scores;
    case MaskKind::causal:
      return scores.masked_fill(causal_keep(scores.size(2), scores.size(3), scores.device())
                                    .logical_not(),
                                neg_inf);
    case MaskKind::explicit_bool:
      return scores.masked_fill(mask.mask.logical_not(), neg_inf);
    case MaskKind::explicit_additive:
      return scores + mask.mask.to(scores.scalar_type());
  }
  LF_FAIL("unknown attention mask kind ", static_cast<int>(mask.kind));
}

// k: [b, nkv, t, d] -> [b, nq, t, d]; query head h reads kv head h / group.
at::Tensor expand_kv(const at::Tensor& k, int64_t group) {
  return group == 1 ? k : k.repeat_interleave(group, 1);
}
// dk: [b, nq, t, d] -> [b, nkv, t, d], summing each kv head's group (the dual of expand_kv).
at::Tensor reduce_kv(const at::Tensor& dk, int64_t group) {
  if (group == 1) return dk;
  const auto b = dk.size(0), nq = dk.size(1), t = dk.size(2), d = dk.size(3);
  return dk.view({b, nq / group, group, t, d}).sum(2);
}

// Softmax probabilities of masked scores given their logsumexp; rows with lse = -inf (no key
// visible) give p = 0 instead of NaN.
at::Tensor probs_from_lse(const at::Tensor& scores, const at::Tensor& lse) {
  auto safe = at::where(at::isinf(lse), at::zeros_like(lse), lse);
  return at::exp(scores - safe.unsqueeze(-1));
}

}  // namespace

const char* to_string(MaskKind kind) {
  switch (kind) {
    case MaskKind::none: return "none";
    case MaskKind::causal: return "causal";
    case MaskKind::explicit_bool: return "explicit_bool";
    case MaskKind::explicit_additive: return "explicit_additive";
  }
  return "?";
}

// ---- argument checks (shared by every backend) -------------------------------------------

void check_rms_norm_args(const at::Tensor& x, const at::Tensor& w) {
  LF_CHECK(x.defined() && w.defined() && x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(-1),
           "norm: x must be [.., h] and w [h]; got x ", shape_str(x), ", w ", shape_str(w),
           lf::hint("the weight's length must equal the last dim of x"));
}

void check_rope_args(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  LF_CHECK(x.dim() == 4, "rope: x must be [s, b, n, d]; got ", shape_str(x));
  LF_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(0) == x.size(0) &&
               cos.size(1) <= x.size(3) && cos.size(1) % 2 == 0,
           "rope: cos and sin must be [s, r] with r even and r <= d; got x ", shape_str(x),
           ", cos ", shape_str(cos), ", sin ", shape_str(sin),
           lf::hint("slice cos/sin to the sequence positions of x; r = rotary dims"));
}

void check_geglu_args(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& dy) {
  LF_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type() && gate.device() == up.device(),
           "geglu: gate ", shape_str(gate), " ", gate.scalar_type(), " and up ", shape_str(up), " ", up.scalar_type(),
           " must have one shape, dtype and device");
  LF_CHECK(!dy.defined() || dy.sizes() == gate.sizes(), "geglu_bwd: dy ", shape_str(dy), " must have gate's shape ",
           shape_str(gate));
}

void check_swiglu_args(const at::Tensor& gate_up) {
  LF_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0,
           "swiglu: gate_up must be [.., 2f]; got ", shape_str(gate_up),
           lf::hint("concatenate gate and up projections along the last dim"));
}

void check_cross_entropy_args(const at::Tensor& logits, const at::Tensor& target) {
  LF_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0),
           "softmax_cross_entropy: logits must be [n, v] and target [n]; got logits ",
           shape_str(logits), ", target ", shape_str(target),
           lf::hint("flatten [s, b, v] logits to [s*b, v]"));
  LF_CHECK(target.scalar_type() == at::kLong, "softmax_cross_entropy: target must be int64, got ",
           target.scalar_type());
}

void check_sdpa_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionMask& mask) {
  LF_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
           "sdpa: q, k, v must be [b, heads, seq, d]; got q ", shape_str(q), ", k ", shape_str(k),
           ", v ", shape_str(v));
  LF_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(3) == q.size(3) &&
               k.size(1) == v.size(1) && k.size(2) == v.size(2),
           "sdpa: shapes disagree: q ", shape_str(q), ", k ", shape_str(k), ", v ", shape_str(v));
  LF_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0,
           "sdpa: query heads must be a multiple of kv heads (GQA); got nq = ", q.size(1),
           ", nkv = ", k.size(1));
  const bool is_explicit =
      mask.kind == MaskKind::explicit_bool || mask.kind == MaskKind::explicit_additive;
  LF_CHECK(is_explicit == mask.mask.defined(), "sdpa: mask kind ", to_string(mask.kind),
           (is_explicit ? " needs" : " takes no"), " mask tensor",
           lf::hint("use AttentionMask::boolean(m) / additive(m) / causal() / none()"));
  if (is_explicit) {
    const auto& m = mask.mask;
    LF_CHECK(m.dim() == 4 && (m.size(0) == 1 || m.size(0) == q.size(0)) &&
                 (m.size(1) == 1 || m.size(1) == q.size(1)) && m.size(2) == q.size(2) &&
                 m.size(3) == k.size(2),
             "sdpa: mask must be [b|1, nq|1, s, t] = [", q.size(0), "|1, ", q.size(1), "|1, ",
             q.size(2), ", ", k.size(2), "]; got ", shape_str(m));
    LF_CHECK((mask.kind == MaskKind::explicit_bool) == (m.scalar_type() == at::kBool),
             "sdpa: mask kind ", to_string(mask.kind), " does not match its dtype ",
             m.scalar_type());
  }
}

// ---- RMSNorm ---------------------------------------------------------------------------------

RmsNormFwd ReferenceOps::rms_norm_fwd(const at::Tensor& x, const at::Tensor& w,
                                      double eps) const {
  check_rms_norm_args(x, w);
  const auto ct = compute_type(x);
  auto xf = x.to(ct);
  auto rstd = at::rsqrt(xf.square().mean(-1) + eps);                   // [..]
  auto y = xf * rstd.unsqueeze(-1) * w.to(ct);                          // [.., h]
  return {y.to(x.scalar_type()).contiguous(), rstd.contiguous()};
}

// With xhat = x * rstd and g = dy * w:  dx = rstd * (g - xhat * mean(g * xhat)),
// dw = sum over rows of dy * xhat.
RmsNormBwd ReferenceOps::rms_norm_bwd(const at::Tensor& dy, const at::Tensor& x,
                                      const at::Tensor& w, const at::Tensor& rstd) const {
  check_rms_norm_args(x, w);
  const auto ct = compute_type(x);
  auto r = rstd.to(ct).unsqueeze(-1);
  auto xhat = x.to(ct) * r;
  auto dyf = dy.to(ct);
  auto g = dyf * w.to(ct);
  auto dx = r * (g - xhat * (g * xhat).mean(-1, true));
  auto dw = sum_leading(dyf * xhat);
  return {dx.to(x.scalar_type()).contiguous(), dw.to(w.scalar_type()).contiguous()};
}

// ---- LayerNorm -------------------------------------------------------------------------------

LayerNormFwd ReferenceOps::layer_norm_fwd(const at::Tensor& x, const at::Tensor& w,
                                          const at::Tensor& b, double eps) const {
  check_rms_norm_args(x, w);
  LF_CHECK(!b.defined() || b.sizes() == w.sizes(), "layer_norm: bias must be [h] like w; got ",
           shape_str(b), " vs ", shape_str(w));
  const auto ct = compute_type(x);
  auto xf = x.to(ct);
  auto mean = xf.mean(-1);                                              // [..]
  auto xc = xf - mean.unsqueeze(-1);
  auto rstd = at::rsqrt(xc.square().mean(-1) + eps);                    // biased variance
  auto y = xc * rstd.unsqueeze(-1) * w.to(ct);
  if (b.defined()) y = y + b.to(ct);
  return {y.to(x.scalar_type()).contiguous(), mean.contiguous(), rstd.contiguous()};
}

// With xhat = (x - mean) * rstd and g = dy * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), dw = sum dy * xhat, db = sum dy.
LayerNormBwd ReferenceOps::layer_norm_bwd(const at::Tensor& dy, const at::Tensor& x,
                                          const at::Tensor& w, bool has_bias,
                                          const at::Tensor& mean, const at::Tensor& rstd) const {
  check_rms_norm_args(x, w);
  const auto ct = compute_type(x);
  auto r = rstd.to(ct).unsqueeze(-1);
  auto xhat = (x.to(ct) - mean.to(ct).unsqueeze(-1)) * r;
  auto dyf = dy.to(ct);
  auto g = dyf * w.to(ct);
  auto dx = r * (g - g.mean(-1, true) - xhat * (g * xhat).mean(-1, true));
  LayerNormBwd out;
  out.dx = dx.to(x.scalar_type()).contiguous();
  out.dw = sum_leading(dyf * xhat).to(w.scalar_type()).contiguous();
  if (has_bias) out.db = sum_leading(dyf).to(w.scalar_type()).contiguous();
  return out;
}

// ---- RoPE ------------------------------------------------------------------------------------

at::Tensor ReferenceOps::rope_fwd(const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin, bool interleaved) const {
  check_rope_args(x, cos, sin);
  const auto ct = compute_type(x);
  return rope_apply(x.to(ct), cos.to(ct), sin.to(ct), interleaved, /*transpose=*/false)
      .to(x.scalar_type())
      .contiguous();
}

at::Tensor ReferenceOps::rope_bwd(const at::Tensor& dy, const at::Tensor& cos,
                                  const at::Tensor& sin, bool interleaved) const {
  check_rope_args(dy, cos, sin);
  const auto ct = compute_type(dy);
  return rope_apply(dy.to(ct), cos.to(ct), sin.to(ct), interleaved, /*transpose=*/true)
      .to(dy.scalar_type())
      .contiguous();
}

// ---- SwiGLU ----------------------------------------------------------------------------------

at::Tensor ReferenceOps::swiglu_fwd(const at::Tensor& gate_up) const {
  check_swiglu_args(gate_up);
  const auto ct = compute_type(gate_up);
  const int64_t f = gate_up.size(-1) / 2;
  auto g = gate_up.narrow(-1, 0, f).to(ct);
  auto u = gate_up.narrow(-1, f, f).to(ct);
  return (g * at::sigmoid(g) * u).to(gate_up.scalar_type()).contiguous();
}

// silu'(g) = sig(g) * (1 + g * (1 - sig(g))); dgate = dy * u * silu'(g), dup = dy * silu(g).
at::Tensor ReferenceOps::swiglu_bwd(const at::Tensor& dy, const at::Tensor& gate_up) const {
  check_swiglu_args(gate_up);
  const auto ct = compute_type(gate_up);
  const int64_t f = gate_up.size(-1) / 2;
  auto g = gate_up.narrow(-1, 0, f).to(ct);
  auto u = gate_up.narrow(-1, f, f).to(ct);
  auto dyf = dy.to(ct);
  auto sig = at::sigmoid(g);
  auto dgate = dyf * u * sig * (1 + g * (1 - sig));
  auto dup = dyf * g * sig;
  return at::cat({dgate, dup}, -1).to(gate_up.scalar_type()).contiguous();
}

// ---- GELU (erf form) ---------------------------------------------------------------------------

at::Tensor ReferenceOps::gelu_fwd(const at::Tensor& x) const {
  const auto ct = compute_type(x);
  auto xf = x.to(ct);
  return (xf * 0.5 * (1 + at::erf(xf * M_SQRT1_2))).to(x.scalar_type()).contiguous();
}

// d/dx [x Phi(x)] = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
at::Tensor ReferenceOps::gelu_bwd(const at::Tensor& dy, const at::Tensor& x) const {
  LF_CHECK(dy.sizes() == x.sizes(), "gelu_bwd: dy ", shape_str(dy), " and x ", shape_str(x),
           " must have the same shape");
  const auto ct = compute_type(x);
  auto xf = x.to(ct);
  auto cdf = 0.5 * (1 + at::erf(xf * M_SQRT1_2));
  auto pdf = at::exp(-0.5 * xf * xf) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
  return (dy.to(ct) * (cdf + xf * pdf)).to(x.scalar_type()).contiguous();
}

// ---- GELU (tanh form) ------------------------------------------------------------------------
// ATen's own kernel (one pass on any device, bf16 computed in fp32 and rounded once, as the
// conventions ask) rather than the formula in ~8 ATen ops with fp32 temporaries: on CUDA (and for
// Wan's video-sized FFNs) that would cost several full-size copies. The finite-difference test
// holds it to the formula.

at::Tensor ReferenceOps::gelu_tanh_fwd(const at::Tensor& x) const { return at::gelu(x, "tanh").contiguous(); }

at::Tensor ReferenceOps::gelu_tanh_bwd(const at::Tensor& dy, const at::Tensor& x) const {
  LF_CHECK(dy.sizes() == x.sizes(), "gelu_tanh_bwd: dy ", shape_str(dy), " and x ", shape_str(x),
           " must have the same shape");
  return at::gelu_backward(dy.to(x.scalar_type()), x, "tanh").contiguous();
}

// ---- GeGLU (tanh form) -----------------------------------------------------------------------
// ATen's gelu kernels in the compute type (bf16 rounded once at the end).

at::Tensor ReferenceOps::geglu_tanh_fwd(const at::Tensor& gate, const at::Tensor& up) const {
  check_geglu_args(gate, up);
  const auto ct = compute_type(gate);
  return (at::gelu(gate.to(ct), "tanh") * up.to(ct)).to(gate.scalar_type()).contiguous();
}

GatedBwd ReferenceOps::geglu_tanh_bwd(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up) const {
  check_geglu_args(gate, up, dy);
  const auto ct = compute_type(gate);
  auto g = gate.to(ct), u = up.to(ct), d = dy.to(ct);
  return {at::gelu_backward(d * u, g, "tanh").to(gate.scalar_type()).contiguous(),
          (d * at::gelu(g, "tanh")).to(up.scalar_type()).contiguous()};
}

// ---- softmax cross-entropy -------------------------------------------------------------------

CrossEntropyFwd ReferenceOps::softmax_cross_entropy_fwd(const at::Tensor& logits,
                                                        const at::Tensor& target,
                                                        int64_t ignore_index) const {
  check_cross_entropy_args(logits, target);
  const auto ct = compute_type(logits);
  const int64_t v = logits.size(1);
  auto lf = logits.to(ct);
  auto valid = target.ne(ignore_index);
  auto safe_target = at::where(valid, target, at::zeros_like(target));
  if (logits.device().is_cpu() && target.numel() > 0) {
    // On the CPU an out-of-range target would only show as a gather error without the value.
    const bool in_range = safe_target.ge(0).logical_and(safe_target.lt(v)).all().item<bool>();
    LF_CHECK(in_range, "softmax_cross_entropy: a target is outside [0, ", v,
             ") and is not ignore_index = ", ignore_index,
             lf::hint("check the tokenizer's vocabulary size against the model's"));
  }
  auto lse = at::logsumexp(lf, {1});                                     // [n]
  auto picked = lf.gather(1, safe_target.unsqueeze(1)).squeeze(1);      // [n]
  auto loss = at::where(valid, lse - picked, at::zeros_like(lse));
  return {loss.contiguous(), lse.contiguous()};
}

// dlogits = dloss * (softmax(logits) - onehot(target)); 0 on ignored rows.
at::Tensor ReferenceOps::softmax_cross_entropy_bwd(const at::Tensor& dloss,
                                                   const at::Tensor& logits,
                                                   const at::Tensor& target,
                                                   const at::Tensor& lse,
                                                   int64_t ignore_index) const {
  check_cross_entropy_args(logits, target);
  const auto ct = compute_type(logits);
  auto valid = target.ne(ignore_index);
  auto safe_target = at::where(valid, target, at::zeros_like(target));
  auto p = at::exp(logits.to(ct) - lse.to(ct).unsqueeze(1));            // [n, v]
  p.scatter_add_(1, safe_target.unsqueeze(1), at::full({p.size(0), 1}, -1.0, p.options()));
  auto scale = at::where(valid, dloss.to(ct), at::zeros_like(lse, p.options()));
  return (p * scale.unsqueeze(1)).to(logits.scalar_type()).contiguous();
}

// ---- scaled-dot-product attention ------------------------------------------------------------

SdpaFwd ReferenceOps::sdpa_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const AttentionMask& mask, double scale) const {
  check_sdpa_args(q, k, v, mask);
  const auto ct = compute_type(q);
  const int64_t group = q.size(1) / k.size(1);
  auto kf = expand_kv(k.to(ct), group);                                 // [b, nq, t, d]
  auto vf = expand_kv(v.to(ct), group);                                 // [b, nq, t, dv]
  auto scores = apply_mask(at::matmul(q.to(ct), kf.transpose(-2, -1)) * scale, mask);
  auto lse = at::logsumexp(scores, {-1});                               // [b, nq, s]
  auto o = at::matmul(probs_from_lse(scores, lse), vf);                 // [b, nq, s, dv]
  return {o.to(q.scalar_type()).contiguous(), lse.contiguous()};
}

// With P = softmax(S), S = scale * q k^T (+ mask):  dv = P^T do,  dP = do v^T,
// dS = P * (dP - D),  dq = scale * dS k,  dk = scale * dS^T q; GQA sums dk and dv over each kv
// group. D = rowsum(do * o) (= rowsum(P * dP) when o is this block's own output): taken from the
// given o, as FlashAttention does, so that o and lse of a larger attention this block is part of
// give this block's share of the gradient (op_table.h; lf::ops::sdpa_after_prefix).
SdpaBwd ReferenceOps::sdpa_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse,
                               const AttentionMask& mask, double scale) const {
  check_sdpa_args(q, k, v, mask);
  const auto ct = compute_type(q);
  const int64_t group = q.size(1) / k.size(1);
  auto qf = q.to(ct);
  auto kf = expand_kv(k.to(ct), group);
  auto vf = expand_kv(v.to(ct), group);
  auto dof = dout.to(ct);
  auto scores = apply_mask(at::matmul(qf, kf.transpose(-2, -1)) * scale, mask);
  auto p = probs_from_lse(scores, lse.to(ct));                          // [b, nq, s, t]
  auto dv = at::matmul(p.transpose(-2, -1), dof);                       // [b, nq, t, dv]
  auto dp = at::matmul(dof, vf.transpose(-2, -1));                      // [b, nq, s, t]
  auto ds = p * (dp - (dof * o.to(ct)).sum(-1, true));
  auto dq = at::matmul(ds, kf) * scale;
  auto dk = at::matmul(ds.transpose(-2, -1), qf) * scale;
  return {dq.to(q.scalar_type()).contiguous(),
          reduce_kv(dk, group).to(k.scalar_type()).contiguous(),
          reduce_kv(dv, group).to(v.scalar_type()).contiguous()};
}

// ---- AdamW -----------------------------------------------------------------------------------

void ReferenceOps::adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avg,
                              at::TensorList exp_avg_sq, const AdamWHyper& h) const {
  LF_CHECK(grads.size() == params.size() && exp_avg.size() == params.size() &&
               exp_avg_sq.size() == params.size(),
           "adamw_step: list lengths differ: params ", params.size(), ", grads ", grads.size(),
           ", exp_avg ", exp_avg.size(), ", exp_avg_sq ", exp_avg_sq.size());
  LF_CHECK(h.step >= 1, "adamw_step: step must be >= 1 (1-based), got ", h.step);
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, static_cast<double>(h.step)));
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i], m = exp_avg[i], v = exp_avg_sq[i];
    LF_CHECK(p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble,
             "adamw_step: param ", i, " must be an fp32 master weight, got ", p.scalar_type(),
             lf::hint("keep bf16 model weights separate from fp32 master copies"));
    LF_CHECK(grads[i].sizes() == p.sizes() && m.sizes() == p.sizes() && v.sizes() == p.sizes(),
             "adamw_step: tensor ", i, " shapes differ: param ", shape_str(p), ", grad ",
             shape_str(grads[i]), ", exp_avg ", shape_str(m), ", exp_avg_sq ", shape_str(v));
    auto g = grads[i].to(p.scalar_type());
    if (h.grad_scale != 1.0) g = g * h.grad_scale;
    if (h.weight_decay != 0) p.mul_(1.0 - h.lr * h.weight_decay);  // decoupled decay first
    m.mul_(h.beta1).add_(g, 1.0 - h.beta1);
    v.mul_(h.beta2).addcmul_(g, g, 1.0 - h.beta2);
    auto denom = (v.sqrt() / bc2_sqrt).add_(h.eps);
    p.addcdiv_(m, denom, -h.lr / bc1);
  }
}

}  // namespace lf::backend

#include "loongforge/models/blocks/mla.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <memory>

#include "loongforge/backend/fp8.h"
#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/models/blocks/moe.h"
#include "loongforge/models/recompute.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {

MlaAttention::MlaAttention(ParamBuilder& b, const std::string& prefix, const MlaConfig& c) : c_(c) {
  const int64_t h = c.hidden_size, nq = c.num_heads, dq = c.qk_head_dim, dr = c.qk_pos_emb_head_dim,
                dv = c.v_head_dim;
  LF_CHECK(nq > 0 && dq > 0 && dr > 0 && dr % 2 == 0 && dv > 0 && c.kv_lora_rank > 0, "MLA ", prefix,
           ": heads, qk_head_dim, v_head_dim, kv_lora_rank must be positive and qk_pos_emb_head_dim even, got ", nq,
           ", ", dq, ", ", dv, ", ", c.kv_lora_rank, ", ", dr);
  // The down projections and the latent norms act on every TP rank's heads' behalf: replicated.
  // Their output gradients are summed over TP where they leave them (forward), so their gradients
  // are whole on every rank, never summed again.
  constexpr auto whole = ParamBuilder::TpGrad::whole;
  if (c.q_lora_rank > 0) {
    q_down_ = b.add(prefix + ".linear_q_down_proj.weight", b.normal({c.q_lora_rank, h}, c.init_std),
                    Sharding::replicated(), false, whole);
    q_norm_ = b.add(prefix + ".q_layernorm.weight", at::ones({c.q_lora_rank}), Sharding::replicated(), true, whole);
    q_up_ = b.add(prefix + ".linear_q_up_proj.weight", b.normal({nq * (dq + dr), c.q_lora_rank}, c.init_std),
                  Sharding::along(0), false);
  } else {
    q_ = b.add(prefix + ".linear_q_proj.weight", b.normal({nq * (dq + dr), h}, c.init_std), Sharding::along(0), false);
  }
  kv_down_ = b.add(prefix + ".linear_kv_down_proj.weight", b.normal({c.kv_lora_rank + dr, h}, c.init_std),
                   Sharding::replicated(), false, whole);
  kv_norm_ = b.add(prefix + ".kv_layernorm.weight", at::ones({c.kv_lora_rank}), Sharding::replicated(), true, whole);
  kv_up_ = b.add(prefix + ".linear_kv_up_proj.weight", b.normal({nq * (dq + dv), c.kv_lora_rank}, c.init_std),
                 Sharding::along(0), false);
  proj_ = b.add(prefix + ".linear_proj.weight", b.normal({h, nq * dv}, c.out_std), Sharding::along(1), false);
  if (c.dsa.on) {
    const int64_t nh = c.dsa.n_heads, di = c.dsa.head_dim;
    LF_CHECK(c.q_lora_rank > 0 && nh > 0 && di >= dr && c.dsa.topk > 0, "DSA ", prefix,
             ": the indexer reads the query latent (q_lora_rank > 0) and needs heads, a head size >= ",
             "qk_pos_emb_head_dim and a positive top-k; got q_lora_rank ", c.q_lora_rank, ", heads ", nh,
             ", head size ", di, ", top-k ", c.dsa.topk);
    // Replicated (TP is refused with DSA by the decoder's checks); the norm without weight decay.
    const std::string ix = prefix + ".indexer";
    idx_wq_ = b.add(ix + ".linear_wq_b.weight", b.normal({nh * di, c.q_lora_rank}, c.init_std), Sharding::replicated(),
                    false);
    idx_wk_ = b.add(ix + ".linear_wk.weight", b.normal({di, h}, c.init_std), Sharding::replicated(), false);
    idx_norm_w_ = b.add(ix + ".k_norm.weight", at::ones({di}), Sharding::replicated(), true);
    idx_norm_b_ = b.add(ix + ".k_norm.bias", at::zeros({di}), Sharding::replicated(), true);
    idx_wproj_ = b.add(ix + ".linear_weights_proj.weight", b.normal({nh, h}, c.init_std), Sharding::replicated(), false);
  }
}

MlaAttention::IndexerOut MlaAttention::indexer(const lf::backend::DeviceBackend& be, const at::Tensor& xf,
                                               const at::Tensor& qr, const AttentionInputs& in,
                                               const lf::ops::Fp8Recipe* fp8) const {
  const int64_t s = xf.size(0), b = xf.size(1), nh = c_.dsa.n_heads, di = c_.dsa.head_dim,
                dr = c_.qk_pos_emb_head_dim;
  // Its three projections in FP8 when the policy chooses the qkv GEMMs (replicated: whole operands).
  auto linear = [fp8](const at::Tensor& x, const at::Tensor& w) {
    return fp8 ? lf::ops::fp8_linear(x, w, {}, *fp8, nullptr, nullptr) : at::matmul(x, w.t());
  };
  auto qi = linear(qr, idx_wq_).view({s, b, nh, di});
  // DeepSeek's indexer key: LayerNorm with eps 1e-6 (HF and the reference code fix it).
  auto ki = lf::ops::layer_norm(be, linear(xf, idx_wk_), idx_norm_w_, idx_norm_b_, 1e-6).unsqueeze(2);
  if (in.cos.defined()) {
    // The indexer rotates halves of its first dr dims; the interleaved tables repeat each
    // frequency twice in a row, the halves tables [f; f].
    auto halves = [&](const at::Tensor& t) {
      if (!c_.rotary_interleaved) return t;
      auto f = t.slice(-1, 0, dr, 2);
      return at::cat({f, f}, -1);
    };
    const auto cos = halves(in.cos), sin = halves(in.sin);
    auto rot = [&](const at::Tensor& x) {
      return at::cat({apply_rope(be, x.narrow(-1, 0, dr), cos, sin, false), x.narrow(-1, dr, di - dr)}, -1);
    };
    qi = rot(qi);
    ki = rot(ki);
  }
  auto w = linear(xf, idx_wproj_) * (1.0 / std::sqrt(static_cast<double>(nh)));  // [s, b, nh]
  return {qi.transpose(0, 1).contiguous(), ki.squeeze(2).transpose(0, 1).contiguous(), w.transpose(0, 1).contiguous(),
          1.0 / std::sqrt(static_cast<double>(di))};
}

namespace {
// Warm-up: every causal key selected, [b, s, t] (key j <= i + t - s, else -1): the sparse
// attention is dense.
at::Tensor all_causal_keys(int64_t b, int64_t s, int64_t t, const at::TensorOptions& o) {
  auto j = at::arange(t, o.dtype(at::kLong)).unsqueeze(0), i = at::arange(s, o.dtype(at::kLong)).unsqueeze(1);
  return at::where(j.le(i + (t - s)), j.expand({s, t}), at::full({s, t}, -1, o.dtype(at::kLong)))
      .unsqueeze(0)
      .expand({b, s, t})
      .contiguous();
}
}  // namespace

at::Tensor MlaAttention::indexer_loss(const lf::backend::DeviceBackend& be, const IndexerOut& ix,
                                      const at::Tensor& indices, const at::Tensor& head_prob) const {
  // KL(p || q) per query over the selected keys, p: the attention's probabilities summed over the
  // heads and L1-normalised (no gradient), q: the softmax of the indexer's scores; the mean over
  // queries times the coefficient (Megatron's compute_dsa_indexer_loss).
  auto valid = indices.ge(0);
  auto logq = at::log_softmax(lf::ops::dsa_indexer_scores(be, ix.qi, ix.ki, ix.w, indices, ix.scale), -1)
                  .masked_fill(valid.logical_not(), 0.0);
  auto p = head_prob / head_prob.sum(-1, true).clamp_min(1e-30);
  auto kl = (p * (at::log(p.clamp_min(1e-10)) - logq)).masked_fill(valid.logical_not(), 0.0).sum(-1);
  return kl.mean() * c_.dsa.loss_coeff;
}

at::Tensor MlaAttention::forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp,
                                 const at::Tensor& x, const AttentionInputs& in, size_t i, MoeStep* step,
                                 bool training, const lf::ops::Fp8Policy* fp8) const {
  const int64_t nq = c_.num_heads / tp.size(), dq = c_.qk_head_dim, dr = c_.qk_pos_emb_head_dim,
                dv = c_.v_head_dim;
  const int64_t tokens = x.size(0) * x.size(1) * (tp.sequence_parallel ? tp.size() : 1);  // this rank's GEMM rows
  const lf::ops::Fp8Recipe* fp8_up = fp8 ? fp8->choose(lf::ops::Fp8Gemm::qkv, tokens) : nullptr;
  const lf::ops::Fp8Recipe* fp8_proj = fp8 ? fp8->choose(lf::ops::Fp8Gemm::proj, tokens) : nullptr;
  // A column-parallel up projection inside the TP region (its input already whole on every rank):
  // in FP8 with each operand's amax reduced over TP, as column_parallel_linear's GEMM.
  auto up = [&](const at::Tensor& in_, const at::Tensor& w) {
    return fp8_up ? lf::ops::fp8_linear(in_, w, {}, *fp8_up, nullptr, tp.amax_group())
                  : at::matmul(in_, w.t());
  };
  // Enter the TP region once: the full sequence (SP: gathered) on every rank. The normed latents
  // sum their gradients over TP (the heads' partial sums), so the down projections and the
  // latent norms see the whole output gradient and produce whole gradients on every rank, as one
  // process does (FP8 quantizes that whole gradient). With a query latent the input has no other
  // consumer: its gradient needs no sum, only this rank's rows under SP. Without one, the query
  // projection's partial input gradient is summed at the entry, and the key/value latent's whole
  // one is counted once in that sum.
  at::Tensor xf = x, x_down = x;
  if (tp.size() > 1) {
    if (q_.defined()) {
      xf = tp.sequence_parallel ? lf::parallel::gather_from_sequence_parallel(x, *tp.tp)
                                : lf::parallel::copy_to_tp(x, *tp.tp);
      x_down = lf::parallel::once_over_tp(xf, *tp.tp);
    } else {
      xf = x_down = tp.sequence_parallel ? lf::parallel::gather_from_shares(x, *tp.tp) : x;
    }
  }
  auto down = [&](const at::Tensor& w) {
    return fp8_up ? lf::ops::fp8_linear(x_down, w, {}, *fp8_up, nullptr, nullptr) : at::matmul(x_down, w.t());
  };
  // The latents as the heads read them (after the norms): where their gradients are summed over TP.
  auto summed = [&](const at::Tensor& t) { return tp.size() > 1 ? lf::parallel::copy_to_tp(t, *tp.tp) : t; };
  const int64_t s = xf.size(0), b = xf.size(1);
  at::Tensor q_latent =
      q_.defined() ? at::Tensor() : summed(lf::ops::rms_norm(be, down(q_down_), q_norm_, c_.norm_eps));
  at::Tensor q = q_.defined() ? up(xf, q_) : up(q_latent, q_up_);
  q = q.view({s, b, nq, dq + dr});
  auto kv_latent = down(kv_down_);  // [s, b, kv_lora + dr]
  auto c_kv = lf::ops::rms_norm(be, kv_latent.narrow(-1, 0, c_.kv_lora_rank), kv_norm_, c_.norm_eps);
  auto k_pe = kv_latent.narrow(-1, c_.kv_lora_rank, dr);
  if (tp.size() > 1) {  // one all-reduce for both in backward
    auto both = summed(at::cat({c_kv, k_pe}, -1));
    c_kv = both.narrow(-1, 0, c_.kv_lora_rank);
    k_pe = both.narrow(-1, c_.kv_lora_rank, dr);
  }
  k_pe = k_pe.unsqueeze(2);  // [s, b, 1, dr]
  auto kv = up(c_kv, kv_up_).view({s, b, nq, dq + dv});
  auto q_nope = q.narrow(-1, 0, dq), q_pe = q.narrow(-1, dq, dr);
  auto k_nope = kv.narrow(-1, 0, dq), v = kv.narrow(-1, dq, dv).contiguous();
  const double scale = c_.softmax_scale > 0 ? c_.softmax_scale : 1.0 / std::sqrt(static_cast<double>(dq + dr));
  const lf::backend::DeviceBackend* bep = &be;
  const bool inter = c_.rotary_interleaved;
  if (c_.dsa.on) {
    KvCache* kv_cache = in.cache;
    LF_CHECK(!in.chunk && !in.documents.defined() && !(in.cp && in.cp->on()) &&
                 in.mask.kind == lf::backend::MaskKind::causal && tp.size() == 1,
             "DSA attention runs causal attention over whole sequences (or with a KV cache) at tensor-parallel "
             "size 1 (no ChunkPipe, packed documents, context parallelism or other masks)");
    // The indexer learns only from its own loss: its inputs are cut from the main model's graph.
    IndexerOut ix = indexer(be, xf.detach(), q_latent.detach(), in, fp8_up);
    if (kv_cache) {
      // Decoding: the indexer's keys of the cached tokens too (the causal mask is bottom-right).
      if (kv_cache->length > 0) ix.ki = at::cat({kv_cache->index_k[i], ix.ki}, 1);
      kv_cache->index_k[i] = ix.ki;
    }
    const int64_t t = ix.ki.size(1);  // keys: the cached ones and these
    const at::Tensor indices = c_.dsa.warmup ? all_causal_keys(b, s, t, xf.options())
                                             : lf::ops::dsa_indexer_topk(be, ix.qi, ix.ki, ix.w, ix.scale,
                                                                         std::min(c_.dsa.topk, t));
    // Core attention over the selected keys; head_prob (the indexer loss's target) leaves through
    // `prob` (selective recomputation reruns the core in backward and overwrites it alike).
    auto prob = std::make_shared<at::Tensor>();
    auto core = [bep, cos = in.cos, sin = in.sin, s, b, nq, dr, dv, scale, inter, indices, prob, kv_cache, i](
                    const at::Tensor& qn, const at::Tensor& qp, const at::Tensor& kn, const at::Tensor& kp,
                    const at::Tensor& v0) {
      const auto& be = *bep;
      at::Tensor qr = qp, kr = kp;
      if (cos.defined()) {
        qr = apply_rope(be, qp, cos, sin, inter);
        kr = apply_rope(be, kp, cos, sin, inter);
      }
      auto qf = at::cat({qn, qr}, -1).permute({1, 2, 0, 3});  // [b, nq, s, dq + dr]
      auto kf = at::cat({kn, kr.expand({s, b, nq, dr})}, -1).permute({1, 2, 0, 3});
      auto vf = v0.permute({1, 2, 0, 3});
      if (kv_cache) {
        if (kv_cache->length > 0) {
          kf = at::cat({kv_cache->k[i], kf}, 2);
          vf = at::cat({kv_cache->v[i], vf}, 2);
        }
        kv_cache->k[i] = kf.contiguous();
        kv_cache->v[i] = vf.contiguous();
      }
      auto r = lf::ops::dsa_sparse_attention(be, qf, kf, vf, indices, scale);
      *prob = r.head_prob;
      return r.o.permute({2, 0, 1, 3}).reshape({s, b, nq * dv});
    };
    at::Tensor o;
    if (in.selective_recompute && !kv_cache) {
      std::vector<at::Tensor> inputs{q_nope, q_pe, k_nope, k_pe, v};
      o = lf::models::recompute([core](const std::vector<at::Tensor>& t) { return core(t[0], t[1], t[2], t[3], t[4]); },
                                inputs);
    } else {
      o = core(q_nope, q_pe, k_nope, k_pe, v);
    }
    auto out = lf::parallel::row_parallel_linear(o, proj_, {}, tp, nullptr, fp8_proj);
    if (training && at::GradMode::is_enabled() && c_.dsa.loss_coeff > 0) {
      auto loss = indexer_loss(be, ix, indices, *prob);
      out = attach_aux_loss(out, loss, step ? step->weight(MoeStep::kIndexerLoss) : 1.0);
      if (step) step->add_losses({{MoeStep::kIndexerLoss, loss.item<double>()}});
    }
    return out;
  }
  KvCache* cache = in.cache;
  ChunkAttention* chunk = in.chunk;
  // Core attention: RoPE on the rotary parts, then softmax(QK^T * scale) V over [no-RoPE; RoPE]
  // dims. Captured by value (selective recomputation reruns it in backward).
  auto core = [bep, cos = in.cos, sin = in.sin, mask = in.mask, docs = in.documents, s, b, nq, dq, dr, dv, scale,
               inter, cache, chunk, i, cp = in.cp](const at::Tensor& qn, const at::Tensor& qp, const at::Tensor& kn, const at::Tensor& kp,
                  const at::Tensor& v0) {
    const auto& be = *bep;
    at::Tensor qr = qp, kr = kp;
    if (cos.defined()) {
      qr = apply_rope(be, qp, cos, sin, inter);
      kr = apply_rope(be, kp, cos, sin, inter);
    }
    auto qf = at::cat({qn, qr}, -1);                               // [s, b, nq, dq + dr]
    auto kf = at::cat({kn, kr.expand({s, b, nq, dr})}, -1);        // the rotary key shared by the heads
    auto o = attend(be, qf.permute({1, 2, 0, 3}), kf.permute({1, 2, 0, 3}), v0.permute({1, 2, 0, 3}), mask, cache,
                    chunk, i, scale, docs, cp);  // [b, nq, s, dv]
    return o.permute({2, 0, 1, 3}).reshape({s, b, nq * dv}).contiguous();  // a view when b is 1
  };
  at::Tensor o;
  if (in.selective_recompute && !cache && !chunk) {
    std::vector<at::Tensor> inputs{q_nope, q_pe, k_nope, k_pe, v};
    o = lf::models::recompute([core](const std::vector<at::Tensor>& t) { return core(t[0], t[1], t[2], t[3], t[4]); },
                              inputs);
  } else {
    o = core(q_nope, q_pe, k_nope, k_pe, v);
  }
  return lf::parallel::row_parallel_linear(o, proj_, {}, tp, nullptr, fp8_proj);
}

}  // namespace lf::models

#include "loongforge/models/blocks/mla.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>

#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/models/recompute.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {

MlaAttention::MlaAttention(ParamBuilder& b, const std::string& prefix, const MlaConfig& c) : c_(c) {
  const int64_t h = c.hidden_size, nq = c.num_heads, dq = c.qk_head_dim, dr = c.qk_pos_emb_head_dim,
                dv = c.v_head_dim;
  LF_CHECK(nq > 0 && dq > 0 && dr > 0 && dr % 2 == 0 && dv > 0 && c.kv_lora_rank > 0, "MLA ", prefix,
           ": heads, qk_head_dim, v_head_dim, kv_lora_rank must be positive and qk_pos_emb_head_dim even, got ", nq,
           ", ", dq, ", ", dv, ", ", c.kv_lora_rank, ", ", dr);
  // The down projections and the latent norms act on every TP rank's heads' behalf: replicated,
  // their gradients partial per rank (summed over TP).
  if (c.q_lora_rank > 0) {
    q_down_ = b.add(prefix + ".linear_q_down_proj.weight", b.normal({c.q_lora_rank, h}, c.init_std),
                    Sharding::replicated(), false, true);
    q_norm_ = b.add(prefix + ".q_layernorm.weight", at::ones({c.q_lora_rank}), Sharding::replicated(), true, true);
    q_up_ = b.add(prefix + ".linear_q_up_proj.weight", b.normal({nq * (dq + dr), c.q_lora_rank}, c.init_std),
                  Sharding::along(0), false);
  } else {
    q_ = b.add(prefix + ".linear_q_proj.weight", b.normal({nq * (dq + dr), h}, c.init_std), Sharding::along(0), false);
  }
  kv_down_ = b.add(prefix + ".linear_kv_down_proj.weight", b.normal({c.kv_lora_rank + dr, h}, c.init_std),
                   Sharding::replicated(), false, true);
  kv_norm_ = b.add(prefix + ".kv_layernorm.weight", at::ones({c.kv_lora_rank}), Sharding::replicated(), true, true);
  kv_up_ = b.add(prefix + ".linear_kv_up_proj.weight", b.normal({nq * (dq + dv), c.kv_lora_rank}, c.init_std),
                 Sharding::along(0), false);
  proj_ = b.add(prefix + ".linear_proj.weight", b.normal({h, nq * dv}, c.out_std), Sharding::along(1), false);
}

at::Tensor MlaAttention::forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp,
                                 const at::Tensor& x, const AttentionInputs& in, size_t i) const {
  const int64_t nq = c_.num_heads / tp.size(), dq = c_.qk_head_dim, dr = c_.qk_pos_emb_head_dim,
                dv = c_.v_head_dim;
  // Enter the TP region once: the full sequence (SP: gathered) on every rank.
  at::Tensor xf = x;
  if (tp.size() > 1)
    xf = tp.sequence_parallel ? lf::parallel::gather_from_sequence_parallel(x, *tp.tp)
                              : lf::parallel::copy_to_tp(x, *tp.tp);
  const int64_t s = xf.size(0), b = xf.size(1);
  at::Tensor q = q_.defined()
                     ? at::matmul(xf, q_.t())
                     : at::matmul(lf::ops::rms_norm(be, at::matmul(xf, q_down_.t()), q_norm_, c_.norm_eps), q_up_.t());
  q = q.view({s, b, nq, dq + dr});
  auto kv_latent = at::matmul(xf, kv_down_.t());  // [s, b, kv_lora + dr]
  auto c_kv = lf::ops::rms_norm(be, kv_latent.narrow(-1, 0, c_.kv_lora_rank), kv_norm_, c_.norm_eps);
  auto k_pe = kv_latent.narrow(-1, c_.kv_lora_rank, dr).unsqueeze(2);  // [s, b, 1, dr]
  auto kv = at::matmul(c_kv, kv_up_.t()).view({s, b, nq, dq + dv});
  auto q_nope = q.narrow(-1, 0, dq), q_pe = q.narrow(-1, dq, dr);
  auto k_nope = kv.narrow(-1, 0, dq), v = kv.narrow(-1, dq, dv).contiguous();
  const double scale = c_.softmax_scale > 0 ? c_.softmax_scale : 1.0 / std::sqrt(static_cast<double>(dq + dr));
  const lf::backend::DeviceBackend* bep = &be;
  const bool inter = c_.rotary_interleaved;
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
    return o.permute({2, 0, 1, 3}).reshape({s, b, nq * dv});
  };
  at::Tensor o;
  if (in.selective_recompute && !cache && !chunk) {
    std::vector<at::Tensor> inputs{q_nope, q_pe, k_nope, k_pe, v};
    o = lf::models::recompute([core](const std::vector<at::Tensor>& t) { return core(t[0], t[1], t[2], t[3], t[4]); },
                              inputs);
  } else {
    o = core(q_nope, q_pe, k_nope, k_pe, v);
  }
  return lf::parallel::row_parallel_linear(o, proj_, {}, tp);
}

}  // namespace lf::models

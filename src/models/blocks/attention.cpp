#include "loongforge/models/blocks/attention.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>

#include "loongforge/backend/fp8.h"
#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/models/recompute.h"

namespace lf::models {
namespace {

}  // namespace

at::Tensor apply_rope(const lf::backend::DeviceBackend& be, const at::Tensor& x, const at::Tensor& cos,
                      const at::Tensor& sin, bool interleaved) {
  if (cos.dim() == 2) return lf::ops::rope(be, x, cos, sin, interleaved);
  std::vector<at::Tensor> parts;
  for (int64_t i = 0; i < x.size(1); ++i)
    parts.push_back(lf::ops::rope(be, x.narrow(1, i, 1), cos[i], sin[i], interleaved));
  return at::cat(parts, 1);
}

namespace {
// Causal attention within each run of equal document ids ([b, s], CPU int64): every run's queries,
// keys and values sliced out and attended on their own, so no [s, s] mask exists and the work is
// the sum of the runs' squares.
at::Tensor attend_documents(const lf::backend::DeviceBackend& be, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& documents, std::optional<double> scale) {
  const int64_t b = q.size(0), s = q.size(2);
  LF_CHECK(documents.dim() == 2 && documents.size(0) == b && documents.size(1) == s, "document ids must be [", b, ", ",
           s, "], got ", documents.sizes());
  const at::Tensor ids = documents.to(at::kCPU, at::kLong).contiguous();
  const int64_t* d = ids.data_ptr<int64_t>();
  std::vector<at::Tensor> rows;
  for (int64_t r = 0; r < b; ++r) {
    std::vector<at::Tensor> runs;
    for (int64_t start = 0, t = 1; t <= s; ++t) {
      if (t < s && d[r * s + t] == d[r * s + t - 1]) continue;
      auto cut = [&](const at::Tensor& x) { return x.narrow(0, r, 1).narrow(2, start, t - start); };
      runs.push_back(lf::ops::sdpa(be, cut(q), cut(k), cut(v), lf::backend::AttentionMask::causal(), scale));
      start = t;
    }
    rows.push_back(runs.size() == 1 ? runs[0] : at::cat(runs, 2));
  }
  return b == 1 ? rows[0] : at::cat(rows, 0);
}
}  // namespace

at::Tensor attend(const lf::backend::DeviceBackend& be, at::Tensor qr, at::Tensor kr, at::Tensor vr,
                  const lf::backend::AttentionMask& mask, KvCache* cache, ChunkAttention* chunk, size_t i,
                  std::optional<double> scale, const at::Tensor& documents, const lf::parallel::ContextParallel* cp) {
  if (cp && cp->on() && chunk) {
    // ChunkPipe under CP: the chunk's keys/values gathered from the CP ranks (the prefix store keeps
    // them whole on every rank; their gradients sum over the ranks in the gather's backward), this
    // rank's queries over the prefix and, causally by position, over the whole chunk.
    LF_CHECK(!cache && mask.kind == lf::backend::MaskKind::causal && !documents.defined(),
             "ChunkPipe under context parallelism runs causal attention without document masks");
    const at::Tensor k = lf::parallel::cp_gather_sequence(kr, *cp), v = lf::parallel::cp_gather_sequence(vr, *cp);
    chunk->k[i] = k;
    chunk->v[i] = v;
    const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(qr.size(-1))));
    const bool prefix = i < chunk->prefix_k.size() && chunk->prefix_k[i].defined() && chunk->prefix_k[i].size(2) > 0;
    // Piece g of the chunk's 2 cp pieces (p tokens) sees the keys of pieces 0..g: the causal mask,
    // bottom-right aligned over those (g + 1) p keys, is exactly the positions' order; no explicit mask.
    const int64_t p = qr.size(2) / 2;
    const auto [a, b] = lf::parallel::cp_chunks(cp->size(), cp->rank());
    std::vector<at::Tensor> out;
    for (const auto& [piece, g] : {std::pair<int64_t, int64_t>{0, a}, {1, b}}) {
      const at::Tensor q = qr.narrow(2, piece * p, p), kk = k.narrow(2, 0, (g + 1) * p), vv = v.narrow(2, 0, (g + 1) * p);
      out.push_back(prefix ? lf::ops::sdpa_after_prefix(be, q, chunk->prefix_k[i], chunk->prefix_v[i], kk, vv, sc,
                                                        lf::backend::AttentionMask::causal())
                           : lf::ops::sdpa(be, q, kk, vv, lf::backend::AttentionMask::causal(), sc));
    }
    return at::cat(out, 2);
  }
  if (cp && cp->on()) {
    LF_CHECK(!cache && mask.kind == lf::backend::MaskKind::causal,
             "context parallelism runs causal attention over whole sequences (no KV cache, no other mask)");
    auto whole = [&be, scale](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& docs) {
      return docs.defined() ? attend_documents(be, q, k, v, docs, scale)
                            : lf::ops::sdpa(be, q, k, v, lf::backend::AttentionMask::causal(), scale);
    };
    const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(qr.size(-1))));
    return lf::parallel::context_parallel_attention(be, *cp, qr, kr, vr, documents, sc, whole);
  }
  if (documents.defined()) {
    LF_CHECK(!cache && !chunk, "document masks work on whole sequences (no KV cache, no ChunkPipe)");
    return attend_documents(be, qr, kr, vr, documents, scale);
  }
  if (cache) {
    const int64_t past = cache->length;
    if (past > 0) {
      kr = at::cat({cache->k[i], kr}, 2);
      vr = at::cat({cache->v[i], vr}, 2);
    }
    cache->k[i] = kr.contiguous();
    cache->v[i] = vr.contiguous();
    // The causal mask is bottom-right aligned (backend/op_table.h): query j, at position
    // past + j, sees keys 0 .. past + j, the cached ones included.
  }
  if (chunk) {
    // ChunkPipe: this chunk's queries over the earlier chunks' keys and its own, causally.
    chunk->k[i] = kr;
    chunk->v[i] = vr;
    const bool prefix = i < chunk->prefix_k.size() && chunk->prefix_k[i].defined() && chunk->prefix_k[i].size(2) > 0;
    if (prefix) return lf::ops::sdpa_after_prefix(be, qr, chunk->prefix_k[i], chunk->prefix_v[i], kr, vr, scale);
  }
  return lf::ops::sdpa(be, qr, kr, vr, mask, scale);
}

at::Tensor block_causal_mask(const at::Tensor& document_ids) {
  LF_CHECK(document_ids.dim() == 2, "document ids must be [batch, seq], got ", document_ids.sizes());
  const int64_t s = document_ids.size(1);
  auto same = document_ids.unsqueeze(2).eq(document_ids.unsqueeze(1));  // [b, s, s]
  auto causal = at::ones({s, s}, document_ids.options().dtype(at::kBool)).tril();
  return at::logical_and(same, causal).unsqueeze(1);
}

at::Tensor prefix_lm_mask(const at::Tensor& prefix_len, int64_t s) {
  LF_CHECK(prefix_len.dim() == 1, "prefix lengths must be [batch], got ", prefix_len.sizes());
  auto pos = at::arange(s, prefix_len.options());
  auto causal = at::ones({s, s}, prefix_len.options().dtype(at::kBool)).tril();  // [s, s]
  // Key j is visible from every query when it lies inside the prefix.
  auto in_prefix = pos.unsqueeze(0).lt(prefix_len.unsqueeze(1));  // [b, s] over keys
  return at::logical_or(causal.unsqueeze(0), in_prefix.unsqueeze(1)).unsqueeze(1);  // [b, 1, s, s]
}

SelfAttention::SelfAttention(ParamBuilder& b, const std::string& prefix, const AttentionConfig& c) : c_(c) {
  const int64_t h = c.hidden_size, d = c.head_dim, nq = c.num_heads, nkv = c.num_groups;
  qkv_ = b.add(prefix + ".linear_qkv.weight", b.normal({(nq + 2 * nkv) * d, h}, c.init_std), Sharding::along(0), false);
  if (c.qkv_bias)
    qkv_bias_ = b.add(prefix + ".linear_qkv.bias", at::zeros({(nq + 2 * nkv) * d}), Sharding::along(0), true);
  if (c.qk_norm) {
    // Each TP rank holds different heads: the per-head norms' gradients differ per rank.
    q_norm_ = b.add(prefix + ".q_layernorm.weight", at::ones({d}), Sharding::replicated(), true, ParamBuilder::TpGrad::partial);
    k_norm_ = b.add(prefix + ".k_layernorm.weight", at::ones({d}), Sharding::replicated(), true, ParamBuilder::TpGrad::partial);
  }
  proj_ = b.add(prefix + ".linear_proj.weight", b.normal({h, nq * d}, c.out_std), Sharding::along(1), false);
  if (c.proj_bias) proj_bias_ = b.add(prefix + ".linear_proj.bias", at::zeros({h}), Sharding::replicated(), true);
}

at::Tensor SelfAttention::forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp,
                                  const at::Tensor& x, const AttentionInputs& in, size_t i,
                                  const LoraInputs* lora, const lf::ops::WeightGradSlots* slots,
                                  const Norm* pre_norm, const lf::ops::Fp8Policy* fp8) const {
  const int64_t tokens = x.size(0) * x.size(1) * (tp.sequence_parallel ? tp.size() : 1);  // this rank's GEMM rows
  const lf::ops::Fp8Recipe* fp8_qkv = fp8 ? fp8->choose(lf::ops::Fp8Gemm::qkv, tokens) : nullptr;
  const lf::ops::Fp8Recipe* fp8_proj = fp8 ? fp8->choose(lf::ops::Fp8Gemm::proj, tokens) : nullptr;
  const int64_t d = c_.head_dim, groups = c_.num_groups / tp.size(), per_group = c_.num_heads / c_.num_groups,
                nq = groups * per_group;  // this rank's heads
  const LayerLora* ad = lora ? lora->adapters : nullptr;
  const bool adapters_read_x = ad && ((*ad)[LoraModule::q_proj].on() || (*ad)[LoraModule::k_proj].on() ||
                                      (*ad)[LoraModule::v_proj].on());
  // The normed input is a tensor of its own only when q/k/v adapters read it too; otherwise the
  // norm goes into linear_qkv (Norm::first_linear).
  const at::Tensor xn = pre_norm && adapters_read_x ? (*pre_norm)(be, x) : x;
  auto qkv = pre_norm && !adapters_read_x
                 ? pre_norm->first_linear(be, tp, x, qkv_, qkv_bias_, slots, fp8_qkv)
                 : lf::parallel::column_parallel_linear(xn, qkv_, qkv_bias_, tp, false, slots,
                                                        fp8_qkv);  // [s, b, groups (pg+2) d]
  const int64_t s = qkv.size(0), b = qkv.size(1);
  qkv = qkv.view({s, b, groups, per_group + 2, d});
  auto q = qkv.narrow(3, 0, per_group).reshape({s, b, nq, d});
  auto k = qkv.select(3, per_group).contiguous();  // [s, b, groups, d]
  // A copy, not a view: attention saves v for backward, and a view would keep all of qkv alive
  // (q and k are copies already), (nq + 2 nkv) / nkv times the bytes v needs.
  auto v = qkv.select(3, per_group + 1).contiguous();
  if (adapters_read_x) {
    // PEFT's q_proj/k_proj/v_proj: this rank's heads of each, added to the split projection.
    const auto dqkv = LoraAdapter::column_group(tp, xn, lora->column_gen(tp),
                                                {&(*ad)[LoraModule::q_proj], &(*ad)[LoraModule::k_proj],
                                                 &(*ad)[LoraModule::v_proj]});
    if (dqkv[0].defined()) q = q + dqkv[0].view({s, b, nq, d});
    if (dqkv[1].defined()) k = k + dqkv[1].view({s, b, groups, d});
    if (dqkv[2].defined()) v = v + dqkv[2].view({s, b, groups, d});
  }
  KvCache* cache = in.cache;
  ChunkAttention* chunk = in.chunk;
  // Core attention: QK norm, RoPE, softmax(QK^T) V. [s, b, n, d] -> [s, b, nq d]
  // Captured by value: under selective recomputation this runs again in backward, after the
  // caller's frame (and `in`) are gone.
  const lf::backend::DeviceBackend* bep = &be;
  auto core = [this, bep, cos = in.cos, sin = in.sin, mask = in.mask, docs = in.documents, s, b, nq, d, cache, chunk,
               i, cp = in.cp](const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0) {
    const auto& be = *bep;
    at::Tensor qn = q0, kn = k0;
    if (q_norm_.defined()) {
      qn = lf::ops::rms_norm(be, q0, q_norm_, c_.norm_eps);
      kn = lf::ops::rms_norm(be, k0, k_norm_, c_.norm_eps);
    }
    if (cos.defined()) {
      qn = apply_rope(be, qn, cos, sin, c_.rotary_interleaved);
      kn = apply_rope(be, kn, cos, sin, c_.rotary_interleaved);
    }
    // [s, b, n, d] -> [b, n, s, d]
    auto o = attend(be, qn.permute({1, 2, 0, 3}), kn.permute({1, 2, 0, 3}), v0.permute({1, 2, 0, 3}), mask, cache,
                    chunk, i, std::nullopt, docs, cp);  // [b, nq, s, d]
    // A view of attention's sequence-major output when b is 1 (linear_proj then saves no copy of
    // its own); otherwise [s, b, ..] is not its memory order, and a copy keeps the layout canonical.
    return o.permute({2, 0, 1, 3}).reshape({s, b, nq * d}).contiguous();
  };
  at::Tensor o;
  if (in.selective_recompute && !cache && !chunk) {
    std::vector<at::Tensor> inputs{q, k, v};
    o = lf::models::recompute([core](const std::vector<at::Tensor>& t) { return core(t[0], t[1], t[2]); }, inputs);
  } else {
    o = core(q, k, v);
  }
  auto out = lf::parallel::row_parallel_linear(o, proj_, proj_bias_, tp, slots, fp8_proj);
  if (ad && (*ad)[LoraModule::o_proj].on()) out = out + (*ad)[LoraModule::o_proj].forward(tp, o, lora->row_gen(tp));
  return out;
}

CrossAttention::CrossAttention(ParamBuilder& b, const std::string& prefix, const AttentionConfig& c,
                               int64_t context_size)
    : c_(c) {
  const int64_t h = c.hidden_size, d = c.head_dim, nq = c.num_heads, nkv = c.num_groups;
  q_ = b.add(prefix + ".linear_q.weight", b.normal({nq * d, h}, c.init_std), Sharding::along(0), false);
  if (c.qkv_bias) q_bias_ = b.add(prefix + ".linear_q.bias", at::zeros({nq * d}), Sharding::along(0), true);
  kv_ = b.add(prefix + ".linear_kv.weight", b.normal({2 * nkv * d, context_size}, c.init_std), Sharding::along(0), false);
  if (c.qkv_bias) kv_bias_ = b.add(prefix + ".linear_kv.bias", at::zeros({2 * nkv * d}), Sharding::along(0), true);
  proj_ = b.add(prefix + ".linear_proj.weight", b.normal({h, nq * d}, c.out_std), Sharding::along(1), false);
  if (c.proj_bias) proj_bias_ = b.add(prefix + ".linear_proj.bias", at::zeros({h}), Sharding::replicated(), true);
}

at::Tensor CrossAttention::forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp,
                                   const at::Tensor& x, const at::Tensor& context,
                                   const lf::backend::AttentionMask& mask) const {
  LF_CHECK(context.dim() == 3, "cross-attention context must be [t, b, features], got ", context.sizes());
  const int64_t d = c_.head_dim, groups = c_.num_groups / tp.size(), nq = c_.num_heads / tp.size();
  auto q = lf::parallel::column_parallel_linear(x, q_, q_bias_, tp);  // [s, b, nq d]
  // The context is replicated over TP: a column-parallel projection without sequence parallelism.
  lf::parallel::TensorParallel plain = tp;
  plain.sequence_parallel = false;
  auto kv = lf::parallel::column_parallel_linear(context, kv_, kv_bias_, plain);  // [t, b, groups 2 d]
  const int64_t s = q.size(0), b = q.size(1), t = kv.size(0);
  auto qr = q.view({s, b, nq, d}).permute({1, 2, 0, 3});
  auto kv5 = kv.view({t, b, groups, 2, d});
  auto kr = kv5.select(3, 0).permute({1, 2, 0, 3});
  auto vr = kv5.select(3, 1).permute({1, 2, 0, 3});
  auto o = lf::ops::sdpa(be, qr, kr, vr, mask).permute({2, 0, 1, 3}).reshape({s, b, nq * d}).contiguous();
  return lf::parallel::row_parallel_linear(o, proj_, proj_bias_, tp);
}

}  // namespace lf::models

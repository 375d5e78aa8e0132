// Context parallelism: the load-balanced sequence layout, ring attention and Ulysses
// (parallel/context/context_parallel.h).
#include "loongforge/parallel/context/context_parallel.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "loongforge/core/error.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::parallel {

using lf::backend::AttentionMask;
using lf::backend::Communicator;
using lf::backend::DeviceBackend;

CpCommType parse_cp_comm_type(const std::string& name) {
  if (name == "p2p") return CpCommType::p2p;
  if (name == "a2a") return CpCommType::a2a;
  LF_FAIL("parallel.cp_comm_type '", name, "' is not a context-parallel communication type",
          lf::hint("use --cp-comm-type p2p (ring attention) or a2a (Ulysses all-to-all)"));
}

const char* to_string(CpCommType type) { return type == CpCommType::p2p ? "p2p" : "a2a"; }

std::pair<int64_t, int64_t> cp_chunks(int cp, int rank) {
  LF_CHECK(cp >= 1 && rank >= 0 && rank < cp, "context-parallel rank ", rank, " of ", cp);
  return {rank, 2 * static_cast<int64_t>(cp) - 1 - rank};
}

at::Tensor cp_positions(int64_t s, int cp, int rank) {
  LF_CHECK(s % (2 * cp) == 0, "context parallelism splits the sequence into 2 x ", cp, " chunks; length ", s,
           " does not divide", lf::hint("pick --seq-length as a multiple of " + std::to_string(2 * cp)));
  const int64_t c = s / (2 * cp);
  const auto [a, b] = cp_chunks(cp, rank);
  return at::cat({at::arange(a * c, (a + 1) * c, at::kLong), at::arange(b * c, (b + 1) * c, at::kLong)});
}

at::Tensor cp_slice(const at::Tensor& x, int64_t dim, int cp, int rank) {
  if (cp == 1) return x;
  if (dim < 0) dim += x.dim();
  const int64_t s = x.size(dim);
  LF_CHECK(s % (2 * cp) == 0, "context parallelism splits the sequence into 2 x ", cp, " chunks; dim ", dim,
           " of a tensor of shape ", x.sizes(), " does not divide",
           lf::hint("pick --seq-length as a multiple of " + std::to_string(2 * cp)));
  const int64_t c = s / (2 * cp);
  const auto [a, b] = cp_chunks(cp, rank);
  return at::cat({x.narrow(dim, a * c, c), x.narrow(dim, b * c, c)}, dim);
}

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void save_ptrs(AutogradContext* ctx, const DeviceBackend* be, Communicator* c) {
  ctx->saved_data["be"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(be));
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(c));
}

const DeviceBackend& saved_be(AutogradContext* ctx) {
  return *reinterpret_cast<const DeviceBackend*>(static_cast<intptr_t>(ctx->saved_data["be"].toInt()));
}
Communicator& saved_comm(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

// One step of the ring: `out` to the next rank, `in` filled from the previous, both in flight
// until wait().
struct RingTransfer {
  std::shared_ptr<lf::backend::Work> send, recv;
  at::Tensor out, in;
  void wait() {
    if (send) send->wait();
    if (recv) recv->wait();
  }
};
RingTransfer ring_pass(Communicator& g, at::Tensor out, int tag) {
  const int n = g.size(), r = g.rank();
  RingTransfer t;
  t.out = out.contiguous();
  t.in = at::empty_like(t.out);
  // Every rank posts its receive and its send before waiting on either: no rank blocks another.
  t.recv = g.recv(t.in, (r - 1 + n) % n, tag, true);
  t.send = g.send(t.out, (r + 1) % n, tag, true);
  return t;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
// Waits for a transfer, adding the time waited to *acc (when given).
void timed_wait(RingTransfer& t, double* acc) {
  const auto t0 = std::chrono::steady_clock::now();
  t.wait();
  if (acc) *acc += seconds_since(t0);
}
void save_ring(AutogradContext* ctx, bool overlap, RingStats* stats) {
  ctx->saved_data["overlap"] = overlap;
  ctx->saved_data["stats"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(stats));
}
RingStats* saved_stats(AutogradContext* ctx) {
  return reinterpret_cast<RingStats*>(static_cast<intptr_t>(ctx->saved_data["stats"].toInt()));
}

// The mask of query chunk gq over key chunk gk (global chunk indices, c tokens each), or nullopt
// when no query of gq sees a key of gk.
std::optional<AttentionMask> block_mask(int64_t gq, int64_t gk, int64_t c, const at::Tensor& documents,
                                        const at::Device& device) {
  if (gk > gq) return std::nullopt;
  if (!documents.defined()) return gk == gq ? AttentionMask::causal() : AttentionMask::none();
  auto dq = documents.narrow(1, gq * c, c), dk = documents.narrow(1, gk * c, c);
  auto m = dq.unsqueeze(2).eq(dk.unsqueeze(1));  // [b, c, c]
  if (gk == gq) m = at::logical_and(m, at::ones({c, c}, m.options()).tril());
  if (!m.any().item<bool>()) return std::nullopt;
  return AttentionMask::boolean(m.unsqueeze(1).to(device));
}

// Every (query chunk i, key chunk j) pair of ring step t that has something to attend: this rank's
// chunks against those of the rank whose block is here, fn(i, j, mask).
template <class Fn>
void for_each_block(int n, int r, int t, int64_t c, const at::Tensor& documents, const at::Device& device, Fn&& fn) {
  const auto mine = cp_chunks(n, r), theirs = cp_chunks(n, (r - t + n) % n);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      auto mask = block_mask(i == 0 ? mine.first : mine.second, j == 0 ? theirs.first : theirs.second, c, documents,
                             device);
      if (mask) fn(i, j, *mask);
    }
}

// o, lse (fp32) += a partial result over more keys, merged by logsumexp. Rows that have seen no
// key yet (lse -inf) take the part as it is.
void merge(at::Tensor& o, at::Tensor& lse, const at::Tensor& o_part, const at::Tensor& lse_part) {
  at::Tensor op = o_part.to(at::kFloat);
  if (!o.defined()) {
    o = op;
    lse = lse_part.clone();
    return;
  }
  at::Tensor m = at::logaddexp(lse, lse_part);
  at::Tensor safe = at::where(at::isinf(m), at::zeros_like(m), m);
  o = o * (lse - safe).exp().unsqueeze(-1) + op * (lse_part - safe).exp().unsqueeze(-1);
  lse = m;
}

// Ring attention: at step t this rank holds the key/value block of rank (r - t) mod n
// (for_each_block's chunk pairs).
struct RingAttentionFn : torch::autograd::Function<RingAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const DeviceBackend* be, Communicator* g, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& docs,
                            double scale, bool overlap, RingStats* stats) {
    const auto t0 = std::chrono::steady_clock::now();
    const at::Tensor documents = docs.value_or(at::Tensor());
    const int n = g->size(), r = g->rank();
    const int64_t sl = q.size(2), c = sl / 2, d = k.size(3);
    std::array<at::Tensor, 2> o, lse;
    at::Tensor kv = at::cat({k, v}, -1).contiguous();
    for (int t = 0; t < n; ++t) {
      std::optional<RingTransfer> next;
      if (t + 1 < n) next = ring_pass(*g, kv, 0);  // the next block travels while this one is computed
      if (next && !overlap) timed_wait(*next, stats ? &stats->kv_wait_seconds : nullptr);
      for_each_block(n, r, t, c, documents, q.device(), [&](int i, int j, const AttentionMask& mask) {
        auto blk = kv.narrow(2, j * c, c);
        auto part = be->ops().sdpa_fwd(q.narrow(2, i * c, c), blk.narrow(3, 0, d), blk.narrow(3, d, blk.size(3) - d),
                                       mask, scale);
        merge(o[static_cast<size_t>(i)], lse[static_cast<size_t>(i)], part.o, part.lse);
      });
      if (next) {
        timed_wait(*next, stats ? &stats->kv_wait_seconds : nullptr);
        kv = next->in;
      }
    }
    at::Tensor out = at::cat({o[0], o[1]}, 2).to(q.scalar_type());
    save_ptrs(ctx, be, g);
    save_ring(ctx, overlap, stats);
    if (stats) stats->ring_seconds += seconds_since(t0), ++stats->calls;
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q, k, v, out, at::cat({lse[0], lse[1]}, 2), documents});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto t0 = std::chrono::steady_clock::now();
    auto s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &o = s[3], &lse = s[4], &documents = s[5];
    const bool overlap = ctx->saved_data["overlap"].toBool();
    RingStats* stats = saved_stats(ctx);
    const DeviceBackend& be = saved_be(ctx);
    Communicator& g = saved_comm(ctx);
    const double scale = ctx->saved_data["scale"].toDouble();
    const int n = g.size(), r = g.rank();
    const int64_t sl = q.size(2), c = sl / 2, d = k.size(3);
    at::Tensor dout = grads[0].contiguous();
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    at::Tensor kv = at::cat({k, v}, -1).contiguous();
    // The gradient of each block travels around the ring behind it: at step t this rank adds its
    // share for the block here into a fresh buffer, then the share of the ranks before it (sent at
    // their step t - 1, in flight while this step computed) and passes the sum on; after n steps
    // each block's gradient is back with its owner.
    std::optional<RingTransfer> behind;  // the accumulated gradient of the block here, arriving
    for (int t = 0; t < n; ++t) {
      std::optional<RingTransfer> next;
      if (t + 1 < n) next = ring_pass(g, kv, 1);
      if (next && !overlap) timed_wait(*next, stats ? &stats->kv_wait_seconds : nullptr);
      at::Tensor dkv = at::zeros(kv.sizes(), kv.options().dtype(at::kFloat));
      for_each_block(n, r, t, c, documents, q.device(), [&](int i, int j, const AttentionMask& mask) {
        auto blk = kv.narrow(2, j * c, c);
        auto gr = be.ops().sdpa_bwd(dout.narrow(2, i * c, c), q.narrow(2, i * c, c), blk.narrow(3, 0, d),
                                    blk.narrow(3, d, blk.size(3) - d), o.narrow(2, i * c, c), lse.narrow(2, i * c, c),
                                    mask, scale);
        dq.narrow(2, i * c, c).add_(gr.dq.to(at::kFloat));
        auto dblk = dkv.narrow(2, j * c, c);
        dblk.narrow(3, 0, d).add_(gr.dk.to(at::kFloat));
        dblk.narrow(3, d, dblk.size(3) - d).add_(gr.dv.to(at::kFloat));
      });
      if (behind) {
        timed_wait(*behind, stats ? &stats->dkv_wait_seconds : nullptr);
        dkv.add_(behind->in);
      }
      behind = ring_pass(g, dkv, 2);
      if (!overlap) timed_wait(*behind, stats ? &stats->dkv_wait_seconds : nullptr);
      if (next) {
        timed_wait(*next, stats ? &stats->kv_wait_seconds : nullptr);
        kv = next->in;
      }
    }
    timed_wait(*behind, stats ? &stats->dkv_wait_seconds : nullptr);
    at::Tensor dkv = behind->in;  // this rank's own block, every rank's share summed
    if (stats) stats->ring_seconds += seconds_since(t0), ++stats->calls;
    return {at::Tensor(),
            at::Tensor(),
            dq.to(q.scalar_type()),
            dkv.narrow(3, 0, d).to(k.scalar_type()),
            dkv.narrow(3, d, dkv.size(3) - d).to(v.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

// Ulysses. x: [b, n, sl, d] (this rank's tokens, all heads) -> [b, n / cp, cp sl, d] (the heads of
// group `rank`, every rank's tokens in rank order). The all-to-all's adjoint is the reverse one.
at::Tensor seq_to_heads_raw(const at::Tensor& x, Communicator& g) {
  const int64_t cp = g.size(), b = x.size(0), n = x.size(1), sl = x.size(2), d = x.size(3);
  at::Tensor in = x.reshape({b, cp, n / cp, sl, d}).permute({1, 0, 2, 3, 4}).contiguous();
  at::Tensor out = at::empty_like(in);
  g.all_to_all(out, in, {}, {});
  // out[src]: rank src's tokens of my heads.
  return out.permute({1, 2, 0, 3, 4}).reshape({b, n / cp, cp * sl, d});
}
at::Tensor heads_to_seq_raw(const at::Tensor& y, Communicator& g) {
  const int64_t cp = g.size(), b = y.size(0), h = y.size(1), sl = y.size(2) / cp, d = y.size(3);
  at::Tensor in = y.reshape({b, h, cp, sl, d}).permute({2, 0, 1, 3, 4}).contiguous();
  at::Tensor out = at::empty_like(in);
  g.all_to_all(out, in, {}, {});
  // out[src]: my tokens of rank src's heads.
  return out.permute({1, 0, 2, 3, 4}).reshape({b, cp * h, sl, d});
}
struct SeqToHeadsFn : torch::autograd::Function<SeqToHeadsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* g) {
    save_ptrs(ctx, nullptr, g);
    return seq_to_heads_raw(x, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    return {heads_to_seq_raw(dy[0].contiguous(), saved_comm(ctx)), at::Tensor()};
  }
};
struct HeadsToSeqFn : torch::autograd::Function<HeadsToSeqFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, Communicator* g) {
    save_ptrs(ctx, nullptr, g);
    return heads_to_seq_raw(y, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dx) {
    return {seq_to_heads_raw(dx[0].contiguous(), saved_comm(ctx)), at::Tensor()};
  }
};

// Token indices between rank order (rank 0's two chunks, rank 1's, ...) and natural order.
// natural = rank_order.index_select(2, to_natural); rank_order = natural.index_select(2, to_rank_order).
std::pair<at::Tensor, at::Tensor> chunk_orders(int cp, int64_t s, const at::Device& device) {
  std::vector<at::Tensor> rank_order;  // natural positions in rank order
  for (int k = 0; k < cp; ++k) rank_order.push_back(cp_positions(s, cp, k));
  at::Tensor to_rank_order = at::cat(rank_order);
  at::Tensor to_natural = at::empty_like(to_rank_order);
  to_natural.index_put_({to_rank_order}, at::arange(s, at::kLong));
  return {to_natural.to(device), to_rank_order.to(device)};
}

}  // namespace

at::Tensor cp_gather_sequence(const at::Tensor& x, const ContextParallel& cp) {
  if (!cp.on()) return x;
  const int n = cp.size();
  const int64_t s = x.size(2) * n;
  auto [to_natural, to_rank_order] = chunk_orders(n, s, x.device());
  // All-gather along the sequence (dim 0 of the moved view; backward: reduce-scatter), rank order
  // -> natural order.
  at::Tensor gathered = gather_from_sequence_parallel(x.movedim(2, 0).contiguous(), *cp.group);
  return gathered.index_select(0, to_natural).movedim(0, 2);
}

at::Tensor context_parallel_attention(const DeviceBackend& be, const ContextParallel& cp, const at::Tensor& q,
                                      const at::Tensor& k, const at::Tensor& v, const at::Tensor& documents,
                                      double scale, const WholeSequenceAttention& whole) {
  LF_CHECK(cp.on(), "context_parallel_attention without a context-parallel group");
  LF_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(2) == q.size(2) && v.size(2) == q.size(2),
           "context-parallel attention: q, k, v must be [b, heads, s / cp, d] over the same tokens, got ", q.sizes(),
           ", ", k.sizes(), ", ", v.sizes());
  const int n = cp.size();
  const int64_t sl = q.size(2), s = sl * n;
  LF_CHECK(sl % 2 == 0, "context parallelism: each rank holds two equal chunks; ", sl, " tokens per rank is odd",
           lf::hint("pick --seq-length as a multiple of " + std::to_string(2 * n)));
  at::Tensor docs;
  if (documents.defined()) {
    docs = documents.to(at::kCPU, at::kLong).contiguous();
    LF_CHECK(docs.dim() == 2 && docs.size(0) == q.size(0) && docs.size(1) == s,
             "context parallelism: document ids must cover the whole sequence [", q.size(0), ", ", s, "], got ",
             docs.sizes());
  }
  if (cp.comm == CpCommType::p2p)
    return RingAttentionFn::apply(&be, cp.group, q, k, v,
                                  docs.defined() ? std::optional<at::Tensor>(docs) : std::optional<at::Tensor>(), scale,
                                  cp.overlap, cp.stats);

  LF_CHECK(static_cast<bool>(whole), "context-parallel attention with a2a needs the whole-sequence attention");
  const int64_t nq = q.size(1), nkv = k.size(1);
  LF_CHECK(nq % n == 0, "--cp-comm-type a2a splits the attention heads over the context-parallel ranks: ", nq,
           " query heads on this rank do not divide by cp ", n,
           lf::hint("use --cp-comm-type p2p, or a CP size dividing the heads per tensor-parallel rank"));
  at::Tensor kk = k, vv = v;
  if (nkv % n != 0) {
    // The query heads of one CP rank must find their key/value heads on it: repeat them (GQA).
    kk = k.repeat_interleave(nq / nkv, 1);
    vv = v.repeat_interleave(nq / nkv, 1);
  }
  auto [to_natural, to_rank_order] = chunk_orders(n, s, q.device());
  auto gather = [&](const at::Tensor& x) { return SeqToHeadsFn::apply(x, cp.group).index_select(2, to_natural); };
  at::Tensor o = whole(gather(q), gather(kk), gather(vv), docs);  // [b, nq / cp, s, dv]
  return HeadsToSeqFn::apply(o.index_select(2, to_rank_order), cp.group);
}

}  // namespace lf::parallel

// Context parallelism (--context-parallel-size, --cp-comm-type): the sequence of every sample is
// split over the CP group's ranks and attention is the only layer that needs the rest of it.
//
// Load balancing for causal attention (as Megatron and TransformerEngine): the sequence is cut
// into 2 x CP equal chunks and rank r holds chunks r and 2 CP - 1 - r, in that order, so that
// every rank has as much of the causal triangle as any other. Everything a rank holds of a
// sample along the sequence (tokens, labels, loss mask, positions) is in this layout; the RoPE
// positions of its tokens are cp_positions().
//
// Two ways to attend over the whole sequence:
//  - p2p (ring attention): the keys and values travel around the ring, one block per step, the
//    next block's transfer in flight while this one is computed; each query chunk merges its
//    blocks' partial softmax outputs by their logsumexp; causality per chunk pair (earlier chunk:
//    all keys, same chunk: causal, later chunk: skipped). Backward runs the ring again, the
//    keys' and values' gradients travelling with them back to their owner.
//  - a2a (Ulysses, DeepSpeed): an all-to-all turns [heads, sequence / CP] into
//    [heads / CP, sequence]; each rank attends its heads over the whole sequence and a second
//    all-to-all turns the output back. Needs the attention heads (per TP rank) divisible by CP;
//    key/value heads that are not are repeated to the query heads first.
// Packed documents: attention stays within each document (ids of the whole sequence, in natural
// order), as without CP. No [s, s] mask exists: p2p builds one [chunk, chunk] mask per block
// pair, a2a attends document by document.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

#include "loongforge/backend/communicator.h"
#include "loongforge/backend/device_backend.h"

namespace lf::parallel {

enum class CpCommType { p2p, a2a };
// "p2p" | "a2a"; anything else: an error naming parallel.cp_comm_type.
CpCommType parse_cp_comm_type(const std::string& name);
const char* to_string(CpCommType type);

// Where ring attention's time goes (tools/bench --cp-ring-overlap): seconds spent waiting for
// transfers, and in the whole forward/backward ring calls.
struct RingStats {
  double kv_wait_seconds = 0;   // waiting for the next key/value block (forward and backward)
  double dkv_wait_seconds = 0;  // waiting for the travelling key/value gradients (backward)
  double ring_seconds = 0;      // forward + backward ring calls in total
  int64_t calls = 0;            // forward + backward calls
};

struct ContextParallel {
  lf::backend::Communicator* group = nullptr;  // the CP group; null or size 1: off
  CpCommType comm = CpCommType::p2p;
  // The TP x CP group: the ranks a sequence's tokens are spread over under sequence parallelism
  // (MoE's routing statistics); null when not needed.
  lf::backend::Communicator* with_tp = nullptr;
  // p2p: the next block's transfer runs while this block is computed; false: each transfer is
  // waited for before the computation (the same numbers; for measuring what the overlap hides).
  bool overlap = true;
  RingStats* stats = nullptr;  // p2p: accumulates the ring's times when set
  bool on() const { return group && group->size() > 1; }
  int size() const { return on() ? group->size() : 1; }
  int rank() const { return on() ? group->rank() : 0; }
};

// The global chunk indices (of 2 cp chunks) rank `rank` holds, in its order.
std::pair<int64_t, int64_t> cp_chunks(int cp, int rank);
// The positions [s / cp] (int64, CPU) of this rank's tokens in a sequence of length s.
at::Tensor cp_positions(int64_t s, int cp, int rank);
// This rank's part of x along `dim` (length s, divisible by 2 cp): chunks r and 2 cp - 1 - r.
// A view-free copy; differentiable (the gradient of the other chunks is zero).
at::Tensor cp_slice(const at::Tensor& x, int64_t dim, int cp, int rank);

// x: [b, n, s / cp, d] (this rank's tokens, CP layout) -> [b, n, s, d], every rank's tokens in
// natural order. Differentiable: the backward sums the gradient over the CP ranks and keeps this
// rank's tokens (ChunkPipe under CP gathers each chunk's keys/values so).
at::Tensor cp_gather_sequence(const at::Tensor& x, const ContextParallel& cp);

// Attention over the CP group's whole sequence. q: [b, nq, s / cp, d], k: [b, nkv, s / cp, d],
// v: [b, nkv, s / cp, dv] for this rank's tokens (cp_slice layout), causal; documents: undefined
// or [b, s] int64 (CPU) ids of the WHOLE sequence in natural order (attention within each
// document). Returns [b, nq, s / cp, dv], differentiable in q, k, v. a2a needs `whole`: the
// attention of one rank's heads over the whole sequence in natural order (q, k, v [b, n, s, d],
// documents as given) -- the caller's causal or per-document attention.
using WholeSequenceAttention =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& documents)>;
at::Tensor context_parallel_attention(const lf::backend::DeviceBackend& be, const ContextParallel& cp,
                                      const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& documents, double scale, const WholeSequenceAttention& whole);

}  // namespace lf::parallel

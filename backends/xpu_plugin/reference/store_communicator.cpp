// The reference plugin's communicator: every collective moves bytes through the rendezvous store
// the engine lends it (set / wait / get / add callbacks). Simple, correct and slow: each op is a
// few store round trips per member and every payload passes through the store's server. It
// exists to test the plugin path end to end, not to train with.
//
// Invariants: members call collectives in the same order (as with NCCL), so the per-communicator
// sequence number names the same op on every member. Reductions run in rank order on every
// member, so all members get bitwise-identical results. Keys of a collective are deleted by the
// last member to finish reading them (a counter under the op's prefix); point-to-point keys are
// deleted by their receiver.
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "plugin_common.h"

struct lf_xpu_comm {
  lf_xpu_comm_config config;
  std::string group;
  uint64_t seq = 0;                                     // collectives issued so far
  std::map<std::pair<int, int>, uint64_t> sent, received;  // (peer, tag) -> messages
};

namespace lf::xpu_reference {
namespace {

using Bytes = std::vector<uint8_t>;

void sink_bytes(void* ctx, const void* data, size_t size) {
  auto* out = static_cast<Bytes*>(ctx);
  auto* b = static_cast<const uint8_t*>(data);
  out->assign(b, b + size);
}

std::string where(const lf_xpu_comm* c) {
  return "group '" + c->group + "' (index " + std::to_string(c->config.rank) + " of " +
         std::to_string(c->config.size) + ")";
}

void put(lf_xpu_comm* c, const std::string& key, const void* data, size_t size) {
  if (c->config.store.set(c->config.store.user, key.c_str(), data, size) != 0)
    throw StatusError(LF_XPU_ERROR, "store set of '" + key + "' failed in " + where(c));
}

Bytes take(lf_xpu_comm* c, const std::string& key) {
  const char* keys[] = {key.c_str()};
  if (c->config.store.wait(c->config.store.user, keys, 1, c->config.timeout_ms) != 0)
    throw StatusError(LF_XPU_TIMEOUT, "timed out after " + std::to_string(c->config.timeout_ms) +
                                          " ms waiting for '" + key + "' in " + where(c) +
                                          "; a member did not reach the same collective");
  Bytes out;
  if (c->config.store.get(c->config.store.user, key.c_str(), &sink_bytes, &out) != 0)
    throw StatusError(LF_XPU_ERROR, "store get of '" + key + "' failed in " + where(c));
  return out;
}

void drop(lf_xpu_comm* c, const std::string& key) {
  if (c->config.store.delete_key != nullptr) c->config.store.delete_key(c->config.store.user, key.c_str());
}

// Ends collective `prefix` (op number `op`): no member leaves before every member has read its
// payloads, so the keys can go and no member's store traffic for this op outlives the op. The
// last member to arrive deletes the payload keys and the previous op's "go" key (every member
// passed it before starting this op), then releases everyone with this op's "go" key.
void finish(lf_xpu_comm* c, const std::string& prefix, const std::vector<std::string>& keys) {
  int64_t n = 0;
  const std::string counter = prefix + "done", go = prefix + "go";
  if (c->config.store.add(c->config.store.user, counter.c_str(), 1, &n) != 0)
    throw StatusError(LF_XPU_ERROR, "store add of '" + counter + "' failed in " + where(c));
  if (n == c->config.size) {
    for (const auto& k : keys) drop(c, k);
    drop(c, counter);
    if (c->seq >= 2) drop(c, "c" + std::to_string(c->seq - 2) + "/go");
    put(c, go, "1", 1);
  }
  const char* keys_to_wait[] = {go.c_str()};
  if (c->config.store.wait(c->config.store.user, keys_to_wait, 1, c->config.timeout_ms) != 0)
    throw StatusError(LF_XPU_TIMEOUT, "timed out after " + std::to_string(c->config.timeout_ms) +
                                          " ms at the end of a collective in " + where(c) +
                                          "; a member did not finish it");
}

std::string next_prefix(lf_xpu_comm* c) { return "c" + std::to_string(c->seq++) + "/"; }

// The payload as a tensor of the view's dtype and shape (copied out of the store's bytes).
at::Tensor as_tensor(const Bytes& b, const at::Tensor& like, const std::string& key,
                     lf_xpu_comm* c) {
  const size_t want = like.numel() * like.element_size();
  if (b.size() != want)
    throw StatusError(LF_XPU_ERROR, "payload '" + key + "' has " + std::to_string(b.size()) +
                                        " bytes, expected " + std::to_string(want) + " in " +
                                        where(c) + "; members passed different shapes");
  auto t = at::empty(like.sizes(), like.options());
  if (want > 0) std::memcpy(t.data_ptr(), b.data(), want);
  return t;
}

void reduce_into(at::Tensor& acc, const at::Tensor& x, int32_t op) {
  switch (op) {
    case LF_XPU_SUM:
    case LF_XPU_AVG: acc.add_(x); return;
    case LF_XPU_MAX: acc.copy_(at::maximum(acc, x)); return;
    case LF_XPU_MIN: acc.copy_(at::minimum(acc, x)); return;
    case LF_XPU_PRODUCT: acc.mul_(x); return;
  }
  throw StatusError(LF_XPU_UNSUPPORTED, "unknown reduce op " + std::to_string(op));
}

void finish_avg(at::Tensor& acc, int32_t op, int size) {
  if (op != LF_XPU_AVG) return;
  if (at::isFloatingType(acc.scalar_type())) acc.div_(size);
  else acc.div_(size, "trunc");
}

// Reduces member r's `key_of(r)` payload shaped like `like`, in rank order.
template <class KeyOf>
at::Tensor reduce_all(lf_xpu_comm* c, const at::Tensor& like, int32_t op, KeyOf key_of) {
  at::Tensor acc;
  for (int r = 0; r < c->config.size; ++r) {
    auto t = as_tensor(take(c, key_of(r)), like, key_of(r), c);
    if (r == 0) acc = t;
    else reduce_into(acc, t, op);
  }
  finish_avg(acc, op, c->config.size);
  return acc;
}

const void* bytes_of(const at::Tensor& t) { return t.data_ptr(); }
size_t nbytes(const at::Tensor& t) { return t.numel() * t.element_size(); }

}  // namespace
}  // namespace lf::xpu_reference

using namespace lf::xpu_reference;

extern "C" {

int lf_xpu_ref_comm_create(const lf_xpu_comm_config* config, lf_xpu_comm** out) {
  return guarded([&] {
    if (config->size < 1 || config->rank < 0 || config->rank >= config->size)
      throw StatusError(LF_XPU_ERROR, "bad group: rank " + std::to_string(config->rank) +
                                          " of size " + std::to_string(config->size));
    auto* c = new lf_xpu_comm{*config, config->group_name ? config->group_name : "", 0, {}, {}};
    c->config.group_name = c->group.c_str();
    *out = c;
  });
}

int lf_xpu_ref_comm_destroy(lf_xpu_comm* comm) {
  delete comm;
  return LF_XPU_OK;
}

int lf_xpu_ref_all_reduce(lf_xpu_comm* c, lf_xpu_tensor* tensor, int32_t op) {
  return guarded([&] {
    auto t = from_view(tensor);
    const auto p = next_prefix(c);
    auto key = [&](int r) { return p + std::to_string(r); };
    auto mine = t.contiguous();
    put(c, key(c->config.rank), bytes_of(mine), nbytes(mine));
    t.copy_(reduce_all(c, mine, op, key));
    std::vector<std::string> keys;
    for (int r = 0; r < c->config.size; ++r) keys.push_back(key(r));
    finish(c, p, keys);
  });
}

int lf_xpu_ref_all_gather(lf_xpu_comm* c, lf_xpu_tensor* output, const lf_xpu_tensor* input) {
  return guarded([&] {
    auto out = from_view(output), in = from_view(input).contiguous();
    if (out.dim() < 1 || out.size(0) != in.size(0) * c->config.size)
      throw StatusError(LF_XPU_ERROR, "all_gather: output rows must be size * input rows");
    const auto p = next_prefix(c);
    auto key = [&](int r) { return p + std::to_string(r); };
    put(c, key(c->config.rank), bytes_of(in), nbytes(in));
    std::vector<std::string> keys;
    for (int r = 0; r < c->config.size; ++r) {
      out.narrow(0, r * in.size(0), in.size(0)).copy_(as_tensor(take(c, key(r)), in, key(r), c));
      keys.push_back(key(r));
    }
    finish(c, p, keys);
  });
}

int lf_xpu_ref_reduce_scatter(lf_xpu_comm* c, lf_xpu_tensor* output, const lf_xpu_tensor* input,
                              int32_t op) {
  return guarded([&] {
    auto out = from_view(output), in = from_view(input).contiguous();
    const int size = c->config.size;
    if (in.dim() < 1 || in.size(0) != out.size(0) * size)
      throw StatusError(LF_XPU_ERROR, "reduce_scatter: input rows must be size * output rows");
    const auto p = next_prefix(c);
    auto key = [&](int src, int dst) { return p + std::to_string(src) + "/" + std::to_string(dst); };
    const int64_t n = out.size(0);
    for (int dst = 0; dst < size; ++dst) {  // chunk dst goes to member dst only
      auto chunk = in.narrow(0, dst * n, n).contiguous();
      put(c, key(c->config.rank, dst), bytes_of(chunk), nbytes(chunk));
    }
    auto like = in.narrow(0, 0, n);
    out.copy_(reduce_all(c, like, op, [&](int src) { return key(src, c->config.rank); }));
    std::vector<std::string> keys;
    for (int s = 0; s < size; ++s)
      for (int d = 0; d < size; ++d) keys.push_back(key(s, d));
    finish(c, p, keys);
  });
}

int lf_xpu_ref_broadcast(lf_xpu_comm* c, lf_xpu_tensor* tensor, int32_t root) {
  return guarded([&] {
    if (root < 0 || root >= c->config.size)
      throw StatusError(LF_XPU_ERROR, "broadcast: root " + std::to_string(root) + " not in " +
                                          where(c));
    auto t = from_view(tensor);
    const auto p = next_prefix(c);
    const std::string key = p + "root";
    if (c->config.rank == root) {
      auto mine = t.contiguous();
      put(c, key, bytes_of(mine), nbytes(mine));
    } else {
      t.copy_(as_tensor(take(c, key), t, key, c));
    }
    finish(c, p, {key});
  });
}

int lf_xpu_ref_all_to_all(lf_xpu_comm* c, lf_xpu_tensor* output, const lf_xpu_tensor* input,
                          const int64_t* output_splits, const int64_t* input_splits) {
  return guarded([&] {
    auto out = from_view(output), in = from_view(input).contiguous();
    const int size = c->config.size;
    auto splits = [&](const int64_t* s, const at::Tensor& t) {
      std::vector<int64_t> v(size, t.size(0) / size);
      if (s != nullptr) v.assign(s, s + size);
      int64_t total = 0;
      for (auto x : v) total += x;
      if (total != t.size(0))
        throw StatusError(LF_XPU_ERROR, "all_to_all: splits sum to " + std::to_string(total) +
                                            " but the tensor has " + std::to_string(t.size(0)) +
                                            " rows in " + where(c));
      return v;
    };
    auto in_s = splits(input_splits, in), out_s = splits(output_splits, out);
    const auto p = next_prefix(c);
    auto key = [&](int src, int dst) { return p + std::to_string(src) + "/" + std::to_string(dst); };
    int64_t off = 0;
    for (int dst = 0; dst < size; ++dst) {
      auto chunk = in.narrow(0, off, in_s[dst]).contiguous();
      put(c, key(c->config.rank, dst), bytes_of(chunk), nbytes(chunk));
      off += in_s[dst];
    }
    off = 0;
    std::vector<std::string> keys;
    for (int src = 0; src < size; ++src) {
      auto dst_rows = out.narrow(0, off, out_s[src]);
      const auto k = key(src, c->config.rank);
      dst_rows.copy_(as_tensor(take(c, k), dst_rows, k, c));
      off += out_s[src];
      for (int d = 0; d < size; ++d) keys.push_back(key(src, d));
    }
    finish(c, p, keys);
  });
}

int lf_xpu_ref_send(lf_xpu_comm* c, const lf_xpu_tensor* tensor, int32_t dst, int32_t tag) {
  return guarded([&] {
    auto t = from_view(tensor).contiguous();
    const uint64_t n = c->sent[{dst, tag}]++;
    const std::string key = "p" + std::to_string(c->config.rank) + ">" + std::to_string(dst) +
                            "/" + std::to_string(tag) + "/" + std::to_string(n);
    put(c, key, bytes_of(t), nbytes(t));
  });
}

int lf_xpu_ref_recv(lf_xpu_comm* c, lf_xpu_tensor* tensor, int32_t src, int32_t tag) {
  return guarded([&] {
    auto t = from_view(tensor);
    const uint64_t n = c->received[{src, tag}]++;
    const std::string key = "p" + std::to_string(src) + ">" + std::to_string(c->config.rank) +
                            "/" + std::to_string(tag) + "/" + std::to_string(n);
    t.copy_(as_tensor(take(c, key), t, key, c));
    drop(c, key);
  });
}

int lf_xpu_ref_barrier(lf_xpu_comm* c) {
  // A one-element all_reduce: nobody leaves before everyone has arrived.
  int32_t one = 1;
  lf_xpu_tensor v{};
  v.data = &one;
  v.dtype = LF_XPU_INT32;
  v.ndim = 1;
  v.shape[0] = 1;
  v.strides[0] = 1;
  return lf_xpu_ref_all_reduce(c, &v, LF_XPU_SUM);
}

}  // extern "C"

#include "loongforge/parallel/pipeline/p2p.h"

#include <ATen/Functions.h>

#include <cstring>
#include <string>

#include "loongforge/core/error.h"

namespace lf::parallel::pipeline {
namespace {
// Tags: header and data of each direction apart, so a message can never be taken for another.
constexpr int kForwardHeader = 101, kBackwardHeader = 201;
// A named set: its manifest travels under its own tag, the tensors under the plain ones.
constexpr int kForwardManifest = 111, kBackwardManifest = 211;
// Manifest: [entries, message id, per entry (requires grad, name length), name bytes packed 8 per
// int64] as int64, fixed size.
constexpr int64_t kManifestSize = 2 + 2 * StageExchange::kMaxEntries + StageExchange::kMaxNameBytes / 8;
// Header: [dtype, ndim, dims[0..kMaxDims), message id (-1: unchecked)] as int64.
constexpr int64_t kHeaderSize = 3 + StageExchange::kMaxDims;

std::string where(const lf::backend::Communicator& pp, int peer, const char* what) {
  return "pipeline stage " + std::to_string(pp.rank()) + " of " + std::to_string(pp.size()) + ", " +
         what + " stage " + std::to_string(peer) + " (global rank " +
         std::to_string(pp.ranks()[static_cast<size_t>(peer)]) + ")";
}

// Runs f; an lf::Error from the communicator is rethrown with the stage and the peer in front.
template <class F>
auto naming(const lf::backend::Communicator& pp, int peer, const char* what, F&& f) {
  try {
    return f();
  } catch (const lf::Error& e) {
    LF_FAIL(where(pp, peer, what), ": ", e.what(),
            lf::hint("every stage must run the same schedule over the same number of "
                     "micro-batches; read the peer's log for its own error"));
  }
}
}  // namespace

StageExchange::StageExchange(lf::backend::Communicator& pp, c10::Device device)
    : pp_(pp), device_(device) {}

StageExchange::~StageExchange() {
  for (auto& p : pending_) {
    try {
      wait(p);
    } catch (...) {
    }
  }
}

void StageExchange::send(const at::Tensor& t, int peer, int tag_header, const char* what, int64_t id) {
  LF_CHECK(t.defined(), where(pp_, peer, what), ": nothing to send (undefined tensor)");
  LF_CHECK(t.dim() <= kMaxDims, where(pp_, peer, what), ": a ", t.dim(),
           "-dimensional tensor exceeds the header's ", kMaxDims, " dimensions");
  Pending p;
  p.peer = peer;
  p.what = what;
  p.data_tensor = t.detach().contiguous();
  std::vector<int64_t> h(kHeaderSize, 0);
  h[0] = static_cast<int64_t>(t.scalar_type());
  h[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) h[static_cast<size_t>(2 + d)] = t.size(d);
  h[kHeaderSize - 1] = id;
  p.header_tensor = at::tensor(h, at::TensorOptions().dtype(at::kLong)).to(device_);
  naming(pp_, peer, what, [&] {
    p.header = pp_.send(p.header_tensor, peer, tag_header, /*async=*/true);
    p.data = pp_.send(p.data_tensor, peer, tag_header + 1, /*async=*/true);
    return 0;
  });
  pending_.push_back(std::move(p));
}

at::Tensor StageExchange::recv(int peer, int tag_header, const char* what, int64_t id) {
  at::Tensor header = at::empty({kHeaderSize}, at::TensorOptions().dtype(at::kLong).device(device_));
  naming(pp_, peer, what, [&] { return pp_.recv(header, peer, tag_header); });
  const auto h = header.to(at::kCPU);
  const int64_t* v = h.data_ptr<int64_t>();
  LF_CHECK(v[1] >= 0 && v[1] <= kMaxDims && v[0] >= 0 &&
               v[0] < static_cast<int64_t>(at::ScalarType::NumOptions),
           where(pp_, peer, what), ": malformed shape header (dtype ", v[0], ", ", v[1], " dims)",
           lf::hint("the stages disagree on the order of messages: a schedule mismatch"));
  LF_CHECK(id < 0 || v[kHeaderSize - 1] == id, where(pp_, peer, what), ": got message ",
           v[kHeaderSize - 1], " while the schedule expects message ", id,
           lf::hint("the stages disagree on the order of messages: a schedule mismatch (same "
                    "micro-batch count and virtual stages on every stage?)"));
  std::vector<int64_t> sizes(v + 2, v + 2 + v[1]);
  for (int64_t s : sizes)
    LF_CHECK(s >= 0, where(pp_, peer, what), ": negative size in the shape header");
  at::Tensor t = at::empty(sizes, at::TensorOptions()
                                      .dtype(static_cast<at::ScalarType>(v[0]))
                                      .device(device_));
  naming(pp_, peer, what, [&] { return pp_.recv(t, peer, tag_header + 1); });
  return t;
}

void StageExchange::wait(Pending& p) {
  naming(pp_, p.peer, p.what, [&] {
    if (p.header) p.header->wait();
    if (p.data) p.data->wait();
    return 0;
  });
}

void StageExchange::flush() {
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& p : pending) wait(p);
}

void StageExchange::send_forward(const at::Tensor& activation) {
  if (!is_last()) send(activation, stage() + 1, kForwardHeader, "sending activations to");
}

at::Tensor StageExchange::recv_forward() {
  if (is_first()) return {};
  return recv(stage() - 1, kForwardHeader, "receiving activations from");
}

void StageExchange::send_backward(const at::Tensor& grad) {
  if (!is_first()) send(grad, stage() - 1, kBackwardHeader, "sending gradients to");
}

at::Tensor StageExchange::recv_backward() {
  if (is_last()) return {};
  return recv(stage() + 1, kBackwardHeader, "receiving gradients from");
}

void StageExchange::send_forward_ring(const at::Tensor& activation, int64_t id) {
  send(activation, (stage() + 1) % num_stages(), kForwardHeader, "sending activations to", id);
}

at::Tensor StageExchange::recv_forward_ring(int64_t id) {
  return recv((stage() + num_stages() - 1) % num_stages(), kForwardHeader, "receiving activations from", id);
}

void StageExchange::send_backward_ring(const at::Tensor& grad, int64_t id) {
  send(grad, (stage() + num_stages() - 1) % num_stages(), kBackwardHeader, "sending gradients to", id);
}

at::Tensor StageExchange::recv_backward_ring(int64_t id) {
  return recv((stage() + 1) % num_stages(), kBackwardHeader, "receiving gradients from", id);
}

at::Tensor StageExchange::send_forward_recv_backward(const at::Tensor& activation) {
  send_forward(activation);
  return recv_backward();
}

at::Tensor StageExchange::send_backward_recv_forward(const at::Tensor& grad) {
  send_backward(grad);
  return recv_forward();
}

int StageExchange::next_peer(bool ring) const {
  if (ring) return (stage() + 1) % num_stages();
  return is_last() ? -1 : stage() + 1;
}

int StageExchange::prev_peer(bool ring) const {
  if (ring) return (stage() + num_stages() - 1) % num_stages();
  return is_first() ? -1 : stage() - 1;
}

void StageExchange::send_map(const lf::data::TensorMap& m, int peer, int tag, const char* what, int64_t id) {
  LF_CHECK(static_cast<int>(m.size()) <= kMaxEntries, where(pp_, peer, what), ": ", m.size(),
           " tensors exceed the ", kMaxEntries, " a pipeline message carries (", m.describe(), ")");
  std::vector<int64_t> h(kManifestSize, 0);
  h[0] = static_cast<int64_t>(m.size());
  h[1] = id;
  std::string names;
  for (size_t i = 0; i < m.size(); ++i) {
    const auto& [name, t] = m.items()[i];
    LF_CHECK(t.defined(), where(pp_, peer, what), ": tensor '", name, "' is undefined");
    h[2 + 2 * i] = t.requires_grad() ? 1 : 0;
    h[3 + 2 * i] = static_cast<int64_t>(name.size());
    names += name;
  }
  LF_CHECK(static_cast<int>(names.size()) <= kMaxNameBytes, where(pp_, peer, what), ": the tensor names (",
           m.describe(), ") exceed ", kMaxNameBytes, " bytes");
  std::memcpy(h.data() + 2 + 2 * kMaxEntries, names.data(), names.size());
  Pending p;
  p.peer = peer;
  p.what = what;
  p.header_tensor = at::tensor(h, at::TensorOptions().dtype(at::kLong)).to(device_);
  naming(pp_, peer, what, [&] {
    p.header = pp_.send(p.header_tensor, peer, tag + 10, /*async=*/true);
    return 0;
  });
  pending_.push_back(std::move(p));
  for (const auto& [name, t] : m.items()) send(t, peer, tag, what, id);
}

lf::data::TensorMap StageExchange::recv_map(int peer, int tag, const char* what, int64_t id) {
  at::Tensor header = at::empty({kManifestSize}, at::TensorOptions().dtype(at::kLong).device(device_));
  naming(pp_, peer, what, [&] { return pp_.recv(header, peer, tag + 10); });
  const auto h = header.to(at::kCPU);
  const int64_t* v = h.data_ptr<int64_t>();
  LF_CHECK(v[0] >= 0 && v[0] <= kMaxEntries, where(pp_, peer, what), ": malformed manifest (", v[0], " entries)",
           lf::hint("the stages disagree on the order of messages: a schedule mismatch"));
  LF_CHECK(id < 0 || v[1] == id, where(pp_, peer, what), ": got message ", v[1], " while the schedule expects message ",
           id, lf::hint("the stages disagree on the order of messages: a schedule mismatch"));
  const char* names = reinterpret_cast<const char*>(v + 2 + 2 * kMaxEntries);
  int64_t at_ = 0;
  lf::data::TensorMap out;
  for (int64_t i = 0; i < v[0]; ++i) {
    const int64_t len = v[3 + 2 * i];
    LF_CHECK(len >= 0 && at_ + len <= kMaxNameBytes, where(pp_, peer, what), ": malformed manifest (name length ", len, ")");
    std::string name(names + at_, static_cast<size_t>(len));
    at_ += len;
    at::Tensor t = recv(peer, tag, what, id);
    if (v[2 + 2 * i]) t = t.detach().set_requires_grad(true);
    out.set(name, t);
  }
  return out;
}

void StageExchange::send_forward(const lf::data::TensorMap& activations, int64_t id, bool ring) {
  const int peer = next_peer(ring);
  if (peer >= 0) send_map(activations, peer, kForwardHeader, "sending activations to", id);
}

lf::data::TensorMap StageExchange::recv_forward_map(int64_t id, bool ring) {
  const int peer = prev_peer(ring);
  if (peer < 0) return {};
  return recv_map(peer, kForwardHeader, "receiving activations from", id);
}

void StageExchange::send_backward(const lf::data::TensorMap& grads, int64_t id, bool ring) {
  const int peer = prev_peer(ring);
  if (peer >= 0) send_map(grads, peer, kBackwardHeader, "sending gradients to", id);
}

lf::data::TensorMap StageExchange::recv_backward_map(int64_t id, bool ring) {
  const int peer = next_peer(ring);
  if (peer < 0) return {};
  return recv_map(peer, kBackwardHeader, "receiving gradients from", id);
}

}  // namespace lf::parallel::pipeline

#include "loongforge/parallel/pipeline/p2p.h"

#include <ATen/Functions.h>

#include <string>

#include "loongforge/core/error.h"

namespace lf::parallel::pipeline {
namespace {
// Tags: header and data of each direction apart, so a message can never be taken for another.
constexpr int kForwardHeader = 101, kForwardData = 102, kBackwardHeader = 201, kBackwardData = 202;
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

}  // namespace lf::parallel::pipeline

// Point-to-point exchange between adjacent pipeline stages over the pipeline group: activations
// go forward (stage k -> k+1), their gradients backward (k+1 -> k). Every message is a small
// shape header (dtype, rank, dims) followed by the data, so shapes are agreed at run time
// (variable sequence lengths work). What a micro-batch passes on is a named set of tensors
// (TensorMap: hidden states, and whatever else a model carries between stages, e.g. a VLM's
// visual taps), sent after a manifest that names the entries and says which carry gradients.
// Not a schedule (pipeline/schedules.h decides the order).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "loongforge/backend/communicator.h"
#include "loongforge/data/batch.h"

namespace lf::parallel::pipeline {

class StageExchange {
 public:
  // pp: this rank's pipeline group (group rank = stage index); `device`: where received tensors
  // are allocated. Timeouts are the communicator's. pp must outlive the exchange.
  StageExchange(lf::backend::Communicator& pp, c10::Device device);
  ~StageExchange();  // waits for sends still in flight (errors are swallowed: use flush())

  int stage() const { return pp_.rank(); }
  int num_stages() const { return pp_.size(); }
  bool is_first() const { return stage() == 0; }
  bool is_last() const { return stage() == num_stages() - 1; }

  // Single direction. On the stage without that neighbour: no-op / undefined tensor.
  void send_forward(const at::Tensor& activation);  // to the next stage
  at::Tensor recv_forward();                        // from the previous stage
  void send_backward(const at::Tensor& grad);       // to the previous stage
  at::Tensor recv_backward();                       // from the next stage
  // Both at once (1F1B steady state): the send is started asynchronously before the blocking
  // receive, so two neighbours exchanging in opposite directions never wait on each other.
  at::Tensor send_forward_recv_backward(const at::Tensor& activation);
  at::Tensor send_backward_recv_forward(const at::Tensor& grad);
  // The interleaved schedule's ring: activations go to stage (k + 1) % p (the last stage's model
  // chunk c feeds the first stage's chunk c + 1), gradients the other way. `id` names the message
  // (virtual stage and micro-batch): the receiver states the id it expects, and a different one is
  // an error naming both (the stages disagree on the schedule) instead of a silent mix-up.
  void send_forward_ring(const at::Tensor& activation, int64_t id);
  at::Tensor recv_forward_ring(int64_t id);
  void send_backward_ring(const at::Tensor& grad, int64_t id);
  at::Tensor recv_backward_ring(int64_t id);
  // Named sets, in the same directions and with the same ring ids (id -1: unchecked). A received
  // entry that required grad on the sender arrives as a leaf that requires grad; gradients go
  // back as a map of those entries only (same names). At most kMaxEntries entries and
  // kMaxNameBytes bytes of names.
  void send_forward(const lf::data::TensorMap& activations, int64_t id = -1, bool ring = false);
  lf::data::TensorMap recv_forward_map(int64_t id = -1, bool ring = false);
  void send_backward(const lf::data::TensorMap& grads, int64_t id = -1, bool ring = false);
  lf::data::TensorMap recv_backward_map(int64_t id = -1, bool ring = false);
  static constexpr int kMaxEntries = 16;
  static constexpr int kMaxNameBytes = 256;

  // Waits for every send started so far (rethrows its failure naming stage and peer).
  void flush();
  // Every stage of the group waits for the others (aligned step timing for traces).
  void barrier() { pp_.barrier(); }

  // Dimensions a header can carry.
  static constexpr int kMaxDims = 8;

 private:
  struct Pending {
    std::shared_ptr<lf::backend::Work> header, data;
    at::Tensor header_tensor, data_tensor;  // kept alive until the sends complete
    int peer = 0;
    const char* what = "";
  };
  void send(const at::Tensor& t, int peer, int tag, const char* what, int64_t id = -1);
  at::Tensor recv(int peer, int tag, const char* what, int64_t id = -1);
  void send_map(const lf::data::TensorMap& m, int peer, int tag, const char* what, int64_t id);
  lf::data::TensorMap recv_map(int peer, int tag, const char* what, int64_t id);
  int next_peer(bool ring) const;  // -1: none (the last stage without the ring)
  int prev_peer(bool ring) const;
  void wait(Pending& p);

  lf::backend::Communicator& pp_;
  c10::Device device_;
  std::vector<Pending> pending_;
};

}  // namespace lf::parallel::pipeline

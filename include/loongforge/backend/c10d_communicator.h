// C10dCommunicator: lf::backend::Communicator over any c10d engine (ProcessGroupGloo here,
// ProcessGroupNCCL in backends/cuda), with ReduceOp::avg emulated where the engine lacks it and
// every engine failure or timeout turned into an lf::Error naming the op, the group and its ranks.
// It does not create engines (make_gloo_communicator below does, for Gloo) and has no transport
// of its own.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <string>

#include "loongforge/backend/communicator.h"

namespace lf::backend {

struct C10dCommunicatorOptions {
  // The engine reduces ReduceOp::AVG itself (NCCL); otherwise avg = sum, then divide by size.
  bool native_avg = false;
};

class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(const CommunicatorSpec& spec, c10::intrusive_ptr<c10d::Backend> engine,
                   C10dCommunicatorOptions options = {});
  ~C10dCommunicator() override;

  int rank() const override { return group_rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::string& name() const override { return name_; }
  const std::vector<int>& ranks() const override { return ranks_; }

  // Roots, destinations and sources are group ranks (indices into ranks()). Outputs and in-place
  // tensors must be contiguous; inputs are never modified. With async = false the op has finished
  // when the call returns (nullptr is returned); with async = true read results after wait().
  std::shared_ptr<Work> all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::sum,
                                   bool async = false) override;
  std::shared_ptr<Work> all_gather(at::Tensor& output, const at::Tensor& input,
                                   bool async = false) override;
  std::shared_ptr<Work> reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                       ReduceOp op = ReduceOp::sum, bool async = false) override;
  std::shared_ptr<Work> broadcast(at::Tensor& tensor, int root, bool async = false) override;
  std::shared_ptr<Work> all_to_all(at::Tensor& output, const at::Tensor& input,
                                   const std::vector<int64_t>& output_splits,
                                   const std::vector<int64_t>& input_splits,
                                   bool async = false) override;
  std::shared_ptr<Work> send(const at::Tensor& tensor, int dst, int tag = 0,
                             bool async = false) override;
  std::shared_ptr<Work> recv(at::Tensor& tensor, int src, int tag = 0, bool async = false) override;
  void barrier() override;

  const c10::intrusive_ptr<c10d::Backend>& engine() const { return engine_; }

  // "<op> on group '<name>' (ranks [..], this rank's index k)": the prefix of every error.
  std::string describe_op(const char* op) const;

 private:
  // Runs `start` (which launches the c10d op and returns its Work), then waits unless async;
  // `finish` runs after a successful wait (e.g. the avg division). Translates exceptions.
  std::shared_ptr<Work> run(const char* op, bool async,
                            const std::function<c10::intrusive_ptr<c10d::Work>()>& start,
                            std::function<void()> finish = {});

  std::string name_;
  std::vector<int> ranks_;
  int group_rank_;
  int global_rank_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Backend> engine_;
  C10dCommunicatorOptions options_;
};

// Gloo (CPU) engine settings. Empty strings fall back to the environment.
struct GlooOptions {
  // Network interface to bind (like GLOO_SOCKET_IFNAME); default: $GLOO_SOCKET_IFNAME, else the
  // local address that routes to master_addr (loopback when master_addr is local).
  std::string interface;
  std::string master_addr;  // default: $MASTER_ADDR, else 127.0.0.1
  int threads = 1;          // Gloo worker threads per group; ops of one group run in order anyway
};

// Creates a ProcessGroupGloo over spec.store (which must already be prefixed for this group),
// connecting the full mesh of spec.ranks; every member must call it for the same group in the
// same order. Failures name the group, its ranks and the timeout.
std::unique_ptr<Communicator> make_gloo_communicator(const CommunicatorSpec& spec,
                                                     const GlooOptions& options = {});

// "<op> on group '<name>' (ranks [..], this rank's index k)": how every communicator names a
// collective in its errors.
std::string describe_group_op(const char* op, const std::string& name,
                              const std::vector<int>& ranks, int group_rank);
// The remedy every communicator prints with a failed or timed-out collective.
std::string collective_failure_hint(std::chrono::milliseconds timeout);

// The local IPv4 address the kernel would use to reach `host` (no packet is sent); "127.0.0.1"
// for a loopback host. Throws lf::Error if `host` does not resolve.
std::string local_address_towards(const std::string& host);

}  // namespace lf::backend

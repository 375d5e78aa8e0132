// Communicator: the collective and point-to-point interface every device backend provides
// (c10d Gloo on CPU, c10d NCCL on CUDA, the XPU plugin's own). One object per process group.
// It is not a process-group manager: dist::ParallelContext builds and owns the groups.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace lf::backend {

enum class ReduceOp { sum, avg, max, min, product };
const char* to_string(ReduceOp op);

// Handle of an operation started with async = true. wait() rethrows a failure or timeout as
// lf::Error naming the operation, the group and its ranks.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};

// What a backend needs to build one group's communicator.
struct CommunicatorSpec {
  std::string name;            // e.g. "tp", "dp-cp"; shown in errors with the ranks
  std::vector<int> ranks;      // global ranks of the members, in group-rank order
  int group_rank = 0;          // this process's index in `ranks`
  int global_rank = 0;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // Rendezvous store, already prefixed so that the group's keys do not clash with other groups.
  c10::intrusive_ptr<c10d::Store> store;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;   // rank within the group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;
  virtual const std::vector<int>& ranks() const = 0;  // global ranks of the members

  // In place. avg divides after summing where the engine lacks AVG (Gloo).
  virtual std::shared_ptr<Work> all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::sum,
                                           bool async = false) = 0;
  // output: [size * n, ...] = concatenation of every member's input [n, ...] along dim 0.
  virtual std::shared_ptr<Work> all_gather(at::Tensor& output, const at::Tensor& input,
                                           bool async = false) = 0;
  // input: [size * n, ...]; output: [n, ...] = reduction of every member's rank-th chunk.
  virtual std::shared_ptr<Work> reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                               ReduceOp op = ReduceOp::sum,
                                               bool async = false) = 0;
  virtual std::shared_ptr<Work> broadcast(at::Tensor& tensor, int root, bool async = false) = 0;
  // Uneven splits along dim 0: input_splits[i] rows go to member i, output_splits[i] rows come
  // from member i. Empty split vectors mean equal splits.
  virtual std::shared_ptr<Work> all_to_all(at::Tensor& output, const at::Tensor& input,
                                           const std::vector<int64_t>& output_splits,
                                           const std::vector<int64_t>& input_splits,
                                           bool async = false) = 0;
  virtual std::shared_ptr<Work> send(const at::Tensor& tensor, int dst, int tag = 0,
                                     bool async = false) = 0;
  virtual std::shared_ptr<Work> recv(at::Tensor& tensor, int src, int tag = 0,
                                     bool async = false) = 0;
  virtual void barrier() = 0;
};

}  // namespace lf::backend

// C10dCommunicator (see c10d_communicator.h): each op checks its arguments (so shape mistakes get
// a precise message, not an engine error), starts the c10d op, and waits unless async. Engine
// failures are rethrown as lf::Error naming the op, the group, its ranks and this rank's index.
#include "loongforge/backend/c10d_communicator.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <numeric>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/core/strings.h"

namespace lf::backend {
namespace {

std::string join(const std::vector<int>& v) { return lf::bracket_list(v); }

std::string seconds(std::chrono::milliseconds t) {
  std::ostringstream os;
  os << static_cast<double>(t.count()) / 1000.0 << " s";
  return os.str();
}

// Rethrows the exception in flight as lf::Error. Must be called inside a catch block.
[[noreturn]] void rethrow_translated(const std::string& what_op,
                                    std::chrono::milliseconds timeout) {
  std::string message;
  try {
    throw;
  } catch (const lf::Error&) {
    throw;
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  } catch (const std::exception& e) {
    message = e.what();
  }
  LF_FAIL(what_op, " failed: ", message, lf::hint(collective_failure_hint(timeout)));
}

c10d::ReduceOp to_c10d(ReduceOp op, bool native_avg) {
  switch (op) {
    case ReduceOp::sum: return c10d::ReduceOp::SUM;
    case ReduceOp::avg: return native_avg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
    case ReduceOp::max: return c10d::ReduceOp::MAX;
    case ReduceOp::min: return c10d::ReduceOp::MIN;
    case ReduceOp::product: return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

// avg on an engine without AVG: the engine summed, divide here. Integers divide with truncation.
void divide_in_place(at::Tensor& t, int size) {
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) t.div_(size, "trunc");
  else t.div_(size);
}

class C10dWork final : public Work {
 public:
  C10dWork(std::string what_op, std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Work> w,
           std::function<void()> finish)
      : what_op_(std::move(what_op)), timeout_(timeout), work_(std::move(w)),
        finish_(std::move(finish)) {}

  void wait() override {
    if (done_) return;
    try {
      work_->wait();
    } catch (...) {
      rethrow_translated(what_op_, timeout_);
    }
    if (finish_) finish_();
    done_ = true;
  }
  // True once the engine finished; results of an emulated avg appear only after wait().
  bool is_completed() override { return done_ || work_->isCompleted(); }

 private:
  std::string what_op_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> finish_;
  bool done_ = false;
};

}  // namespace

std::string describe_group_op(const char* op, const std::string& name,
                              const std::vector<int>& ranks, int group_rank) {
  return lf::str(op, " on group '", name, "' (ranks ", join(ranks), ", this rank's index ",
                 group_rank, ")");
}

std::string collective_failure_hint(std::chrono::milliseconds timeout) {
  return "a peer of this group may have died or skipped this operation (every member must issue "
         "the same collectives in the same order), or the timeout (" +
         seconds(timeout) +
         ", --distributed-timeout-minutes) is too small; read the other ranks' logs";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::product: return "product";
  }
  return "?";
}

C10dCommunicator::C10dCommunicator(const CommunicatorSpec& spec,
                                   c10::intrusive_ptr<c10d::Backend> engine,
                                   C10dCommunicatorOptions options)
    : name_(spec.name), ranks_(spec.ranks), group_rank_(spec.group_rank),
      global_rank_(spec.global_rank), timeout_(spec.timeout), engine_(std::move(engine)),
      options_(options) {
  LF_CHECK(engine_, "group '", name_, "' (ranks ", join(ranks_), ") has no c10d engine");
  LF_CHECK(group_rank_ >= 0 && group_rank_ < static_cast<int>(ranks_.size()) &&
               ranks_[group_rank_] == global_rank_,
           "group '", name_, "': group rank ", group_rank_, " does not hold global rank ",
           global_rank_, " in ranks ", join(ranks_));
  LF_CHECK(engine_->getSize() == size() && engine_->getRank() == group_rank_, "group '", name_,
           "' (ranks ", join(ranks_), "): the engine has size ", engine_->getSize(), " and rank ",
           engine_->getRank(), ", expected ", size(), " and ", group_rank_);
}

C10dCommunicator::~C10dCommunicator() = default;

std::string C10dCommunicator::describe_op(const char* op) const {
  return describe_group_op(op, name_, ranks_, group_rank_);
}

std::shared_ptr<Work> C10dCommunicator::run(
    const char* op, bool async, const std::function<c10::intrusive_ptr<c10d::Work>()>& start,
    std::function<void()> finish) {
  c10::intrusive_ptr<c10d::Work> w;
  try {
    w = start();
  } catch (...) {
    rethrow_translated(describe_op(op), timeout_);
  }
  auto work =
      std::make_shared<C10dWork>(describe_op(op), timeout_, std::move(w), std::move(finish));
  if (async) return work;
  work->wait();
  return nullptr;
}

std::shared_ptr<Work> C10dCommunicator::all_reduce(at::Tensor& tensor, ReduceOp op, bool async) {
  LF_CHECK(tensor.defined() && tensor.is_contiguous(), describe_op("all_reduce"),
           ": the tensor must be defined and contiguous");
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op, options_.native_avg);
  opts.timeout = timeout_;
  std::function<void()> finish;
  if (op == ReduceOp::avg && !options_.native_avg) {
    at::Tensor t = tensor;
    int n = size();
    finish = [t, n]() mutable { divide_in_place(t, n); };
  }
  return run("all_reduce", async, [&] { return engine_->allreduce(tensors, opts); },
             std::move(finish));
}

std::shared_ptr<Work> C10dCommunicator::all_gather(at::Tensor& output, const at::Tensor& input,
                                                   bool async) {
  LF_CHECK(output.defined() && input.defined() && output.is_contiguous(),
           describe_op("all_gather"), ": tensors must be defined and the output contiguous");
  LF_CHECK(input.dim() >= 1 && output.dim() == input.dim() &&
               output.size(0) == input.size(0) * size() &&
               output.numel() == input.numel() * size() &&
               output.scalar_type() == input.scalar_type(),
           describe_op("all_gather"), ": output ", output.sizes(), " ", output.scalar_type(),
           " must be [", size(), " * n, ...] for input ", input.sizes(), " ", input.scalar_type());
  // In place (the input is this rank's slot of the output, as ZeRO-1 gathers parameters): the
  // engines copy the input into that slot first, so give them a separate copy.
  const bool aliases = input.has_storage() && output.has_storage() && input.storage().is_alias_of(output.storage());
  at::Tensor in = aliases ? input.clone() : input.contiguous();
  c10d::AllgatherOptions opts;
  opts.timeout = timeout_;
  return run("all_gather", async, [&] { return engine_->_allgather_base(output, in, opts); });
}

std::shared_ptr<Work> C10dCommunicator::reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                                       ReduceOp op, bool async) {
  LF_CHECK(output.defined() && input.defined() && output.is_contiguous(),
           describe_op("reduce_scatter"), ": tensors must be defined and the output contiguous");
  LF_CHECK(output.dim() >= 1 && output.dim() == input.dim() &&
               input.size(0) == output.size(0) * size() &&
               input.numel() == output.numel() * size() &&
               output.scalar_type() == input.scalar_type(),
           describe_op("reduce_scatter"), ": input ", input.sizes(), " ", input.scalar_type(),
           " must be [", size(), " * n, ...] for output ", output.sizes(), " ",
           output.scalar_type());
  at::Tensor in = input.contiguous();
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = to_c10d(op, options_.native_avg);
  opts.timeout = timeout_;
  std::function<void()> finish;
  if (op == ReduceOp::avg && !options_.native_avg) {
    at::Tensor t = output;
    int n = size();
    finish = [t, n]() mutable { divide_in_place(t, n); };
  }
  return run("reduce_scatter", async,
             [&] { return engine_->_reduce_scatter_base(output, in, opts); }, std::move(finish));
}

std::shared_ptr<Work> C10dCommunicator::broadcast(at::Tensor& tensor, int root, bool async) {
  LF_CHECK(tensor.defined() && tensor.is_contiguous(), describe_op("broadcast"),
           ": the tensor must be defined and contiguous");
  LF_CHECK(root >= 0 && root < size(), describe_op("broadcast"), ": root ", root,
           " is not a group rank (group size ", size(), ")",
           lf::hint("roots, sources and destinations are indices into the group's ranks"));
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = timeout_;
  return run("broadcast", async, [&] { return engine_->broadcast(tensors, opts); });
}

std::shared_ptr<Work> C10dCommunicator::all_to_all(at::Tensor& output, const at::Tensor& input,
                                                   const std::vector<int64_t>& output_splits,
                                                   const std::vector<int64_t>& input_splits,
                                                   bool async) {
  const char* op = "all_to_all";
  LF_CHECK(output.defined() && input.defined() && output.is_contiguous(), describe_op(op),
           ": tensors must be defined and the output contiguous");
  LF_CHECK(input.dim() >= 1 && output.dim() == input.dim() &&
               output.scalar_type() == input.scalar_type(),
           describe_op(op), ": input ", input.sizes(), " ", input.scalar_type(), " and output ",
           output.sizes(), " ", output.scalar_type(), " must have the same rank and dtype");
  auto check_splits = [&](const std::vector<int64_t>& splits, const at::Tensor& t,
                          const char* which) {
    if (splits.empty()) {
      LF_CHECK(t.size(0) % size() == 0, describe_op(op), ": equal splits need the ", which,
               " rows (", t.size(0), ") divisible by the group size ", size());
      return;
    }
    int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t{0});
    LF_CHECK(static_cast<int>(splits.size()) == size() && total == t.size(0), describe_op(op),
             ": ", which, " splits (", splits.size(), " entries summing to ", total,
             ") must have one entry per member (", size(), ") and sum to the ", which,
             " rows (", t.size(0), ")");
  };
  check_splits(input_splits, input, "input");
  check_splits(output_splits, output, "output");
  at::Tensor in = input.contiguous();
  std::vector<int64_t> out_s = output_splits, in_s = input_splits;
  c10d::AllToAllOptions opts;
  opts.timeout = timeout_;
  return run(op, async, [&] { return engine_->alltoall_base(output, in, out_s, in_s, opts); });
}

std::shared_ptr<Work> C10dCommunicator::send(const at::Tensor& tensor, int dst, int tag,
                                             bool async) {
  LF_CHECK(dst >= 0 && dst < size() && dst != group_rank_, describe_op("send"), ": destination ",
           dst, " must be another group rank (group size ", size(), ")",
           lf::hint("sources and destinations are indices into the group's ranks"));
  std::vector<at::Tensor> tensors{tensor.contiguous()};
  return run("send", async, [&] { return engine_->send(tensors, dst, tag); });
}

std::shared_ptr<Work> C10dCommunicator::recv(at::Tensor& tensor, int src, int tag, bool async) {
  LF_CHECK(tensor.defined() && tensor.is_contiguous(), describe_op("recv"),
           ": the tensor must be defined and contiguous");
  LF_CHECK(src >= 0 && src < size() && src != group_rank_, describe_op("recv"), ": source ", src,
           " must be another group rank (group size ", size(), ")",
           lf::hint("sources and destinations are indices into the group's ranks"));
  std::vector<at::Tensor> tensors{tensor};
  return run("recv", async, [&] { return engine_->recv(tensors, src, tag); });
}

void C10dCommunicator::barrier() {
  c10d::BarrierOptions opts;
  opts.timeout = timeout_;
  run("barrier", false, [&] { return engine_->barrier(opts); });
}

}  // namespace lf::backend

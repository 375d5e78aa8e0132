// TP / SP mappings (parallel/tensor/mappings.h). Each Function's backward is the adjoint of its
// forward as a linear map over the TP group's stacked tensors; the duality is stated per Function.
#include "loongforge/parallel/tensor/mappings.h"

#include <ATen/Functions.h>
#include <torch/csrc/autograd/custom_function.h>

#include "loongforge/core/error.h"

namespace lf::parallel {
namespace comm {
namespace {
int64_t wrap(int64_t dim, const at::Tensor& x) { return dim < 0 ? dim + x.dim() : dim; }
}  // namespace

at::Tensor all_reduce(const at::Tensor& x, Communicator& tp) {
  at::Tensor y = x.clone(at::MemoryFormat::Contiguous);
  tp.all_reduce(y, lf::backend::ReduceOp::sum);
  return y;
}

at::Tensor all_gather(const at::Tensor& x, Communicator& tp, int64_t dim) {
  dim = wrap(dim, x);
  // Gather along dim 0 of a view with `dim` moved to the front, then move it back.
  at::Tensor front = x.movedim(dim, 0).contiguous();
  auto sizes = front.sizes().vec();
  sizes[0] *= tp.size();
  at::Tensor out = at::empty(sizes, front.options());
  tp.all_gather(out, front);
  return out.movedim(0, dim).contiguous();
}

at::Tensor reduce_scatter(const at::Tensor& x, Communicator& tp, int64_t dim) {
  dim = wrap(dim, x);
  LF_CHECK(x.size(dim) % tp.size() == 0, "reduce-scatter over group '", tp.name(), "': dim ", dim,
           " of size ", x.size(dim), " does not divide by the group size ", tp.size());
  at::Tensor front = x.movedim(dim, 0).contiguous();
  auto sizes = front.sizes().vec();
  sizes[0] /= tp.size();
  at::Tensor out = at::empty(sizes, front.options());
  tp.reduce_scatter(out, front, lf::backend::ReduceOp::sum);
  return out.movedim(0, dim).contiguous();
}

at::Tensor split(const at::Tensor& x, Communicator& tp, int64_t dim) {
  dim = wrap(dim, x);
  LF_CHECK(x.size(dim) % tp.size() == 0, "splitting over group '", tp.name(), "': dim ", dim,
           " of size ", x.size(dim), " does not divide by the group size ", tp.size(),
           lf::hint("sizes split by tensor parallelism must be multiples of tp"));
  const int64_t n = x.size(dim) / tp.size();
  return x.narrow(dim, tp.rank() * n, n).contiguous();
}

at::Tensor all_to_all_rows(const at::Tensor& x, Communicator& group, const std::vector<int64_t>& out_splits,
                           const std::vector<int64_t>& in_splits) {
  int64_t rows = 0;
  for (int64_t n : out_splits) rows += n;
  auto sizes = x.sizes().vec();
  sizes[0] = rows;
  at::Tensor out = at::empty(sizes, x.options());
  group.all_to_all(out, x.contiguous(), out_splits, in_splits);
  return out;
}
}  // namespace comm

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The communicator travels to backward as an integer (IValues cannot hold pointers); it outlives
// the graph by contract (the ParallelContext owns it).
void save_comm(AutogradContext* ctx, Communicator* c) {
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(c));
}
Communicator& saved_comm(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

// Duality: identity is self-adjoint on each rank, but the replicas' gradients are partial sums,
// so the adjoint of "copy one tensor to every rank" is "sum the ranks' gradients".
struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* c) {
    save_comm(ctx, c);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    return {comm::all_reduce(dy[0], saved_comm(ctx)), at::Tensor()};
  }
};

// A replicated consumer whose gradient is already whole on every rank, inside a region whose
// entry sums the ranks' gradients: rank 0 passes it on, the others pass zeros, so the sum counts it
// once. No communication.
struct OnceOverTp : torch::autograd::Function<OnceOverTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* c) {
    ctx->saved_data["first"] = c->rank() == 0;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    return {ctx->saved_data["first"].toBool() ? dy[0] : at::zeros_like(dy[0]), at::Tensor()};
  }
};

// Duality: the adjoint of "sum over ranks, result on every rank" is "copy the gradient to every
// rank" (each rank already holds the full output gradient): identity.
struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* c) {
    return comm::all_reduce(x, *c);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    return {dy[0], at::Tensor()};
  }
};

// Duality: split along the last dim <-> all-gather along the last dim (each rank contributes the
// gradient of its own slice).
struct ScatterToTp : torch::autograd::Function<ScatterToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* c) {
    save_comm(ctx, c);
    return comm::split(x, *c, -1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    return {comm::all_gather(dy[0], saved_comm(ctx), -1), at::Tensor()};
  }
};

// Duality: all-gather along the last dim <-> take this rank's slice of the gradient (every rank
// holds the same full gradient, so no sum is needed).
struct GatherFromTp : torch::autograd::Function<GatherFromTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* c) {
    save_comm(ctx, c);
    return comm::all_gather(x, *c, -1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    return {comm::split(dy[0], saved_comm(ctx), -1), at::Tensor()};
  }
};

// Duality: split the sequence (dim 0) <-> all-gather the sequence gradient.
struct ScatterToSp : torch::autograd::Function<ScatterToSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* c) {
    save_comm(ctx, c);
    return comm::split(x, *c, 0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    return {comm::all_gather(dy[0], saved_comm(ctx), 0), at::Tensor()};
  }
};

// Duality: all-gather the sequence <-> reduce-scatter the gradient: every rank's full-sequence
// gradient is a partial sum (its TP shard of the consumer), and the adjoint of "concatenate the
// chunks onto every rank" sums those partials and gives each rank its chunk.
struct GatherFromSp : torch::autograd::Function<GatherFromSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* c) {
    save_comm(ctx, c);
    return comm::all_gather(x, *c, 0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    return {comm::reduce_scatter(dy[0], saved_comm(ctx), 0), at::Tensor()};
  }
};

// Duality: reduce-scatter of the sequence <-> all-gather of the gradient (the adjoint of the
// above, with the roles of forward and backward swapped).
struct ReduceScatterToSp : torch::autograd::Function<ReduceScatterToSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* c) {
    save_comm(ctx, c);
    return comm::reduce_scatter(x, *c, 0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    return {comm::all_gather(dy[0], saved_comm(ctx), 0), at::Tensor()};
  }
};
// Duality: all-gather of the shares along dim 0 <-> each rank's slice of the gradient. The
// consumers of the gathered tensor are replicated over the group (a heterogeneous encoder's
// outputs feeding a foundation whose ranks all compute the same loss), so every rank's gradient is
// already the whole gradient: the adjoint keeps this rank's rows, with no sum.
struct GatherFromShares : torch::autograd::Function<GatherFromShares> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* c) {
    save_comm(ctx, c);
    return comm::all_gather(x, *c, 0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list dy) {
    return {comm::split(dy[0], saved_comm(ctx), 0), at::Tensor()};
  }
};

// Adjoint of an all-to-all with splits (out, in) is the all-to-all with splits (in, out).
struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* c,
                            const std::vector<int64_t>& out_splits, const std::vector<int64_t>& in_splits) {
    save_comm(ctx, c);
    ctx->saved_data["out"] = out_splits;
    ctx->saved_data["in"] = in_splits;
    return comm::all_to_all_rows(x, *c, out_splits, in_splits);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {comm::all_to_all_rows(g[0], saved_comm(ctx), ctx->saved_data["in"].toIntVector(),
                                  ctx->saved_data["out"].toIntVector()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
}  // namespace

at::Tensor all_to_all_rows(const at::Tensor& x, Communicator& group, const std::vector<int64_t>& out_splits,
                           const std::vector<int64_t>& in_splits) {
  return AllToAllRows::apply(x, &group, out_splits, in_splits);
}

at::Tensor gather_from_shares(const at::Tensor& x, Communicator& group) {
  return group.size() == 1 ? x : GatherFromShares::apply(x, &group);
}

at::Tensor gather_rows_from_shares(const at::Tensor& x, Communicator& group) {
  if (group.size() == 1) return x;
  const at::Tensor rows = comm::all_gather(at::full({1}, x.size(0), x.options().dtype(at::kLong)), group, 0).to(at::kCPU);
  int64_t most = 0;
  for (int64_t r = 0; r < rows.size(0); ++r) most = std::max(most, rows[r].item<int64_t>());
  std::vector<int64_t> pad(static_cast<size_t>(2 * x.dim()), 0);
  pad.back() = most - x.size(0);  // rows appended at the end of dim 0
  const at::Tensor all = gather_from_shares(at::constant_pad_nd(x, pad, 0), group);  // [g * most, ...]
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < rows.size(0); ++r) parts.push_back(all.narrow(0, r * most, rows[r].item<int64_t>()));
  return at::cat(parts);
}

at::Tensor copy_to_tp(const at::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : CopyToTp::apply(x, &tp);
}
at::Tensor once_over_tp(const at::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : OnceOverTp::apply(x, &tp);
}
at::Tensor reduce_from_tp(const at::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : ReduceFromTp::apply(x, &tp);
}
at::Tensor scatter_to_tp(const at::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : ScatterToTp::apply(x, &tp);
}
at::Tensor gather_from_tp(const at::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : GatherFromTp::apply(x, &tp);
}
at::Tensor scatter_to_sequence_parallel(const at::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : ScatterToSp::apply(x, &tp);
}
at::Tensor gather_from_sequence_parallel(const at::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : GatherFromSp::apply(x, &tp);
}
at::Tensor reduce_scatter_to_sequence_parallel(const at::Tensor& x, Communicator& tp) {
  return tp.size() == 1 ? x : ReduceScatterToSp::apply(x, &tp);
}

}  // namespace lf::parallel

// Vocab-parallel cross entropy (parallel/tensor/cross_entropy.h).
#include "loongforge/parallel/tensor/cross_entropy.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>

#include "loongforge/core/error.h"

namespace lf::parallel {
namespace {
using lf::backend::Communicator;
using lf::backend::ReduceOp;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void all_reduce(at::Tensor& t, Communicator& tp, ReduceOp op) {
  if (tp.size() > 1) tp.all_reduce(t, op);
}

// Forward: loss_i = log(sum_j exp(z_ij - m_i)) - (z_i,t_i - m_i), every sum over all ranks'
// columns. Backward: dz_ij = dloss_i * (softmax_ij - [j == t_i]) on this rank's columns only;
// no collective is needed because each rank owns the gradient of exactly its own columns.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, Communicator* tp, int64_t vocab_size,
                            int64_t ignore_index) {
    const int64_t cols = logits.size(1), start = tp->rank() * cols;
    at::Tensor z = logits.to(at::kFloat);
    if (start + cols > vocab_size) {  // this rank holds padding columns (known without a sync)
      at::Tensor padding = at::arange(start, start + cols, target.options()) >= vocab_size;
      z = z.masked_fill(padding.unsqueeze(0), -std::numeric_limits<float>::infinity());
    }

    at::Tensor max = std::get<0>(z.max(1));  // [n]
    all_reduce(max, *tp, ReduceOp::max);
    z = z - max.unsqueeze(1);

    at::Tensor ignored = target == ignore_index;
    at::Tensor mine = (target >= start).logical_and(target < start + cols).logical_and(ignored.logical_not());
    at::Tensor local_target = (target - start).masked_fill(mine.logical_not(), 0);
    at::Tensor target_logit = z.gather(1, local_target.unsqueeze(1)).squeeze(1).masked_fill(
        mine.logical_not(), 0.0);
    at::Tensor exp = z.exp();
    // One reduction for both sums: [2, n].
    at::Tensor sums = at::stack({target_logit, exp.sum(1)}).contiguous();
    all_reduce(sums, *tp, ReduceOp::sum);
    at::Tensor loss = (sums[1].log() - sums[0]).masked_fill(ignored, 0.0);

    ctx->save_for_backward({exp.div_(sums[1].unsqueeze(1)), local_target, mine, ignored});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list dloss) {
    auto s = ctx->get_saved_variables();
    at::Tensor grad = s[0];  // softmax [n, cols], ours to modify (saved, not shared)
    grad = grad.scatter_add(1, s[1].unsqueeze(1), -s[2].to(at::kFloat).unsqueeze(1));
    grad = grad * dloss[0].to(at::kFloat).masked_fill(s[3], 0.0).unsqueeze(1);
    auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits_shard, const at::Tensor& target,
                                        Communicator& tp, int64_t vocab_size,
                                        int64_t ignore_index) {
  LF_CHECK(logits_shard.dim() == 2 && target.dim() == 1 && target.size(0) == logits_shard.size(0),
           "vocab_parallel_cross_entropy: logits must be [n, v / tp] and target [n], got ",
           logits_shard.sizes(), " and ", target.sizes());
  LF_CHECK(vocab_size <= logits_shard.size(1) * tp.size(), "vocab_size ", vocab_size,
           " exceeds the ", logits_shard.size(1) * tp.size(), " columns of the sharded logits");
  return VocabParallelCrossEntropy::apply(logits_shard, target, &tp, vocab_size, ignore_index);
}

}  // namespace lf::parallel

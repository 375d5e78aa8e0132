// Cross entropy over logits split along the vocabulary across the TP group (Megatron's
// vocab_parallel_cross_entropy): no rank ever holds full-vocabulary logits. Three reductions
// over TP: the row max, then the target logit and the sum of exponentials together. It has its
// own backward (softmax minus one-hot on this rank's columns). Not the single-device op
// (lf::ops::softmax_cross_entropy), which it equals.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "loongforge/backend/communicator.h"

namespace lf::parallel {

// logits_shard: [n, v_padded / tp], this rank's columns [rank * v_padded / tp, ...);
// target: [n] int64 global ids. Columns >= vocab_size are vocabulary padding and take no
// probability mass (as if absent), so the loss does not depend on how far the table was padded.
// -> per-token loss [n] fp32 (computed in fp32 whatever the logits' dtype), 0 where
// target == ignore_index. tp may be a group of size 1.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits_shard, const at::Tensor& target,
                                        lf::backend::Communicator& tp, int64_t vocab_size,
                                        int64_t ignore_index = -100);

}  // namespace lf::parallel

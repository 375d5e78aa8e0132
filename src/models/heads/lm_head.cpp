#include "loongforge/models/heads/lm_head.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>

#include <algorithm>

#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/models/model.h"
#include "loongforge/parallel/tensor/cross_entropy.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {

LmHead::LmHead(const LmHeadConfig& c, const lf::backend::DeviceBackend& backend, ParamBuilder& b,
               const at::Tensor* embedding, const at::Tensor& initial_embedding)
    : c_(c), backend_(&backend), tp_(b.tp()) {
  if (!c.tied) {
    weight_ = b.add("output_layer.weight", vocab_table(b, c.vocab_size, c.padded_vocab, c.hidden_size, c.init_std),
                    Sharding::vocabulary(), false);
  } else if (embedding && embedding->defined()) {
    weight_ = *embedding;
  } else if (b.keeps()) {
    // Tied embeddings over several stages: the last stage's output layer starts as a copy of the
    // embedding and stays one because their gradients are summed over the embedding group.
    weight_ = b.add("embedding.word_embeddings.weight", initial_embedding, Sharding::vocabulary(), false);
    b.last().tied_copy = true;
    b.last().pipeline_tied = true;
  }
}

at::Tensor LmHead::local_logits(const at::Tensor& x) const {
  LF_CHECK(weight_.defined(), "the LM head lives on the last pipeline stage");
  return lf::parallel::column_parallel_linear(x, weight_, {}, tp_);
}

at::Tensor LmHead::loss(const at::Tensor& logits, const at::Tensor& labels) const {
  // logits: [s, b, v_pad / tp]
  auto target = labels.t().reshape({-1}).to(backend_->device());  // [s b]
  auto flat = logits.reshape({-1, logits.size(-1)});
  if (tp_.size() > 1)
    return lf::parallel::vocab_parallel_cross_entropy(flat, target, *tp_.tp, c_.vocab_size, /*ignore_index=*/-100);
  // Padding columns take no probability mass (as in the vocab-parallel path).
  auto real = flat.size(1) == c_.vocab_size ? flat : flat.narrow(1, 0, c_.vocab_size).contiguous();
  return lf::ops::softmax_cross_entropy(*backend_, real, target, /*ignore_index=*/-100);
}

at::Tensor LmHead::loss_sum(const at::Tensor& x, const at::Tensor& labels, const at::Tensor& weight,
                            const std::string& term) const {
  RECORD_USER_SCOPE("lf::output_layer_cross_entropy");  // the step profiler's category
  if (!c_.fused_loss) return (loss(local_logits(x), labels) * weight).sum();
  LF_CHECK(weight_.defined(), "the LM head lives on the last pipeline stage");
  auto target = labels.t().reshape({-1}).to(backend_->device());  // [s b]
  at::Tensor full = x;
  lf::backend::VocabShard shard;
  if (tp_.size() > 1) {
    // Enter the TP region as column_parallel_linear does: x's gradient is summed over TP.
    full = tp_.sequence_parallel ? lf::parallel::gather_from_sequence_parallel(x, *tp_.tp)
                                 : lf::parallel::copy_to_tp(x, *tp_.tp);
    const int64_t rows = weight_.size(0);
    shard.start = tp_.rank() * rows;
    shard.valid = std::clamp<int64_t>(c_.vocab_size - shard.start, 0, rows);
    auto* comm = tp_.tp;
    shard.all_reduce = [comm](at::Tensor& t, bool max) {
      comm->all_reduce(t, max ? lf::backend::ReduceOp::max : lf::backend::ReduceOp::sum);
    };
  } else {
    shard.valid = c_.vocab_size;
  }
  at::Tensor flat = full.reshape({-1, full.size(-1)});
  at::Tensor w = weight;
  {
    // Only the tokens whose loss counts go through the output layer (SFT prompts, image
    // placeholders, end-of-document tokens cost nothing); every TP rank picks the same rows.
    const at::Tensor rows = weight.ne(0).logical_and(target.ge(0)).nonzero().reshape({-1});
    const int64_t kept = rows.size(0);
    if (kept > 0 && kept < flat.size(0)) {
      flat = flat.index_select(0, rows);
      target = target.index_select(0, rows);
      w = weight.index_select(0, rows);
    }
  }
  std::optional<lf::backend::GradInto> into;
  if (sink_ && at::GradMode::is_enabled() && weight_.requires_grad()) into = sink_->take(weight_, term.empty() ? term_ : term);
  if (!weight_.requires_grad()) into = lf::backend::GradInto{.skip = true};  // frozen (LoRA): no dL/dw GEMMs
  return lf::ops::linear_cross_entropy_sum(*backend_, flat, weight_, target, w, shard, -100, 0,
                                           into ? &*into : nullptr);
}

at::Tensor LmHead::full_logits(const at::Tensor& local) const {
  auto logits = local;  // [s, b, v_pad / tp]
  if (tp_.size() > 1) logits = lf::parallel::gather_from_tp(logits, *tp_.tp);
  return logits.narrow(-1, 0, c_.vocab_size);  // [s, b, vocab]
}

}  // namespace lf::models

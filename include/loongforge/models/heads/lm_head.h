// The language-model head: the output layer (its own table, or the foundation's embedding when
// tied) over the final hidden states, the vocabulary-parallel cross entropy for training (no rank
// forms full-vocabulary logits) and full logits for evaluation and sampling. Not the final norm
// (the foundation's) nor the loss normalisation (the trainer's).
//
// Parameters: output_layer.weight [v_pad, h] (untied), or under pipeline parallelism with tied
// embeddings the last stage's copy of embedding.word_embeddings.weight (tied_copy). TP: dim 0.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "loongforge/backend/device_backend.h"
#include "loongforge/models/blocks/embeddings.h"

namespace lf::models {

class GradientSink;  // models/model.h

struct LmHeadConfig {
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;   // real rows; the table has padded_vocab rows
  int64_t padded_vocab = 0;
  bool tied = true;          // the output layer is the embedding
  double init_std = 0.02;
  bool fused_loss = true;    // loss_sum: the output layer and cross entropy in one chunked op
};

class LmHead {
 public:
  LmHead() = default;
  // Registers the output layer in `b` (which keeps it when this rank is the last stage).
  // tied with embedding != nullptr: the same stage holds the embedding, used as is; tied without:
  // a tied_copy of `initial_embedding` (the table the foundation drew) is registered.
  LmHead(const LmHeadConfig& c, const lf::backend::DeviceBackend& backend, ParamBuilder& b,
         const at::Tensor* embedding, const at::Tensor& initial_embedding);

  // x: [s(/tp), b, h] final hidden states -> this rank's vocabulary shard [s, b, v_pad / tp].
  at::Tensor local_logits(const at::Tensor& x) const;
  // Local logits, labels [b, s] -> per-token loss [s * b] fp32 (labels < 0: 0). Every TP rank
  // returns the same values.
  at::Tensor loss(const at::Tensor& local_logits, const at::Tensor& labels) const;
  // Training: x [s(/tp), b, h] final hidden states, labels [b, s], weight [s * b] fp32 (the
  // tokens' loss weights) -> the scalar sum over tokens of weight * loss. Fused (fused_loss): one
  // op over chunks of the tokens that count (nonzero weight, a label), never [s b, v] logits;
  // else local_logits then loss.
  // term: the loss term the gradient sink writes as (default: set_gradient_sink's).
  at::Tensor loss_sum(const at::Tensor& x, const at::Tensor& labels, const at::Tensor& weight,
                      const std::string& term = "") const;
  // The fused path writes the output layer's weight gradient through `sink` when it gives a
  // destination (training with grad mode on; model.h), as loss term `term`.
  void set_gradient_sink(const GradientSink* sink, std::string term) {
    sink_ = sink;
    term_ = std::move(term);
  }
  // The output layer's table (this rank's vocabulary shard; undefined off the last stage).
  const at::Tensor& weight() const { return weight_; }
  // Local logits -> [s, b, vocab_size] on every TP rank (padding columns dropped).
  at::Tensor full_logits(const at::Tensor& local_logits) const;

 private:
  LmHeadConfig c_;
  const lf::backend::DeviceBackend* backend_ = nullptr;
  lf::parallel::TensorParallel tp_;
  at::Tensor weight_;
  const GradientSink* sink_ = nullptr;
  std::string term_;
};

}  // namespace lf::models

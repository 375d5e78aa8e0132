// Sampling and the generation loop (models/generation.h).
#include "loongforge/models/generation.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "loongforge/core/error.h"

namespace lf::models {

int64_t sample_token(const at::Tensor& logits, const SamplingOptions& o, at::Generator& gen) {
  LF_CHECK(logits.dim() == 1 && logits.size(0) > 0, "sample_token: logits must be [vocab], got ",
           logits.sizes());
  LF_CHECK(o.temperature >= 0, "temperature must be >= 0, got ", o.temperature,
           lf::hint("0 selects greedy decoding"));
  LF_CHECK(o.top_p > 0 && o.top_p <= 1, "top_p must be in (0, 1], got ", o.top_p);
  LF_CHECK(o.top_k >= 0, "top_k must be >= 0, got ", o.top_k, lf::hint("0 disables top-k"));
  at::Tensor l = logits.detach().to(at::kCPU, at::kDouble);
  if (o.temperature == 0) return l.argmax().item<int64_t>();  // first maximum
  l = l / o.temperature;
  // Sorted descending (stable: equal logits keep id order, so the kept set is deterministic).
  auto [sorted, ids] = l.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true);
  int64_t keep = sorted.size(0);
  if (o.top_k > 0) keep = std::min(keep, o.top_k);
  if (o.top_p < 1) {
    auto probs = at::softmax(sorted.narrow(0, 0, keep), 0);
    auto cum = probs.cumsum(0);
    // The first position where the mass reaches top_p is the last one kept.
    const int64_t reach = (cum < o.top_p).sum().item<int64_t>() + 1;
    keep = std::min(keep, reach);
  }
  auto probs = at::softmax(sorted.narrow(0, 0, keep), 0);
  const int64_t pick = at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
  return ids[pick].item<int64_t>();
}

std::vector<int64_t> generate(const CausalLm& model, const std::vector<int64_t>& prompt,
                              const GenerateOptions& o) {
  LF_CHECK(!prompt.empty(), "generate: the prompt is empty", lf::hint("give at least one token"));
  const int64_t max_pos = model.config().max_position_embeddings;
  LF_CHECK(static_cast<int64_t>(prompt.size()) <= max_pos, "the prompt has ", prompt.size(),
           " tokens, more than max_position_embeddings ", max_pos);
  for (int64_t id : prompt)
    LF_CHECK(id >= 0 && id < model.config().vocab_size, "prompt token ", id, " is outside the vocabulary [0, ",
             model.config().vocab_size, ")", lf::hint("the tokenizer does not match the model"));
  LF_CHECK(!model.training() || model.config().hidden_dropout == 0,
           "generate: the model is in training mode with hidden_dropout ", model.config().hidden_dropout,
           lf::hint("call set_training(false) before generating"));
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const auto opts = at::TensorOptions().dtype(at::kLong);
  std::vector<int64_t> seq = prompt, out;
  KvCache cache;
  at::Tensor next_input = at::tensor(prompt, opts).unsqueeze(0);  // [1, n]
  while (static_cast<int64_t>(out.size()) < o.max_new_tokens &&
         static_cast<int64_t>(seq.size()) < max_pos) {
    at::Tensor logits = o.use_kv_cache ? model.forward(next_input, cache)  // [n, 1, vocab]
                                       : model.forward(at::tensor(seq, opts).unsqueeze(0));
    const int64_t token = sample_token(logits[-1][0], o.sampling, gen);
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), token) != o.stop_ids.end()) break;
    out.push_back(token);
    seq.push_back(token);
    next_input = at::tensor({token}, opts).unsqueeze(0);
  }
  return out;
}

}  // namespace lf::models

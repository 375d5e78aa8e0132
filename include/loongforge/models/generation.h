// Autoregressive sampling from a causal LM with its KV cache: greedy, temperature, top-k and
// top-p (nucleus) sampling. Not a serving engine: one sequence at a time, no batching or
// speculative decoding. loongforge-generate (tools/generate) is built on it.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "loongforge/models/composites/causal_lm.h"

namespace lf::models {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax); else logits / temperature
  int64_t top_k = 0;       // > 0: keep the k most likely tokens
  double top_p = 1.0;      // < 1: keep the smallest set of most likely tokens whose mass >= top_p
};

// logits: [vocab] (any float dtype) -> the next token. Greedy ties go to the smallest id.
// Throws on invalid options (negative temperature, top_p outside (0, 1]) naming the value.
int64_t sample_token(const at::Tensor& logits, const SamplingOptions& options, at::Generator& gen);

struct GenerateOptions {
  SamplingOptions sampling;
  int64_t max_new_tokens = 32;
  std::vector<int64_t> stop_ids;  // generation ends after producing one of these (not returned)
  uint64_t seed = 1234;
  bool use_kv_cache = true;  // false: recompute the whole prefix every step (a check, slow)
};

// The tokens generated after `prompt` (non-empty), at most max_new_tokens and never past the
// model's max_position_embeddings. Under TP every rank returns the same tokens (the logits are
// gathered and every rank draws from the same seed).
std::vector<int64_t> generate(const CausalLm& model, const std::vector<int64_t>& prompt,
                              const GenerateOptions& options);

}  // namespace lf::models

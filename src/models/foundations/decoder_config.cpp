#include "loongforge/models/foundations/decoder_config.h"

namespace lf::models {

int64_t DecoderConfig::padded_vocab_size(int64_t tp) const {
  const int64_t multiple = make_vocab_size_divisible_by * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

int64_t DecoderConfig::num_parameters() const {
  const int64_t h = hidden_size, d = head_dim(), nq = num_attention_heads, nkv = query_groups(),
                f = ffn_hidden_size, v = padded_vocab_size();
  const int64_t mlp_in = swiglu ? 2 * f : f;
  const int64_t norm = normalization == "LayerNorm" ? 2 * h : h;  // weight (+ bias)
  int64_t per_layer = (nq + 2 * nkv) * d * h + h * nq * d + mlp_in * h + h * f + 2 * norm;
  if (add_qkv_bias || add_bias_linear) per_layer += (nq + 2 * nkv) * d;
  if (add_bias_linear) per_layer += h + mlp_in + h;
  if (qk_layernorm) per_layer += 2 * d;
  int64_t total = v * h + num_layers * per_layer + norm;
  if (untie_embeddings_and_output_weights) total += v * h;
  return total;
}

double DecoderConfig::flops_per_token(int64_t seq) const {
  const double h = hidden_size, d = head_dim(), nq = num_attention_heads,
               nkv = query_groups(), f = ffn_hidden_size, v = padded_vocab_size();
  const double mlp_in = swiglu ? 2 * f : f;
  const double matmul_params =
      num_layers * ((nq + 2 * nkv) * d * h + h * nq * d + mlp_in * h + h * f) + v * h;
  // QK^T and PV: 2 * 2 * seq * nq * d multiply-adds per token per layer, halved by causality.
  const double attention = num_layers * 2.0 * seq * nq * d;
  return 6.0 * matmul_params + 3.0 * 2.0 * attention;
}

void DecoderConfig::validate(const lf::config::Node& tree, const std::string& prefix,
                             lf::config::ErrorList& errors) const {
  auto origin = [&](const char* key) {
    const auto* n = tree.find(key);
    return n ? n->origin() : lf::config::Origin::from_default();
  };
  auto key = [&](const char* k) { return prefix.empty() ? std::string(k) : prefix + "." + k; };
  if (num_attention_heads > 0 && kv_channels == 0 && hidden_size % num_attention_heads != 0)
    errors.add(key("num_attention_heads"), origin("num_attention_heads"),
               "num_attention_heads " + std::to_string(num_attention_heads) +
                   " does not divide hidden_size " + std::to_string(hidden_size),
               "set kv_channels explicitly or choose a divisor of hidden_size");
  if (query_groups() > 0 && num_attention_heads % query_groups() != 0)
    errors.add(key("num_query_groups"), origin("num_query_groups"),
               "num_query_groups " + std::to_string(query_groups()) +
                   " does not divide num_attention_heads " + std::to_string(num_attention_heads),
               "each key/value head serves a whole number of query heads");
  if (hidden_dropout >= 1.0)
    errors.add(key("hidden_dropout"), origin("hidden_dropout"),
               "hidden_dropout must be below 1, got " + std::to_string(hidden_dropout));
  if (attention_dropout != 0.0)
    errors.add(key("attention_dropout"), origin("attention_dropout"),
               "attention dropout is not supported (the fused attention op has no dropout), got " +
                   std::to_string(attention_dropout),
               "set attention_dropout: 0 (LLaMA/Qwen pretraining uses 0); hidden_dropout is supported");
  if (rope_scaling && rope_scaling_high_freq_factor <= rope_scaling_low_freq_factor)
    errors.add(key("rope_scaling_high_freq_factor"), origin("rope_scaling_high_freq_factor"),
               "rope_scaling_high_freq_factor " + std::to_string(rope_scaling_high_freq_factor) +
                   " must exceed rope_scaling_low_freq_factor " + std::to_string(rope_scaling_low_freq_factor),
               "Llama 3.1 uses low 1.0, high 4.0");
  if (group_query_attention && num_query_groups == 0)
    errors.add(key("num_query_groups"), origin("group_query_attention"),
               "group_query_attention is set but num_query_groups is not: the number of key/value heads is "
               "unknown",
               "set --num-query-groups N (model.foundation.num_query_groups); Megatron's default of 1 would "
               "silently make this multi-query attention");
  if (num_attention_heads > 0 && head_dim() % 2 != 0)
    errors.add(key("kv_channels"), origin("kv_channels"),
               "RoPE needs an even head dimension, got " + std::to_string(head_dim()));
}

void DecoderConfig::validate_layout(const lf::config::Node& job, int64_t tp, bool sequence_parallel,
                                    int64_t seq_length, lf::config::ErrorList& errors) const {
  auto origin = [&](const std::string& path) {
    const lf::config::Node* n = &job;
    size_t start = 0;
    while (n && start <= path.size()) {
      const size_t dot = path.find('.', start);
      n = n->find(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return n ? n->origin() : lf::config::Origin::from_default();
  };
  const std::string tp_text = "parallel.tensor_model_parallel_size " + std::to_string(tp);
  auto divisible = [&](const char* field, int64_t value) {
    if (tp > 1 && value % tp != 0) {
      const std::string key = std::string("model.foundation.") + field;
      errors.add(key, origin(key),
                 key + " " + std::to_string(value) + " is not divisible by " + tp_text,
                 "each tensor-parallel rank needs an equal share; pick a TP size that divides it");
    }
  };
  divisible("num_attention_heads", num_attention_heads);
  divisible("num_query_groups", query_groups());
  divisible("ffn_hidden_size", ffn_hidden_size);
  if (sequence_parallel && tp > 1 && seq_length % tp != 0)
    errors.add("training.seq_length", origin("training.seq_length"),
               "training.seq_length " + std::to_string(seq_length) + " is not divisible by " + tp_text +
                   " (sequence parallelism splits the sequence)",
               "pick --seq-length as a multiple of the TP size, or drop --sequence-parallel");
  if (seq_length > max_position_embeddings)
    errors.add("training.seq_length", origin("training.seq_length"),
               "training.seq_length " + std::to_string(seq_length) + " exceeds model.foundation.max_position_embeddings " +
                   std::to_string(max_position_embeddings),
               "lower --seq-length or raise max_position_embeddings");
}

}  // namespace lf::models

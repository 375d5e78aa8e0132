#include "loongforge/models/foundations/decoder_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "loongforge/core/error.h"

namespace lf::models {

int64_t DecoderConfig::padded_vocab_size(int64_t tp) const {
  const int64_t multiple = make_vocab_size_divisible_by * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

namespace {

// Weights of one MLP of hidden size f (with fc1 [gate; up] for SwiGLU), biases aside.
int64_t mlp_weights(int64_t h, int64_t f, bool swiglu) { return (swiglu ? 2 * f : f) * h + h * f; }

// moe_layer_freq: "N" or a Python-style list expression of 0/1 terms joined by '+', each "[a,b,..]"
// optionally times a count, the whole optionally in parentheses: "([0]*3+[1]*58)".
std::vector<bool> parse_layer_pattern(const std::string& text, int64_t layers) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  auto fail = [&](const std::string& why) -> std::vector<bool> {
    LF_FAIL("model.foundation.moe_layer_freq '", text, "': ", why,
            lf::hint("write N (every N-th layer, from layer 0) or a list of 0/1 such as ([0]*1+[1]*" +
                     std::to_string(std::max<int64_t>(layers - 1, 1)) + ") with one entry per layer"));
  };
  if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) {
    const int64_t n = std::stoll(s);
    if (n < 1) return fail("the frequency must be at least 1");
    std::vector<bool> out;
    for (int64_t i = 0; i < layers; ++i) out.push_back(i % n == 0);
    return out;
  }
  if (s.size() >= 2 && s.front() == '(' && s.back() == ')') s = s.substr(1, s.size() - 2);
  std::vector<bool> out;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '[') return fail("expected '[' at offset " + std::to_string(i));
    const size_t close = s.find(']', i);
    if (close == std::string::npos) return fail("a '[' is not closed");
    std::vector<bool> part;
    size_t j = i + 1;
    while (j < close) {
      if (s[j] == '0' || s[j] == '1') part.push_back(s[j] == '1');
      else if (s[j] != ',') return fail("list entries must be 0 or 1");
      ++j;
    }
    i = close + 1;
    int64_t times = 1;
    if (i < s.size() && s[i] == '*') {
      size_t end = i + 1;
      while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
      if (end == i + 1) return fail("'*' must be followed by a count");
      times = std::stoll(s.substr(i + 1, end - i - 1));
      i = end;
    }
    for (int64_t t = 0; t < times; ++t) out.insert(out.end(), part.begin(), part.end());
    if (i < s.size()) {
      if (s[i] != '+') return fail("expected '+' between lists at offset " + std::to_string(i));
      ++i;
    }
  }
  if (static_cast<int64_t>(out.size()) != layers)
    return fail("the pattern has " + std::to_string(out.size()) + " entries but the model has " +
                std::to_string(layers) + " layers");
  return out;
}

}  // namespace

std::vector<bool> DecoderConfig::moe_layer_pattern() const {
  if (!is_moe()) return std::vector<bool>(static_cast<size_t>(std::max<int64_t>(num_layers, 0)), false);
  return parse_layer_pattern(moe_layer_freq, num_layers);
}

// MLA's matmul weights of one layer (norms aside).
static int64_t mla_weights(const DecoderConfig& c) {
  const int64_t h = c.hidden_size, nq = c.num_attention_heads, dq = c.qk_head_dim, dr = c.qk_pos_emb_head_dim,
                dv = c.v_head_dim;
  const int64_t q = c.q_lora_rank > 0 ? c.q_lora_rank * h + nq * (dq + dr) * c.q_lora_rank : nq * (dq + dr) * h;
  return q + (c.kv_lora_rank + dr) * h + nq * (dq + dv) * c.kv_lora_rank + h * nq * dv;
}

double DecoderConfig::softmax_scale() const {
  if (!multi_latent_attention) return 1.0 / std::sqrt(static_cast<double>(head_dim()));
  double s = 1.0 / std::sqrt(static_cast<double>(qk_head_dim + qk_pos_emb_head_dim));
  if (rope_type == "yarn" && mscale_all_dim != 0) {
    const double m = rotary_scaling_factor <= 1 ? 1.0 : 0.1 * mscale_all_dim * std::log(rotary_scaling_factor) + 1.0;
    s *= m * m;
  }
  return s;
}

int64_t DecoderConfig::layer_parameters(int64_t i) const {
  return layer_parameters_of(is_moe() && moe_layer_pattern()[static_cast<size_t>(i)]);
}

int64_t DecoderConfig::mtp_parameters() const {
  const int64_t h = hidden_size, norm = normalization == "LayerNorm" ? 2 * h : h;
  // Per MTP layer: enorm, hnorm, eh_proj [h, 2h], a transformer layer (MoE in a MoE model), its final norm.
  return mtp_num_layers * (3 * norm + 2 * h * h + layer_parameters_of(is_moe()));
}

int64_t DecoderConfig::dsa_indexer_parameters() const {
  if (!dsa()) return 0;
  const int64_t nh = dsa_indexer_n_heads, di = dsa_indexer_head_dim;
  // wq_b [nh di, q_lora], wk [di, h], k_norm weight and bias [di], weights_proj [nh, h].
  return nh * di * q_lora_rank + di * hidden_size + 2 * di + nh * hidden_size;
}

int64_t DecoderConfig::layer_parameters_of(bool moe) const {
  const int64_t h = hidden_size, d = head_dim(), nq = num_attention_heads, nkv = query_groups(), f = ffn_hidden_size;
  const int64_t norm = normalization == "LayerNorm" ? 2 * h : h;  // weight (+ bias)
  int64_t n = 2 * norm;
  if (multi_latent_attention) {
    n += mla_weights(*this) + kv_lora_rank + q_lora_rank + dsa_indexer_parameters();  // + the latent norms
  } else {
    n += (nq + 2 * nkv) * d * h + h * nq * d;
    if (add_qkv_bias || add_bias_linear) n += (nq + 2 * nkv) * d;
    if (qk_layernorm) n += 2 * d;
  }
  if (moe) {
    n += num_experts * h + num_experts * mlp_weights(h, expert_ffn_hidden_size(), swiglu);
    if (moe_router_enable_expert_bias) n += num_experts;
    if (moe_shared_expert_intermediate_size > 0) n += mlp_weights(h, moe_shared_expert_intermediate_size, swiglu);
    if (moe_shared_expert_gate) n += h;
  } else {
    n += mlp_weights(h, f, swiglu);
    if (add_bias_linear) n += (swiglu ? 2 * f : f) + h;  // fc1's and fc2's biases
  }
  if (add_bias_linear) n += h;  // linear_proj's bias
  return n;
}

int64_t DecoderConfig::routed_experts_per_moe_layer() const {
  return is_moe() ? num_experts * mlp_weights(hidden_size, expert_ffn_hidden_size(), swiglu) : 0;
}

int64_t DecoderConfig::routed_expert_parameters(int64_t i) const {
  return is_moe() && moe_layer_pattern()[static_cast<size_t>(i)] ? routed_experts_per_moe_layer() : 0;
}

int64_t DecoderConfig::num_parameters() const {
  const int64_t h = hidden_size, v = padded_vocab_size();
  const int64_t norm = normalization == "LayerNorm" ? 2 * h : h;
  int64_t total = v * h + norm;
  for (int64_t i = 0; i < num_layers; ++i) total += layer_parameters(i);
  if (untie_embeddings_and_output_weights) total += v * h;
  return total + mtp_parameters();
}

int64_t DecoderConfig::num_active_parameters() const {
  if (!is_moe()) return num_parameters();
  const auto pattern = moe_layer_pattern();
  const int64_t h = hidden_size, inactive = (num_experts - moe_router_topk) *
                                            mlp_weights(h, expert_ffn_hidden_size(), swiglu);
  int64_t total = num_parameters();
  for (bool m : pattern)
    if (m) total -= inactive;
  return total - mtp_num_layers * inactive;
}

double DecoderConfig::flops_per_token(int64_t seq) const {
  const double h = hidden_size, d = head_dim(), nq = num_attention_heads,
               nkv = query_groups(), v = padded_vocab_size();
  // Matmul weights a token goes through: attention, its MLP (MoE: the router, top-k routed
  // experts and the shared experts), the output layer.
  double matmul_params = v * h;
  const auto pattern = moe_layer_pattern();
  for (int64_t i = 0; i < num_layers; ++i) {
    matmul_params += multi_latent_attention ? static_cast<double>(mla_weights(*this)) : (nq + 2 * nkv) * d * h + h * nq * d;
    if (dsa())  // the indexer's projections (its k_norm aside)
      matmul_params += static_cast<double>(dsa_indexer_parameters() - 2 * dsa_indexer_head_dim);
    if (pattern[static_cast<size_t>(i)]) {
      matmul_params += static_cast<double>(num_experts) * h +
                       static_cast<double>(moe_router_topk) * mlp_weights(hidden_size, expert_ffn_hidden_size(), swiglu);
      if (moe_shared_expert_intermediate_size > 0)
        matmul_params += mlp_weights(hidden_size, moe_shared_expert_intermediate_size, swiglu);
    } else {
      matmul_params += mlp_weights(hidden_size, ffn_hidden_size, swiglu);
    }
  }
  // QK^T and PV: 2 * seq * nq * (d_qk + d_v) FLOPs per token per layer, halved by causality.
  const double d_qk = multi_latent_attention ? static_cast<double>(qk_head_dim + qk_pos_emb_head_dim) : d;
  const double d_v = multi_latent_attention ? static_cast<double>(v_head_dim) : d;
  // Keys per query on average: seq / 2 causally; with DSA at most top-k each (query i: min(i + 1, k)),
  // plus the indexer's scores over every causal key (2 nh di FLOPs per pair).
  double keys = seq / 2.0;
  double indexer = 0;
  if (dsa() && !dsa_indexer_warmup) {
    const double k = static_cast<double>(dsa_indexer_topk), sd = static_cast<double>(seq);
    keys = sd <= k ? sd / 2.0 : k - k * k / (2.0 * sd);
  }
  if (dsa()) indexer = num_layers * (seq / 2.0) * 2.0 * dsa_indexer_n_heads * dsa_indexer_head_dim;
  const double attention = num_layers * 2.0 * keys * nq * (d_qk + d_v);
  return 6.0 * matmul_params + 3.0 * 2.0 * attention + 3.0 * indexer;
}

template <class Origin, class Key>
void validate_moe_fields(const DecoderConfig& c, const Origin& origin, const Key& key, lf::config::ErrorList& errors) {
  const int64_t e = c.num_experts;
  if (c.moe_router_topk > e)
    errors.add(key("moe_router_topk"), origin("moe_router_topk"),
               "moe_router_topk " + std::to_string(c.moe_router_topk) + " exceeds num_experts " + std::to_string(e),
               "route each token to at most num_experts experts");
  if ((c.moe_router_num_groups > 0) != (c.moe_router_group_topk > 0))
    errors.add(key(c.moe_router_num_groups > 0 ? "moe_router_group_topk" : "moe_router_num_groups"),
               origin(c.moe_router_num_groups > 0 ? "moe_router_group_topk" : "moe_router_num_groups"),
               "group-limited routing needs both moe_router_num_groups and moe_router_group_topk",
               "DeepSeek-V3: num_groups 8, group_topk 4; or set both to 0");
  if (c.moe_router_num_groups > 0 && c.moe_router_group_topk > 0) {
    const int64_t g = c.moe_router_num_groups, gk = c.moe_router_group_topk;
    if (e % g != 0)
      errors.add(key("moe_router_num_groups"), origin("moe_router_num_groups"),
                 "moe_router_num_groups " + std::to_string(g) + " does not divide num_experts " + std::to_string(e),
                 "every group holds the same number of experts");
    else if (gk > g || c.moe_router_topk % gk != 0 || c.moe_router_topk > gk * (e / g))
      errors.add(key("moe_router_group_topk"), origin("moe_router_group_topk"),
                 "moe_router_group_topk " + std::to_string(gk) + " must be at most moe_router_num_groups " +
                     std::to_string(g) + ", divide moe_router_topk " + std::to_string(c.moe_router_topk) +
                     " and leave at least top-k experts in the chosen groups",
                 "DeepSeek-V3: topk 8, num_groups 8, group_topk 4");
  }
  if (c.moe_router_score_function == "sigmoid" && c.moe_router_pre_softmax)
    errors.add(key("moe_router_pre_softmax"), origin("moe_router_pre_softmax"),
               "moe_router_pre_softmax applies to softmax scores, but moe_router_score_function is sigmoid",
               "drop moe_router_pre_softmax");
  if (c.add_bias_linear)
    errors.add(key("add_bias_linear"), origin("add_bias_linear"),
               "MoE experts have no biases (no MoE family uses them), but add_bias_linear is set",
               "set add_bias_linear: false (--disable-bias-linear)");
  if (c.moe_shared_expert_gate && c.moe_shared_expert_intermediate_size == 0)
    errors.add(key("moe_shared_expert_gate"), origin("moe_shared_expert_gate"),
               "moe_shared_expert_gate is set but there are no shared experts",
               "set moe_shared_expert_intermediate_size, or drop the gate");
  // The default type (aux_loss, as Megatron's) with coefficient 0 is simply no loss; choosing the
  // per-sequence loss without a coefficient would silently compute nothing.
  if (c.moe_router_load_balancing_type == "seq_aux_loss" && c.moe_aux_loss_coeff == 0)
    errors.add(key("moe_aux_loss_coeff"), origin("moe_router_load_balancing_type"),
               "moe_router_load_balancing_type " + c.moe_router_load_balancing_type +
                   " is set but moe_aux_loss_coeff is 0, so no load-balancing loss is computed",
               "set --moe-aux-loss-coeff (Megatron's examples use 1e-2 to 1e-3), or the type none");
  try {
    c.moe_layer_pattern();
  } catch (const lf::Error& err) {
    errors.add(key("moe_layer_freq"), origin("moe_layer_freq"), err.message(), err.hint());
  }
}

void DecoderConfig::validate(const lf::config::Node& tree, const std::string& prefix,
                             lf::config::ErrorList& errors) const {
  auto origin = [&](const char* key) {
    const auto* n = tree.find(key);
    return n ? n->origin() : lf::config::Origin::from_default();
  };
  auto key = [&](const char* k) { return prefix.empty() ? std::string(k) : prefix + "." + k; };
  if (num_attention_heads > 0 && !multi_latent_attention && kv_channels == 0 && hidden_size % num_attention_heads != 0)
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
  if (is_moe()) validate_moe_fields(*this, origin, key, errors);
  if (!mrope_section.empty()) {
    int64_t sum = 0;
    for (int64_t v : mrope_section) sum += v;
    // The rotary dims: the head's, or multi-latent attention's decoupled RoPE dims.
    const int64_t half = (multi_latent_attention ? qk_pos_emb_head_dim
                          : kv_channels > 0     ? kv_channels
                          : num_attention_heads > 0 ? hidden_size / num_attention_heads
                                                    : 0) / 2;
    if (mrope_section.size() != 3 || sum != half)
      errors.add(key("mrope_section"), origin("mrope_section"),
                 "mrope_section must be 3 sections (temporal, height, width) summing to the rotary head_dim / 2 = " +
                     std::to_string(half) + (multi_latent_attention ? " (qk_pos_emb_head_dim / 2)" : "") + "; got " +
                     std::to_string(mrope_section.size()) + " summing to " + std::to_string(sum),
                 "Qwen2.5-VL uses [16, 24, 24] for head_dim 128; leave it empty for 1D RoPE");
  }
  if (mrope_interleaved && mrope_section.empty())
    errors.add(key("mrope_interleaved"), origin("mrope_interleaved"),
               "mrope_interleaved arranges the sections of M-RoPE, but mrope_section is empty",
               "set mrope_section (Qwen3-VL: [24, 20, 20] for head_dim 128) or drop mrope_interleaved");
  if (multi_latent_attention) {
    for (const char* f : {"kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"}) {
      const int64_t v = std::string(f) == "kv_lora_rank" ? kv_lora_rank
                        : std::string(f) == "qk_head_dim" ? qk_head_dim
                        : std::string(f) == "qk_pos_emb_head_dim" ? qk_pos_emb_head_dim
                                                                  : v_head_dim;
      if (v <= 0)
        errors.add(key(f), origin(f), std::string("multi_latent_attention needs ") + f + " > 0",
                   "DeepSeek-V3: q_lora_rank 1536, kv_lora_rank 512, qk_head_dim 128, qk_pos_emb_head_dim 64, "
                   "v_head_dim 128");
    }
    if (qk_pos_emb_head_dim % 2 != 0)
      errors.add(key("qk_pos_emb_head_dim"), origin("qk_pos_emb_head_dim"),
                 "RoPE needs an even qk_pos_emb_head_dim, got " + std::to_string(qk_pos_emb_head_dim));
    for (const char* f : {"qk_layernorm", "add_qkv_bias", "add_bias_linear"})
      if ((std::string(f) == "qk_layernorm" && qk_layernorm) || (std::string(f) == "add_qkv_bias" && add_qkv_bias) ||
          (std::string(f) == "add_bias_linear" && add_bias_linear))
        errors.add(key(f), origin(f), std::string(f) + " does not apply to multi-latent attention (its latents have "
                   "their own norms and no biases)", std::string("set ") + f + ": false");
  }
  if (dsa()) {
    if (!multi_latent_attention)
      errors.add(key("experimental_attention_variant"), origin("experimental_attention_variant"),
                 "experimental_attention_variant dsa selects keys for multi-latent attention, but "
                 "multi_latent_attention is off",
                 "set --multi-latent-attention (DeepSeek-V3.2 is MLA), or drop the variant");
    if (q_lora_rank <= 0)
      errors.add(key("q_lora_rank"), origin("q_lora_rank"),
                 "DSA's indexer reads the query latent, but q_lora_rank is 0", "DeepSeek-V3.2: q_lora_rank 1536");
    for (const char* f : {"dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk"}) {
      const int64_t v = std::string(f) == "dsa_indexer_n_heads"    ? dsa_indexer_n_heads
                        : std::string(f) == "dsa_indexer_head_dim" ? dsa_indexer_head_dim
                                                                   : dsa_indexer_topk;
      if (v <= 0)
        errors.add(key(f), origin(f), std::string("experimental_attention_variant dsa needs ") + f + " > 0",
                   "DeepSeek-V3.2: dsa_indexer_n_heads 64, dsa_indexer_head_dim 128, dsa_indexer_topk 2048");
    }
    if (dsa_indexer_head_dim > 0 && dsa_indexer_head_dim < qk_pos_emb_head_dim)
      errors.add(key("dsa_indexer_head_dim"), origin("dsa_indexer_head_dim"),
                 "dsa_indexer_head_dim " + std::to_string(dsa_indexer_head_dim) + " is smaller than its rotary part " +
                     "qk_pos_emb_head_dim " + std::to_string(qk_pos_emb_head_dim),
                 "the indexer rotates its first qk_pos_emb_head_dim dims: pick a head size at least that");
    if (dsa_indexer_topk > max_position_embeddings)
      errors.add(key("dsa_indexer_topk"), origin("dsa_indexer_topk"),
                 "dsa_indexer_topk " + std::to_string(dsa_indexer_topk) + " exceeds max_position_embeddings " +
                     std::to_string(max_position_embeddings) + ": no query ever sees that many keys",
                 "pick a top-k below the longest sequence (DeepSeek-V3.2: 2048 of 163840)");
    if (dsa_indexer_warmup && dsa_indexer_loss_coeff == 0)
      errors.add(key("dsa_indexer_warmup"), origin("dsa_indexer_warmup"),
                 "dsa_indexer_warmup trains only the indexer, through its KL loss, but dsa_indexer_loss_coeff is 0",
                 "set dsa_indexer_loss_coeff (e.g. 1.0), or drop the warm-up");
  }
  // Settings of a feature that is off would be accepted and ignored: refused unless at their
  // defaults (saved configurations carry every field, so only the value can tell).
  {
    const DecoderConfig d;
    auto unused = [&](const char* field, bool changed, const std::string& because, const std::string& fix) {
      if (changed)
        errors.add(key(field), origin(field), std::string(field) + " is set but " + because + ", so it would do nothing",
                   fix);
    };
    if (!is_moe()) {
      const std::string why = "num_experts is 0 (a dense model)", fix = "set num_experts, or drop the MoE settings";
      unused("moe_ffn_hidden_size", moe_ffn_hidden_size != d.moe_ffn_hidden_size, why, fix);
      unused("moe_router_topk", moe_router_topk != d.moe_router_topk, why, fix);
      unused("moe_router_score_function", moe_router_score_function != d.moe_router_score_function, why, fix);
      unused("moe_router_pre_softmax", moe_router_pre_softmax != d.moe_router_pre_softmax, why, fix);
      unused("moe_router_num_groups", moe_router_num_groups != d.moe_router_num_groups, why, fix);
      unused("moe_router_group_topk", moe_router_group_topk != d.moe_router_group_topk, why, fix);
      unused("moe_router_topk_scaling_factor", moe_router_topk_scaling_factor != d.moe_router_topk_scaling_factor, why, fix);
      unused("moe_aux_loss_coeff", moe_aux_loss_coeff != d.moe_aux_loss_coeff, why, fix);
      unused("moe_z_loss_coeff", moe_z_loss_coeff != d.moe_z_loss_coeff, why, fix);
      unused("moe_router_enable_expert_bias", moe_router_enable_expert_bias != d.moe_router_enable_expert_bias, why, fix);
      unused("moe_shared_expert_intermediate_size",
             moe_shared_expert_intermediate_size != d.moe_shared_expert_intermediate_size, why, fix);
      unused("moe_expert_capacity_factor", moe_expert_capacity_factor != d.moe_expert_capacity_factor, why, fix);
      unused("moe_layer_freq", moe_layer_freq != d.moe_layer_freq, why, fix);
    } else {
      unused("moe_router_bias_update_rate",
             moe_router_bias_update_rate != d.moe_router_bias_update_rate && !moe_router_enable_expert_bias,
             "moe_router_enable_expert_bias is off", "set --moe-router-enable-expert-bias, or drop the rate");
      unused("moe_token_drop_policy", moe_token_drop_policy != d.moe_token_drop_policy && moe_expert_capacity_factor == 0,
             "moe_expert_capacity_factor is 0 (dropless)", "set --moe-expert-capacity-factor, or drop the policy");
    }
    unused("mtp_loss_scaling_factor", mtp_loss_scaling_factor != d.mtp_loss_scaling_factor && mtp_num_layers == 0,
           "mtp_num_layers is 0", "set --mtp-num-layers, or drop the factor");
    if (!multi_latent_attention) {
      const std::string why = "multi_latent_attention is off", fix = "set --multi-latent-attention, or drop it";
      unused("q_lora_rank", q_lora_rank != d.q_lora_rank, why, fix);
      unused("kv_lora_rank", kv_lora_rank != d.kv_lora_rank, why, fix);
      unused("qk_head_dim", qk_head_dim != d.qk_head_dim, why, fix);
      unused("qk_pos_emb_head_dim", qk_pos_emb_head_dim != d.qk_pos_emb_head_dim, why, fix);
      unused("v_head_dim", v_head_dim != d.v_head_dim, why, fix);
    }
    if (!dsa()) {
      const std::string why = "experimental_attention_variant is " + experimental_attention_variant + ", not dsa",
                        fix = "set --experimental-attention-variant dsa, or drop it";
      unused("dsa_indexer_n_heads", dsa_indexer_n_heads != d.dsa_indexer_n_heads, why, fix);
      unused("dsa_indexer_head_dim", dsa_indexer_head_dim != d.dsa_indexer_head_dim, why, fix);
      unused("dsa_indexer_topk", dsa_indexer_topk != d.dsa_indexer_topk, why, fix);
      unused("dsa_indexer_loss_coeff", dsa_indexer_loss_coeff != d.dsa_indexer_loss_coeff, why, fix);
      unused("dsa_indexer_warmup", dsa_indexer_warmup != d.dsa_indexer_warmup, why, fix);
    }
    if (rope_type != "yarn") {
      const std::string why = "rope_type is " + rope_type + ", not yarn", fix = "set --rope-type yarn, or drop it";
      unused("rotary_scaling_factor", rotary_scaling_factor != d.rotary_scaling_factor, why, fix);
      unused("mscale", mscale != d.mscale, why, fix);
      unused("mscale_all_dim", mscale_all_dim != d.mscale_all_dim, why, fix);
      unused("beta_fast", beta_fast != d.beta_fast, why, fix);
      unused("beta_slow", beta_slow != d.beta_slow, why, fix);
    }
  }
  // transformers reads a zero beta as its default (`or 32`, `or 1`); here it would be a
  // correction range that differs from it (beta_fast 0: no range at all).
  for (const auto& [name, value] : {std::pair<const char*, double>{"beta_fast", beta_fast}, {"beta_slow", beta_slow}})
    if (rope_type == "yarn" && value <= 0)
      errors.add(key(name), origin(name), std::string("YaRN's ") + name + " must be above 0, got " + std::to_string(value),
                 "transformers' defaults are beta_fast 32, beta_slow 1");
  if (rope_type == "yarn" && rope_scaling)
    errors.add(key("rope_scaling"), origin("rope_scaling"),
               "rope_scaling (Llama 3.1) and rope_type yarn are exclusive", "keep one of the two");
  if (num_attention_heads > 0 && !multi_latent_attention && head_dim() % 2 != 0)
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
  if (!multi_latent_attention) divisible("num_query_groups", query_groups());
  divisible("ffn_hidden_size", ffn_hidden_size);
  if (is_moe()) {
    divisible("moe_ffn_hidden_size", expert_ffn_hidden_size());
    divisible("moe_shared_expert_intermediate_size", moe_shared_expert_intermediate_size);
  }
  if (dsa()) {
    // The indexer is replicated and its loss needs the attention summed over every head; neither is
    // split over TP or CP yet.
    if (tp > 1)
      errors.add("parallel.tensor_model_parallel_size", origin("parallel.tensor_model_parallel_size"),
                 "model.foundation.experimental_attention_variant dsa runs at " + tp_text + " but supports only 1",
                 "train DSA models with data, pipeline or expert parallelism, or --tensor-model-parallel-size 1");
    const lf::config::Node* par = job.find("parallel");
    const lf::config::Node* cp = par ? par->find("context_parallel_size") : nullptr;
    int64_t cps = 1;
    try {
      if (cp && cp->is_scalar() && !cp->text().empty()) cps = std::stoll(cp->text());
    } catch (const std::exception&) {
      // A malformed size is the parallel section's own error.
    }
    if (cps > 1)
      errors.add("parallel.context_parallel_size", origin("parallel.context_parallel_size"),
                 "model.foundation.experimental_attention_variant dsa does not run under context parallelism "
                 "(parallel.context_parallel_size " + std::to_string(cps) + ")",
                 "drop --context-parallel-size, or train dense MLA");
  }
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

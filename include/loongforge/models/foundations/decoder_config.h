// The decoder-only transformer family's hyper-parameters (LLaMA / Qwen / Mistral style), with
// Megatron's field names, as one field list that drives YAML loading, --dry-run printing and
// validation. Not the model (models/foundations/decoder.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/core/config/schema.h"

namespace lf::models {

using lf::config::Max;
using lf::config::Min;
using lf::config::OneOf;
using lf::config::Required;

struct DecoderConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;  // 0: = num_attention_heads (no GQA)
  int64_t kv_channels = 0;       // 0: hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t make_vocab_size_divisible_by = 128;
  int64_t max_position_embeddings = 0;
  std::string normalization = "RMSNorm";
  double norm_epsilon = 1e-5;
  bool swiglu = true;
  std::string position_embedding_type = "rope";
  double rotary_base = 10000;
  bool rope_scaling = false;
  double rope_scaling_factor = 8.0;
  double rope_scaling_low_freq_factor = 1.0;
  double rope_scaling_high_freq_factor = 4.0;
  int64_t rope_scaling_original_max_position_embeddings = 8192;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = false;
  bool add_qkv_bias = false;
  bool qk_layernorm = false;
  double init_method_std = 0.02;
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  bool group_query_attention = false;  // Megatron's switch; num_query_groups decides here
  bool cross_entropy_loss_fusion = true;
  // RoPE variants beyond Llama 3.1's scaling: YaRN (rope_type yarn) and the interleaved layout.
  std::string rope_type = "rope";
  double rotary_scaling_factor = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  double beta_fast = 32;
  double beta_slow = 1;
  bool rotary_interleaved = false;
  // M-RoPE (Qwen2-VL / Qwen2.5-VL; HF's rope_scaling.mrope_section): 3 sections (temporal, height,
  // width) of the head_dim / 2 rotary frequencies (multi-latent attention: of qk_pos_emb_head_dim / 2,
  // its decoupled RoPE dims, in their pairs layout and YaRN scaling); empty: 1D RoPE. Set, the decoder takes position
  // ids [3, b, s] (or [b, s] / none: all three axes equal, which is 1D RoPE).
  std::vector<int64_t> mrope_section;
  // Interleaved M-RoPE (Qwen3-VL; HF's rope_parameters.mrope_interleaved): frequency j takes the
  // height position when j % 3 == 1 and j < 3 mrope_section[1], the width position when j % 3 == 2
  // and j < 3 mrope_section[2], else the temporal one (instead of three contiguous sections).
  bool mrope_interleaved = false;
  // Multi-latent attention (DeepSeek-V2/V3; Megatron's --multi-latent-attention).
  bool multi_latent_attention = false;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_head_dim = 0;
  int64_t qk_pos_emb_head_dim = 0;
  int64_t v_head_dim = 0;
  // DeepSeek Sparse Attention (DeepSeek-V3.2; Megatron's --experimental-attention-variant dsa and
  // --dsa-indexer-*): a lightning indexer picks each query's top-k keys for MLA (blocks/mla.h).
  std::string experimental_attention_variant = "none";
  int64_t dsa_indexer_n_heads = 0;
  int64_t dsa_indexer_head_dim = 0;
  int64_t dsa_indexer_topk = 0;
  double dsa_indexer_loss_coeff = 0;
  bool dsa_indexer_warmup = false;
  // Mixture of experts (Megatron's --num-experts / --moe-*): num_experts 0 is a dense model.
  int64_t num_experts = 0;
  int64_t moe_ffn_hidden_size = 0;  // 0: ffn_hidden_size
  int64_t moe_router_topk = 2;
  std::string moe_router_score_function = "softmax";
  bool moe_router_pre_softmax = false;
  int64_t moe_router_num_groups = 0;
  int64_t moe_router_group_topk = 0;
  double moe_router_topk_scaling_factor = 0;
  std::string moe_router_load_balancing_type = "aux_loss";
  double moe_aux_loss_coeff = 0;
  double moe_z_loss_coeff = 0;
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  int64_t moe_shared_expert_intermediate_size = 0;
  bool moe_shared_expert_gate = false;
  std::string moe_layer_freq = "1";
  double moe_expert_capacity_factor = 0;
  std::string moe_token_drop_policy = "probs";
  // Multi-token prediction (DeepSeek-V3; Megatron's --mtp-num-layers): D extra layers after the
  // decoder, layer k predicting the token k + 1 ahead of the main prediction.
  int64_t mtp_num_layers = 0;
  double mtp_loss_scaling_factor = 0.1;

  template <class V>
  void visit(V& v) {
    v("num_layers", num_layers, "Transformer layers", Required{}, Min{1});
    v("hidden_size", hidden_size, "Hidden size", Required{}, Min{1});
    v("ffn_hidden_size", ffn_hidden_size, "MLP hidden size", Required{}, Min{1});
    v("num_attention_heads", num_attention_heads, "Query heads", Required{}, Min{1});
    v("num_query_groups", num_query_groups, "Key/value heads (GQA); 0: num_attention_heads", Min{0});
    v("kv_channels", kv_channels, "Head dimension; 0: hidden_size / num_attention_heads", Min{0});
    v("vocab_size", vocab_size, "Vocabulary size of the tokenizer", Required{}, Min{1});
    v("make_vocab_size_divisible_by", make_vocab_size_divisible_by,
      "Pad the embedding table to a multiple of this (times TP)", Min{1});
    v("max_position_embeddings", max_position_embeddings, "Longest sequence", Required{}, Min{1});
    v("normalization", normalization, "Norm layer", OneOf{{"RMSNorm", "LayerNorm"}});
    v("norm_epsilon", norm_epsilon, "Epsilon of the norm layers", Min{0});
    v("swiglu", swiglu, "SwiGLU MLP (false: GELU, erf form)");
    v("position_embedding_type", position_embedding_type, "Position embedding", OneOf{{"rope"}});
    v("rotary_base", rotary_base, "RoPE base (theta)", Min{1});
    v("rope_scaling", rope_scaling, "Llama 3.1 RoPE frequency scaling");
    v("rope_scaling_factor", rope_scaling_factor, "Llama 3.1 scaling: factor", Min{1});
    v("rope_scaling_low_freq_factor", rope_scaling_low_freq_factor, "Llama 3.1 scaling: low_freq_factor", Min{0});
    v("rope_scaling_high_freq_factor", rope_scaling_high_freq_factor, "Llama 3.1 scaling: high_freq_factor", Min{0});
    v("rope_scaling_original_max_position_embeddings", rope_scaling_original_max_position_embeddings,
      "Llama 3.1 and YaRN scaling: the pre-training context length", Min{1});
    v("rope_type", rope_type, "rope (plain, or Llama 3.1-scaled with rope_scaling) or yarn (YaRN scaling)",
      OneOf{{"rope", "yarn"}});
    v("rotary_scaling_factor", rotary_scaling_factor, "YaRN: the context extension factor", Min{1});
    v("mscale", mscale, "YaRN: mscale of the attention factor", Min{0});
    v("mscale_all_dim", mscale_all_dim,
      "YaRN: mscale_all_dim (0: none; MLA also scales the softmax by mscale(factor, it)^2)", Min{0});
    v("beta_fast", beta_fast, "YaRN: rotations above which frequencies are kept", Min{0});
    v("beta_slow", beta_slow, "YaRN: rotations below which frequencies are interpolated", Min{0});
    v("rotary_interleaved", rotary_interleaved, "RoPE rotates pairs (x[2i], x[2i+1]) (DeepSeek) instead of halves");
    v("mrope_section", mrope_section,
      "M-RoPE (Qwen2.5-VL): temporal, height, width sections of the head_dim / 2 rotary frequencies (empty: 1D RoPE)",
      Min{1});
    v("mrope_interleaved", mrope_interleaved,
      "M-RoPE (Qwen3-VL): the height and width frequencies interleaved with the temporal ones (t, h, w, t, h, w, ...) "
      "instead of contiguous sections; needs mrope_section");
    v("untie_embeddings_and_output_weights", untie_embeddings_and_output_weights,
      "Separate output layer instead of the transposed embedding");
    v("add_bias_linear", add_bias_linear, "Biases in the linear layers");
    v("add_qkv_bias", add_qkv_bias, "Bias in the QKV projection only (Qwen2)");
    v("qk_layernorm", qk_layernorm, "RMSNorm on queries and keys per head (Qwen3)");
    v("init_method_std", init_method_std, "Std of the normal initialisation", Min{0});
    v("hidden_dropout", hidden_dropout, "Dropout after attention and MLP (training mode only)", Min{0}, Max{1});
    v("attention_dropout", attention_dropout, "Dropout of attention probabilities", Min{0}, Max{1});
    v("group_query_attention", group_query_attention, "Megatron's GQA switch (num_query_groups decides)");
    v("cross_entropy_loss_fusion", cross_entropy_loss_fusion,
      "Training loss: output layer and cross entropy in one op over chunks of tokens (false: whole logits, "
      "then the cross entropy)");
    v("multi_latent_attention", multi_latent_attention,
      "Multi-latent attention (DeepSeek-V2/V3): low-rank queries and a compressed key/value latent");
    v("q_lora_rank", q_lora_rank, "MLA: query bottleneck rank (0: no bottleneck)", Min{0});
    v("kv_lora_rank", kv_lora_rank, "MLA: key/value latent rank", Min{0});
    v("qk_head_dim", qk_head_dim, "MLA: query/key dims per head without RoPE", Min{0});
    v("qk_pos_emb_head_dim", qk_pos_emb_head_dim, "MLA: query/key dims per head with RoPE", Min{0});
    v("v_head_dim", v_head_dim, "MLA: value dims per head", Min{0});
    v("experimental_attention_variant", experimental_attention_variant,
      "none, or dsa: DeepSeek Sparse Attention (DeepSeek-V3.2) on multi-latent attention: a lightning indexer "
      "selects dsa_indexer_topk keys per query and attention runs over those only",
      OneOf{{"none", "dsa"}});
    v("dsa_indexer_n_heads", dsa_indexer_n_heads, "DSA: the indexer's query heads (DeepSeek-V3.2: 64)", Min{0});
    v("dsa_indexer_head_dim", dsa_indexer_head_dim,
      "DSA: the indexer's head size; its first qk_pos_emb_head_dim dims rotate (DeepSeek-V3.2: 128)", Min{0});
    v("dsa_indexer_topk", dsa_indexer_topk, "DSA: keys each query attends to (DeepSeek-V3.2: 2048)", Min{0});
    v("dsa_indexer_loss_coeff", dsa_indexer_loss_coeff,
      "DSA: weight of the indexer's KL loss against the attention's head-summed, L1-normalised distribution over "
      "the selected keys (the trainer reports it as 'indexer loss'); 0: no loss",
      Min{0});
    v("dsa_indexer_warmup", dsa_indexer_warmup,
      "DSA warm-up stage (the paper's dense warm-up): dense attention (every causal key selected), the indexer's "
      "KL loss over all keys, and every weight but the indexers' frozen");
    v("num_experts", num_experts, "Routed experts per MoE layer (0: a dense model)", Min{0});
    v("moe_ffn_hidden_size", moe_ffn_hidden_size, "Hidden size of one routed expert (0: ffn_hidden_size)", Min{0});
    v("moe_router_topk", moe_router_topk, "Experts each token is routed to", Min{1});
    v("moe_router_score_function", moe_router_score_function,
      "Router scores: softmax (Qwen, Mixtral, DeepSeek-V2) or sigmoid (DeepSeek-V3)", OneOf{{"softmax", "sigmoid"}});
    v("moe_router_pre_softmax", moe_router_pre_softmax,
      "softmax scores: softmax over every expert before the top-k (weights unnormalised); false: softmax over "
      "the top-k logits (weights sum to 1)");
    v("moe_router_num_groups", moe_router_num_groups,
      "Group-limited routing (DeepSeek-V3 n_group): experts in this many groups; 0: off", Min{0});
    v("moe_router_group_topk", moe_router_group_topk,
      "Group-limited routing (topk_group): groups each token may use", Min{0});
    v("moe_router_topk_scaling_factor", moe_router_topk_scaling_factor,
      "Multiplies the routing weights (DeepSeek's routed_scaling_factor); 0: none", Min{0});
    v("moe_router_load_balancing_type", moe_router_load_balancing_type,
      "Load-balancing loss: aux_loss (over the micro-batch), seq_aux_loss (per sequence, DeepSeek) or none",
      OneOf{{"aux_loss", "seq_aux_loss", "none"}});
    v("moe_aux_loss_coeff", moe_aux_loss_coeff, "Weight of the load-balancing loss (0: off)", Min{0});
    v("moe_z_loss_coeff", moe_z_loss_coeff, "Weight of the router z-loss (0: off)", Min{0});
    v("moe_router_enable_expert_bias", moe_router_enable_expert_bias,
      "Aux-loss-free balancing: a per-expert bias added to the scores for selection, updated after every step");
    v("moe_router_bias_update_rate", moe_router_bias_update_rate,
      "Expert bias update: bias += rate * sign(mean load - expert load)", Min{0});
    v("moe_shared_expert_intermediate_size", moe_shared_expert_intermediate_size,
      "Hidden size of the shared experts (all of them together); 0: none", Min{0});
    v("moe_shared_expert_gate", moe_shared_expert_gate,
      "Shared experts' output scaled by sigmoid(x . gate) (Qwen1.5/2-MoE); false: added as is (DeepSeek)");
    v("moe_layer_freq", moe_layer_freq,
      "Which layers are MoE: N (every N-th, from layer 0) or a pattern such as ([0]*3+[1]*58) or [0,1,1,1]");
    v("moe_expert_capacity_factor", moe_expert_capacity_factor,
      "Per-expert capacity ceil(tokens * topk / experts * factor), the rest dropped; 0: dropless", Min{0});
    v("moe_token_drop_policy", moe_token_drop_policy,
      "Over capacity drop the lowest routing weights (probs) or the latest tokens (position)",
      OneOf{{"probs", "position"}});
    v("mtp_num_layers", mtp_num_layers,
      "Multi-token prediction layers (DeepSeek-V3's MTP): each embeds the tokens one further ahead, joins them "
      "with the previous layer's hidden states and predicts one token further; 0: none",
      Min{0});
    v("mtp_loss_scaling_factor", mtp_loss_scaling_factor,
      "Weight of the MTP loss: the mean over MTP layers of their token-mean cross entropy times this", Min{0});
  }

  bool is_moe() const { return num_experts > 0; }
  bool dsa() const { return experimental_attention_variant == "dsa"; }
  // Parameters of one layer's DSA indexer (0 without DSA).
  int64_t dsa_indexer_parameters() const;
  // Per layer whether its MLP is MoE (moe_layer_freq); throws naming the field when malformed.
  std::vector<bool> moe_layer_pattern() const;
  int64_t expert_ffn_hidden_size() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_hidden_size; }
  // The attention's softmax scale: 1/sqrt(query head size), times mscale(factor, mscale_all_dim)^2
  // for MLA with YaRN (DeepSeek).
  double softmax_scale() const;
  int64_t query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  int64_t head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  // The embedding rows: vocab_size rounded up to make_vocab_size_divisible_by * tp.
  int64_t padded_vocab_size(int64_t tp = 1) const;
  int64_t num_parameters() const;
  // Parameters of layer i (its MLP dense or MoE; expert bias included).
  int64_t layer_parameters(int64_t i) const;
  // A layer's parameters by kind (MoE or dense MLP), and all MTP layers' (each: two norms, the
  // [h, 2h] projection, a transformer layer, its final norm); num_parameters() includes them.
  int64_t layer_parameters_of(bool moe) const;
  int64_t mtp_parameters() const;
  // Of those, the routed experts' weights (0 for a dense layer): what expert parallelism splits.
  int64_t routed_expert_parameters(int64_t i) const;
  int64_t routed_experts_per_moe_layer() const;  // 0 for a dense model
  // Parameters a token passes through (MoE: top-k routed experts, not all); = num_parameters dense.
  int64_t num_active_parameters() const;
  // Training FLOPs per token (forward + backward = 3x forward) at sequence length `seq`:
  // 6 * matmul parameters + the attention score/value products (12 * layers * seq * q-width / 2,
  // causal). The number MFU divides by.
  double flops_per_token(int64_t seq) const;
  // Cross-field checks (heads divide, GQA divides, head dim even for RoPE ...); issues name the
  // key under `prefix` and its origin in `tree`.
  void validate(const lf::config::Node& tree, const std::string& prefix,
                lf::config::ErrorList& errors) const;
  // Checks against a parallel layout, before any process group exists (--dry-run reports them):
  // heads, query groups and ffn_hidden_size divisible by tp; with sequence parallelism the
  // sequence too; seq_length within max_position_embeddings. `job` is the resolved job tree
  // (issues name model.foundation.<field> and the training/parallel keys with their origins).
  void validate_layout(const lf::config::Node& job, int64_t tp, bool sequence_parallel,
                       int64_t seq_length, lf::config::ErrorList& errors) const;
};

}  // namespace lf::models

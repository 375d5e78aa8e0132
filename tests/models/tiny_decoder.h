// The tiny decoder shape the model tests share: 2 layers, hidden 32, GQA 4 heads / 2 groups,
// vocabulary 50 padded to 56 (so padding is exercised), 16 positions. Tests adjust fields.
#pragma once

#include "loongforge/models/foundations/decoder_config.h"

namespace lf::testing {

inline lf::models::DecoderConfig tiny_decoder_config() {
  lf::models::DecoderConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.ffn_hidden_size = 48;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 8;
  c.max_position_embeddings = 16;
  return c;
}

// Multi-latent attention on a tiny shape (DeepSeek-style: a query bottleneck unless q_lora is
// false, YaRN with mscale_all_dim != mscale over `original` positions, interleaved rotary dims).
inline void make_tiny_mla(lf::models::DecoderConfig& c, bool q_lora = true, int64_t original = 4) {
  c.multi_latent_attention = true;
  c.q_lora_rank = q_lora ? 12 : 0;
  c.kv_lora_rank = 10;
  c.qk_head_dim = 6;
  c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 5;
  c.rope_type = "yarn";
  c.rotary_scaling_factor = 4;
  c.mscale_all_dim = 0.7;
  c.rope_scaling_original_max_position_embeddings = original;
  c.rotary_interleaved = true;
}

}  // namespace lf::testing

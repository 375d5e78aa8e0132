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

}  // namespace lf::testing

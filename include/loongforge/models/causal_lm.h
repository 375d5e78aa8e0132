// The `causal_lm` composite: a foundation (the decoder backbone) plus an LM head, assembled from
// the `model:` subtree of a job config. Swapping the backbone is a one-line change of the
// foundation's defaults entry. Not the decoder itself (models/decoder.h).
#pragma once

#include <string>

#include "loongforge/core/config/node.h"
#include "loongforge/models/decoder_config.h"

namespace lf::models {

struct CausalLmConfig {
  DecoderConfig foundation;
  // The `model:` subtree with every foundation default filled in (origin: default), for
  // --dry-run printing.
  lf::config::Node resolved;
};

// Loads and validates `model` (type must be causal_lm). All problems are reported together in
// one lf::config::ConfigError naming the keys as model.foundation.<field>.
CausalLmConfig load_causal_lm(const lf::config::Node& model);

}  // namespace lf::models

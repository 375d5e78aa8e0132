#include "loongforge/models/model.h"

#include "loongforge/core/error.h"

namespace lf::models {

StageOutput Model::chunk_forward(const Batch&, const TensorMap&, int64_t, ChunkAttention&, bool, Pass) {
  LF_FAIL("model type ", type(), " does not run under ChunkPipe",
          lf::hint("drop --chunkpipe-chunk-size (ChunkPipe needs a causal_lm)"));
}

}  // namespace lf::models

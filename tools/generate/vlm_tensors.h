// loongforge-generate for the VLMs whose inputs come as their processor's tensors: qwen3_vl
// (pixel_values [patches, C T P P] + image_grid_thw, pixel_values_videos + video_grid_thw, as
// Qwen3VLProcessor makes them) and internvl (pixel_values [tiles, C, S, S], as InternVLProcessor
// makes them), given with --vision-inputs FILE.safetensors beside --input-ids (placeholders
// included). Logits of the ids (--dump-logits) or a continuation that recomputes the whole
// sequence per token.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/core/safetensors.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/generation.h"
#include "loongforge/models/hf_vlm.h"

namespace lf::tools::generate {

// One tensor of a --vision-inputs file: floats (F32, F16, BF16, F64) or I64 / I32 grids, as stored;
// another dtype is an error naming the file and the tensor.
at::Tensor tensor_of(const lf::safetensors::Reader& r, const lf::safetensors::TensorInfo& info);

class TensorVlm {
 public:
  // config: a qwen3_vl or internvl model; tensors: its full tensors under our names (consumed);
  // vision_inputs: the processor's tensors (empty: text only).
  TensorVlm(const lf::models::hf::VlmConfig& config, std::map<std::string, at::Tensor>& tensors, bool bf16,
            const std::string& vision_inputs);
  ~TensorVlm();
  // [s, vocab] fp32 logits of ids with the media.
  at::Tensor logits(const std::vector<int64_t>& ids) const;
  // Greedy or sampled continuation (stops at a stop id, a placeholder token, max_new_tokens or the
  // model's positions).
  std::vector<int64_t> continue_ids(std::vector<int64_t> ids, const lf::models::GenerateOptions& options) const;

 private:
  lf::models::hf::VlmConfig config_;
  std::unique_ptr<lf::models::CausalLm> model_;
  std::map<std::string, at::Tensor> media_;
};

}  // namespace lf::tools::generate

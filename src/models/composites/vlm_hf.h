// A *ForConditionalGeneration state dict into a Qwen-VL composite (qwen2_5_vl, qwen3_vl): the
// tensors under `visual` go to `load_tower` (when this stage holds the tower), the language model's
// (under `lm`, and lm_head.*) through the HF family's mapping; a tensor of neither, or a language
// model tensor the mapping does not use, is an error naming it. Internal to src/models/composites.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "loongforge/core/error.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/hf_adapter.h"

namespace lf::models {

inline void load_vlm_hf_state(CausalLm& model, const std::map<std::string, at::Tensor>& tensors,
                              const std::string& visual, const std::string& lm, const std::string& architecture,
                              const std::string& family, const std::string& checkpoint_class,
                              const std::function<void(const std::map<std::string, at::Tensor>&)>& load_tower) {
  for (const auto& [name, t] : tensors)
    LF_CHECK(name.rfind(visual, 0) == 0 || name.rfind(lm, 0) == 0 || name.rfind("lm_head.", 0) == 0, "HF tensor '",
             name, "' is neither the vision tower's (", visual, "*) nor the language model's (", lm,
             "*, lm_head.*)", lf::hint("is this a " + checkpoint_class + " state dict?"));
  if (load_tower) {
    std::map<std::string, at::Tensor> vision;
    for (const auto& [name, t] : tensors)
      if (name.rfind(visual, 0) == 0) vision.emplace(name, t);
    load_tower(vision);
  }
  const auto mapping = hf::mapping_for_architecture(architecture, family);
  std::vector<std::string> used;
  const auto full = hf::decoder_from_hf_tensors(model.config(), mapping, tensors, lm, model.tp_size(), &used);
  const std::set<std::string> read(used.begin(), used.end());
  for (const auto& [name, t] : tensors)
    LF_CHECK(name.rfind(visual, 0) == 0 || read.count(name), "HF tensor '", name,
             "' has no place in this model's language model (", model.config().num_layers, " layers, ", family,
             " mapping)", lf::hint("the checkpoint and model.foundation disagree (e.g. num_layers)"));
  model.load_full_parameters({full.begin(), full.end()});
}

}  // namespace lf::models

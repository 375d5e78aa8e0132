// LeRobot's pi05 policy directories (what PI05Policy.save_pretrained writes: config.json with
// "type": "pi05" and model.safetensors) <-> the `pi05` composite. The composite uses LeRobot's
// parameter names without the policy's "model." prefix. LeRobot's config names only variants
// (gemma_2b, gemma_300m) and fixes the rest in code, so the widths, depths, MLP sizes, head dims,
// the vision patch, resolution and layer count come from the weights' shapes and the head counts
// are LeRobot's (8 query heads in both Gemma parts, 16 in SigLIP): tiny test policies convert as
// real ones do. Not the native checkpoint format (train/checkpoint.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loongforge/models/composites/pi05.h"

namespace lf::models::lerobot {

// Everything a pi05 model is built from.
struct Pi05Setup {
  SiglipConfig vision;
  PiGemmaConfig vlm, expert;
  Pi05Config policy;
};

// True when `dir` holds a config.json whose "type" is "pi05".
bool is_pi05_dir(const std::string& dir);
// config.json + the weights' shapes -> the setup (validated); errors name the file and the key or
// tensor.
Pi05Setup read_pi05_setup(const std::string& dir);
// The model's tensors of the directory by LoongForge name (float32 unless dtype): "model." dropped,
// the unused LM heads dropped (the PaliGemma one stands in for a missing token embedding, as
// LeRobot's loader does).
std::map<std::string, at::Tensor> read_pi05_weights(const std::string& dir,
                                                    std::optional<at::ScalarType> dtype = std::nullopt);
// The tensors of `setup`'s model from `tensors`, in the model's order, checked: each present with
// its shape and no other tensor. Errors name `source` and the tensor.
std::vector<std::pair<std::string, at::Tensor>> checked_pi05_tensors(const Pi05Setup& setup,
                                                                     std::map<std::string, at::Tensor> tensors,
                                                                     const std::string& source);
// Writes config.json and model.safetensors as LeRobot's save_pretrained does, the LM heads
// included (PaliGemma's tied to the token embedding; the expert's, which nothing reads, zero).
// template_config: a LeRobot config.json whose other keys (features, normalisation, optimiser
// presets) are kept; empty: LeRobot's defaults with one camera per image of the model.
void write_pi05(const std::string& out_dir, const Pi05Setup& setup,
                const std::vector<std::pair<std::string, at::Tensor>>& full, at::ScalarType dtype,
                const std::string& template_config = "");

// The `model:` section a converted checkpoint stores as config.yaml, and the setup back from a
// checkpoint's config.yaml (nullopt when its model is not pi05).
std::string pi05_model_section_yaml(const Pi05Setup& setup);
std::optional<Pi05Setup> pi05_setup_from_model_section(const std::string& yaml_text, const std::string& source);
// The parameter shardings of the setup's model at `tp` ranks (native checkpoints split by them).
std::map<std::string, lf::parallel::Sharding> pi05_shardings(const Pi05Setup& setup, int tp);

// The file a converted checkpoint keeps LeRobot's config.json in (lf2hf writes it back).
inline constexpr const char* kLerobotConfigFile = "lerobot_config.json";

}  // namespace lf::models::lerobot

// HF transformers checkpoints (config.json + safetensors, sharded or not) <-> LoongForge's full,
// unsharded decoder tensors and DecoderConfig. Each family's names, shapes and layout transforms
// are data: configs/models/<family>/hf.yaml (docs/conversion.md), so adding a family adds a file.
// Not the native checkpoint format (train/checkpoint.h) and no TP/PP sharding: tensors are whole.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loongforge/models/foundations/decoder_config.h"

namespace lf::models {
class CausalLm;
}

namespace lf::models::hf {

// (name, tensor) in a stable order: LoongForge names (decoder.layers.0...) or HF names.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One family's mapping file, parsed and checked (every problem names the file and the key).
class Mapping {
 public:
  struct Impl;
  explicit Mapping(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  const std::string& path() const;
  const std::string& architecture() const;  // "Qwen3ForCausalLM"
  const std::string& model_type() const;    // "qwen3"
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// configs_root: the configs/ directory; "" = lf::config::source_configs_dir().
Mapping load_mapping(const std::string& yaml_path);
// Every configs/models/*/hf.yaml, sorted by path.
std::vector<Mapping> all_mappings(const std::string& configs_root = "");
// The mapping whose architecture (else model_type) matches; an lf::Error listing the known ones
// otherwise.
Mapping mapping_for_architecture(const std::string& architecture, const std::string& model_type = "",
                                 const std::string& configs_root = "");
// The one mapping able to express `config` in config.json (its `fixed` fields match and every
// field survives config.json and back); an lf::Error saying why each family cannot otherwise.
Mapping mapping_for_config(const DecoderConfig& config, const std::string& configs_root = "");

// config.json -> DecoderConfig (validated). `mapping` null: chosen by the file's architectures.
DecoderConfig read_hf_config(const std::string& hf_dir, const Mapping* mapping = nullptr,
                             const std::string& configs_root = "");
// DecoderConfig -> config.json text (transformers-4 style keys: rope_theta, rope_scaling, which
// transformers 5 also reads). Throws when the mapping cannot express the config.
std::string hf_config_json(const DecoderConfig& config, const Mapping& mapping,
                           at::ScalarType dtype);

// True when `dir` looks like an HF model directory (config.json and model.safetensors or
// model.safetensors.index.json): for programs that accept either a native checkpoint or HF.
bool is_hf_model_dir(const std::string& dir);

// The image processor's settings travel with the weights (loongforge-generate --image reads them
// from --load): copies from/preprocessor_config.json into `to` (created) when there is one;
// returns whether it did.
bool copy_preprocessor_config(const std::string& from, const std::string& to);

struct ReadOptions {
  std::string configs_root;
  // The vocabulary tables get padded_vocab_size(vocab_tp) rows (zero padding), the rows the
  // decoder has at that TP size.
  int64_t vocab_tp = 1;
  // Convert every tensor to this dtype; nullopt keeps the file's (bf16 / fp16 / fp32).
  std::optional<at::ScalarType> dtype;
  // FP8 block-quantized checkpoints (config.json quantization_config {quant_method: fp8,
  // weight_block_size: [r, c]}, as DeepSeek-V3 and Qwen's -FP8 releases ship): each FP8 weight is
  // read as weight x its r x c block's weight_scale_inv, computed in fp32, then in `dtype`, or
  // when that is nullopt in this one (bf16, as DeepSeek's fp8_cast_bf16 writes them).
  at::ScalarType dequantized_dtype = at::kBFloat16;
};

struct HfModel {
  DecoderConfig config;
  std::string architecture;
  NamedTensors tensors;  // LoongForge names, full tensors, in the decoder's parameter order
};

// Reads hf_dir/config.json and model.safetensors or model.safetensors.index.json + its shards.
// Errors (lf::Error) name the file and tensor: a missing shard, a tensor missing or of the wrong
// shape for config.json, a tensor the mapping does not know, an unsupported dtype or config value.
HfModel read_hf(const std::string& hf_dir, const ReadOptions& options = {});

struct WriteOptions {
  std::string configs_root;
  std::string architecture;              // "" = the mapping chosen by mapping_for_config
  at::ScalarType dtype = at::kBFloat16;  // bf16, fp16 or fp32
  int64_t max_shard_bytes = 5'000'000'000;  // HF's default "5GB"; one shard: model.safetensors
};

// Writes out_dir/config.json and the weights (model.safetensors, or model-0000i-of-0000n.safetensors
// + model.safetensors.index.json when they exceed max_shard_bytes), removing stale weight files of
// an earlier export there. `full`: LoongForge names, unsharded; vocabulary tables with vocab_size
// or more (padding) rows. Every tensor the mapping needs must be present and no other.
void write_hf(const std::string& out_dir, const DecoderConfig& config, const NamedTensors& full,
              const WriteOptions& options = {});

// In-memory HF tensors of a decoder -> LoongForge names, full tensors in the decoder's parameter
// order (vocabulary tables padded to padded_vocab_size(vocab_tp) rows). The mapping's names that
// begin with "model." are looked up with `model_prefix` in its place (a VLM checkpoint's
// "model.language_model."); others (lm_head.weight) as they are. Throws naming the tensor when one
// is missing or has a shape the config contradicts; tensors the mapping does not ask for are the
// caller's (a VLM's vision tower); `used` (optional) receives the names read.
NamedTensors decoder_from_hf_tensors(const DecoderConfig& config, const Mapping& mapping,
                                     const std::map<std::string, at::Tensor>& tensors,
                                     const std::string& model_prefix = "model.", int64_t vocab_tp = 1,
                                     std::vector<std::string>* used = nullptr);

// How two configurations differ in what shapes the weights or the function (dropout, vocabulary
// padding multiple and init_method_std aside): {field, a's value, b's value}, empty when alike.
struct ConfigDifference {
  std::string field, ours, theirs;
};
std::vector<ConfigDifference> model_differences(const DecoderConfig& a, const DecoderConfig& b,
                                                bool with_init = false);

// The online form of hf2lf (loongforge-train --load HF_DIR, loongforge-generate): reads hf_dir
// and copies its weights into `decoder` (this rank's shards at the decoder's TP size), after
// checking that config.json describes the decoder's model (an lf::Error lists every difference).
// Returns the configuration read. A vision-language directory (hf_vlm.h's table) goes to
// load_vlm_hf_into: `decoder` must then be that composite.
DecoderConfig load_hf_into(CausalLm& decoder, const std::string& hf_dir,
                           const std::string& configs_root = "");

// The `model:` section (type causal_lm + the foundation's fields) that loongforge-train and
// loongforge-generate compose, as YAML text; and back.
std::string model_section_yaml(const DecoderConfig& config);
DecoderConfig config_from_model_section(const std::string& yaml_text, const std::string& source);

}  // namespace lf::models::hf

// The decoder-only transformer (LLaMA/Qwen style: RMSNorm, RoPE, GQA attention, SwiGLU MLP),
// written once for one device; every fused op goes through the DeviceBackend (backend/functional.h).
// Not parallel by itself: tensor/pipeline parallel versions shard these same parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/models/decoder_config.h"

namespace lf::models {

struct NamedParameter {
  std::string name;     // Megatron-style: decoder.layers.0.self_attention.linear_qkv.weight
  at::Tensor tensor;    // requires_grad leaf
  bool no_weight_decay;  // norms and biases
};

class Decoder {
 public:
  // Parameters are drawn from `seed` on the CPU in a fixed order, then moved to the backend's
  // device, so the same seed gives the same model on every backend and layout.
  Decoder(const DecoderConfig& config, const lf::backend::DeviceBackend& backend, uint64_t seed,
          at::ScalarType dtype);

  // tokens: [b, s] int64 -> logits: [s, b, v_padded]
  at::Tensor forward(const at::Tensor& tokens) const;
  // tokens, labels: [b, s] -> per-token loss [s * b] fp32 (labels < 0 are ignored: loss 0)
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& labels) const;

  const std::vector<NamedParameter>& parameters() const { return params_; }
  const DecoderConfig& config() const { return config_; }

 private:
  struct Layer {
    at::Tensor input_norm, qkv, proj, pre_mlp_norm, fc1, fc2;
  };
  at::Tensor add(std::string name, at::Tensor t, bool no_decay);
  // x: [s, b, h] -> [s, b, h]
  at::Tensor attention(const Layer& l, const at::Tensor& x, const at::Tensor& cos,
                       const at::Tensor& sin) const;
  at::Tensor mlp(const Layer& l, const at::Tensor& x) const;

  DecoderConfig config_;
  const lf::backend::DeviceBackend& backend_;
  std::vector<NamedParameter> params_;
  at::Tensor embedding_, final_norm_, output_;
  std::vector<Layer> layers_;
};

// cos, sin: [s, head_dim] for positions 0..s-1 (Megatron's non-interleaved halves layout).
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t seq, int64_t head_dim, double base,
                                              const at::TensorOptions& options);

}  // namespace lf::models

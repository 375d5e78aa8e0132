// The `mlp_encoder` component: an MLP over float feature vectors (fc1, GELU or SwiGLU, fc2 to the
// foundation's width), the smallest encoder whose outputs a composite splices into a
// foundation's sequence (the skeleton of a VLM's vision encoder + projector). Tensor-parallel
// over its own context's TP group (fc1 column-, fc2 row-parallel). Not a ViT.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "loongforge/backend/device_backend.h"
#include "loongforge/core/config/schema.h"
#include "loongforge/models/blocks/mlp.h"

namespace lf::models {

class Registry;

struct MlpEncoderConfig {
  int64_t input_size = 0;       // feature width
  int64_t ffn_hidden_size = 0;
  int64_t output_size = 0;      // 0: the foundation's hidden size
  bool swiglu = false;          // false: GELU
  bool add_bias_linear = true;
  double init_method_std = 0.02;

  template <class V>
  void visit(V& v) {
    v("input_size", input_size, "Width of the input feature vectors", lf::config::Required{}, lf::config::Min{1});
    v("ffn_hidden_size", ffn_hidden_size, "Hidden width of the MLP", lf::config::Required{}, lf::config::Min{1});
    v("output_size", output_size, "Output width (0: the foundation's hidden size)", lf::config::Min{0});
    v("swiglu", swiglu, "SwiGLU activation (false: GELU)");
    v("add_bias_linear", add_bias_linear, "Biases in both linear layers");
    v("init_method_std", init_method_std, "Std of the normal initialisation", lf::config::Min{0});
  }
  // With output_size resolved (the composite fills it from its foundation).
  int64_t num_parameters() const;
};

class MlpEncoder {
 public:
  MlpEncoder() = default;
  // Registers <name>.linear_fc1.* and <name>.linear_fc2.* (Mlp block layout) in `b`;
  // config.output_size must be resolved (> 0).
  MlpEncoder(const MlpEncoderConfig& config, const lf::backend::DeviceBackend& backend, ParamBuilder& b,
             const std::string& name);
  // features: [n, input_size] -> [n, output_size], replicated over this encoder's TP group.
  at::Tensor forward(const at::Tensor& features) const;

 private:
  MlpEncoderConfig c_;
  const lf::backend::DeviceBackend* backend_ = nullptr;
  lf::parallel::TensorParallel tp_;
  Mlp mlp_;
};

void register_mlp_encoder(Registry& r);

}  // namespace lf::models

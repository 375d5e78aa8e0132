#include "loongforge/models/encoders/mlp_encoder.h"

#include <ATen/Functions.h>

#include "loongforge/core/error.h"
#include "loongforge/models/registry.h"

namespace lf::models {

int64_t MlpEncoderConfig::num_parameters() const {
  const int64_t in = swiglu ? 2 * ffn_hidden_size : ffn_hidden_size;
  int64_t n = in * input_size + output_size * ffn_hidden_size;
  if (add_bias_linear) n += in + output_size;
  return n;
}

MlpEncoder::MlpEncoder(const MlpEncoderConfig& c, const lf::backend::DeviceBackend& backend, ParamBuilder& b,
                       const std::string& name)
    : c_(c), backend_(&backend), tp_(b.tp()) {
  LF_CHECK(c.output_size > 0, "mlp_encoder ", name, ": output_size is not resolved");
  LF_CHECK(c.ffn_hidden_size % tp_.size() == 0, "mlp_encoder ", name, ": ffn_hidden_size ", c.ffn_hidden_size,
           " is not divisible by its tensor-parallel size ", tp_.size(),
           lf::hint("set model." + name + ".tensor_model_parallel_size to a divisor of ffn_hidden_size"));
  MlpConfig m;
  m.hidden_size = c.input_size;
  m.ffn_hidden_size = c.ffn_hidden_size;
  m.output_size = c.output_size;
  m.swiglu = c.swiglu;
  m.bias = c.add_bias_linear;
  m.init_std = m.out_std = c.init_method_std;
  mlp_ = Mlp(b, name, m);
}

at::Tensor MlpEncoder::forward(const at::Tensor& features) const {
  LF_CHECK(features.dim() == 2 && features.size(1) == c_.input_size, "mlp_encoder: features must be [n, ",
           c_.input_size, "], got ", features.sizes());
  // The TP layers take [s, b, h]: the rows as a sequence of one sample.
  return mlp_.forward(*backend_, tp_, features.unsqueeze(1)).squeeze(1);
}

void register_mlp_encoder(Registry& r) {
  r.add(ComponentType{"mlp_encoder", "encoder", "MLP over float feature vectors (fc1, GELU/SwiGLU, fc2)",
                      schema_loader<MlpEncoderConfig>()});
}

}  // namespace lf::models

#include "builtin_types.h"

#include "composites/causal_lm_plan.h"
#include "loongforge/models/composites/feature_regression.h"
#include "loongforge/models/composites/flow_matching.h"
#include "loongforge/models/composites/groot.h"
#include "loongforge/models/composites/internvl.h"
#include "loongforge/models/composites/pi05.h"
#include "loongforge/models/composites/qwen2_5_vl.h"
#include "loongforge/models/composites/qwen3_vl.h"
#include "loongforge/models/composites/spliced_lm.h"
#include "loongforge/models/encoders/intern_vit.h"
#include "loongforge/models/encoders/mlp_encoder.h"
#include "loongforge/models/encoders/qwen2_5_vl_vision.h"
#include "loongforge/models/encoders/qwen3_vl_vision.h"
#include "loongforge/models/foundations/decoder_config.h"
#include "loongforge/models/registry.h"

namespace lf::models {

void register_builtin_types(Registry& r) {
  r.add(ComponentType{"decoder", "foundation",
                      "Decoder-only transformer (LLaMA / Qwen / Mistral family): token embedding, causal layers, "
                      "final norm",
                      schema_loader<DecoderConfig>()});
  register_mlp_encoder(r);
  register_qwen25_vision(r);
  register_qwen3_vision(r);
  register_intern_vision(r);
  register_causal_lm(r);
  register_spliced_lm(r);
  register_feature_regression(r);
  register_flow_matching(r);
  register_pi05(r);
  register_groot(r);
  register_qwen2_5_vl(r);
  register_qwen3_vl(r);
  register_internvl(r);
}

}  // namespace lf::models

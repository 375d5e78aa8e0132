// LoRA adapters (Hu et al.; PEFT's LoraLayer semantics) on the decoder's linear layers:
// delta(x) = B(A(dropout(x))) * scale with A [r, in], B [out, r], scale alpha / r (alpha / sqrt(r)
// with rsLoRA), A drawn as PEFT draws it (Kaiming-uniform, bound 1 / sqrt(in)) and B zero, so a
// fresh adapter leaves the model unchanged. Tensor-parallel as Megatron's layers they sit on: on a
// column-parallel layer (q/k/v, gate/up) A is replicated and B split along its output rows; on a
// row-parallel layer (o, down) A is split along its input columns and B replicated; the adapter
// all-gathers / reduces only its rank-r activation. PEFT's module names throughout. Not the base
// layers (attention.h, mlp.h) or the adapters' file format (models/lora_io.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/models/blocks/param_builder.h"
#include "loongforge/parallel/tensor/random.h"

namespace lf::models {

// PEFT's target-module names, in the order adapters are drawn per layer.
enum class LoraModule { q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj };
inline constexpr std::array<LoraModule, 7> kLoraModules = {LoraModule::q_proj,    LoraModule::k_proj,
                                                            LoraModule::v_proj,    LoraModule::o_proj,
                                                            LoraModule::gate_proj, LoraModule::up_proj,
                                                            LoraModule::down_proj};
const char* lora_module_name(LoraModule m);
// "q_proj" -> q_proj; throws naming the known names otherwise.
LoraModule lora_module_of(const std::string& name);
// The attention modules sit under self_attn in HF's layer, the MLP ones under mlp.
bool is_attention_module(LoraModule m);

struct LoraSpec {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 8;
  double dropout = 0;
  bool rslora = false;
  std::vector<LoraModule> targets;
  bool enabled() const { return rank > 0; }
  bool targets_module(LoraModule m) const;
  double scale() const;
  // From PEFT names ("all-linear": every module).
  static LoraSpec from(int64_t rank, double alpha, double dropout, bool rslora, const std::vector<std::string>& names);
};

// One adapter. Parameters `<prefix>.lora_A.weight` [r, in] and `<prefix>.lora_B.weight` [out, r].
class LoraAdapter {
 public:
  enum class Kind { column, row };
  LoraAdapter() = default;
  LoraAdapter(ParamBuilder& b, const std::string& prefix, int64_t in, int64_t out, Kind kind, const LoraSpec& spec);
  bool on() const { return a_.defined(); }
  // column: x [s(/tp), b, in] (the layer's input before its SP gather) -> [s, b, out / tp];
  // row: x [s, b, in / tp] -> [s(/tp), b, out], summed over TP (added to the layer's output).
  // `dropout_gen`: the stream of the input's layout (null: no dropout, evaluation).
  at::Tensor forward(const lf::parallel::TensorParallel& tp, const at::Tensor& x, at::Generator* dropout_gen) const;
  // Column adapters on one input (q/k/v, gate/up): their A's as one GEMM and one TP collective,
  // then each B; the results in order, undefined for adapters that are off. Without dropout only
  // (PEFT draws a mask per adapter); with it, each adapter on its own.
  static std::vector<at::Tensor> column_group(const lf::parallel::TensorParallel& tp, const at::Tensor& x,
                                              at::Generator* dropout_gen,
                                              const std::vector<const LoraAdapter*>& adapters);

 private:
  Kind kind_ = Kind::column;
  double scale_ = 1, dropout_ = 0;
  at::Tensor a_, b_;
};

// The adapters of one transformer layer (absent modules are off).
struct LayerLora {
  std::array<LoraAdapter, 7> adapters;
  const LoraAdapter& operator[](LoraModule m) const { return adapters[static_cast<size_t>(m)]; }
  LoraAdapter& operator[](LoraModule m) { return adapters[static_cast<size_t>(m)]; }
  bool any() const;
};

// What an adapted layer needs at forward time.
struct LoraInputs {
  const LayerLora* adapters = nullptr;     // null: no adapters
  lf::parallel::RngTracker* rng = nullptr;  // dropout streams (null or !training: none)
  bool training = false;
  // The dropout generator for a column adapter's input (replicated, or a sequence chunk under SP)
  // and a row adapter's (split over TP): null without dropout.
  at::Generator* column_gen(const lf::parallel::TensorParallel& tp) const;
  at::Generator* row_gen(const lf::parallel::TensorParallel& tp) const;
};

}  // namespace lf::models

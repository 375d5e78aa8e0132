#include "loongforge/models/blocks/mlp.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "loongforge/backend/fp8.h"
#include "loongforge/backend/functional.h"
#include "loongforge/models/recompute.h"

namespace lf::models {

Mlp::Mlp(ParamBuilder& b, const std::string& prefix, const MlpConfig& c) : c_(c) {
  const int64_t h = c.hidden_size, f = c.ffn_hidden_size, in = c.swiglu ? 2 * f : f, blocks = c.swiglu ? 2 : 1,
                out = c.output_size > 0 ? c.output_size : h;
  fc1_ = b.add(prefix + ".linear_fc1.weight", b.normal({in, h}, c.init_std), Sharding::along(0, blocks), false);
  if (c.bias) fc1_bias_ = b.add(prefix + ".linear_fc1.bias", at::zeros({in}), Sharding::along(0, blocks), true);
  fc2_ = b.add(prefix + ".linear_fc2.weight", b.normal({out, f}, c.out_std), Sharding::along(1), false);
  if (c.bias) fc2_bias_ = b.add(prefix + ".linear_fc2.bias", at::zeros({out}), Sharding::replicated(), true);
}

at::Tensor Mlp::forward(const lf::backend::DeviceBackend& be, const lf::parallel::TensorParallel& tp,
                        const at::Tensor& x, bool selective_recompute, const LoraInputs* lora,
                        const lf::ops::WeightGradSlots* slots, const Norm* pre_norm,
                        const lf::ops::Fp8Policy* fp8) const {
  const int64_t tokens = x.size(0) * x.size(1) * (tp.sequence_parallel ? tp.size() : 1);  // this rank's GEMM rows
  const lf::ops::Fp8Recipe* fp8_fc1 = fp8 ? fp8->choose(lf::ops::Fp8Gemm::fc1, tokens) : nullptr;
  const lf::ops::Fp8Recipe* fp8_fc2 = fp8 ? fp8->choose(lf::ops::Fp8Gemm::fc2, tokens) : nullptr;
  const LayerLora* ad = lora ? lora->adapters : nullptr;
  const bool adapters_read_x = ad && ((*ad)[LoraModule::gate_proj].on() || (*ad)[LoraModule::up_proj].on());
  // The normed input is a tensor of its own only when gate/up adapters read it too; otherwise the
  // norm goes into linear_fc1 (Norm::first_linear).
  const at::Tensor xn = pre_norm && adapters_read_x ? (*pre_norm)(be, x) : x;
  auto fc1 = pre_norm && !adapters_read_x
                 ? pre_norm->first_linear(be, tp, x, fc1_, fc1_bias_, slots, fp8_fc1)
                 : lf::parallel::column_parallel_linear(xn, fc1_, fc1_bias_, tp, false, slots,
                                                        fp8_fc1);  // [s, b, (2) f / tp]
  if (adapters_read_x) {
    // fc1 is [gate_r; up_r] on this rank: PEFT's gate_proj / up_proj adapters add to each half.
    const auto d = LoraAdapter::column_group(tp, xn, lora->column_gen(tp),
                                             {&(*ad)[LoraModule::gate_proj], &(*ad)[LoraModule::up_proj]});
    const int64_t half = fc1.size(-1) / 2;
    if (d[0].defined() && d[1].defined())
      fc1 = fc1 + at::cat({d[0], d[1]}, -1);
    else if (d[0].defined())
      fc1 = at::cat({fc1.narrow(-1, 0, half) + d[0], fc1.narrow(-1, half, half)}, -1);
    else
      fc1 = at::cat({fc1.narrow(-1, 0, half), fc1.narrow(-1, half, half) + d[1]}, -1);
  }
  const auto kind = c_.swiglu ? lf::ops::Activation::swiglu : lf::ops::Activation::gelu;
  // Without a down_proj adapter nothing else reads the activation: fc2 recomputes it in backward
  // (what selective recompute would do for it), so only fc1's output is held.
  if (!(ad && (*ad)[LoraModule::down_proj].on()))
    return lf::parallel::row_parallel_activated_linear(be, kind, fc1, fc2_, fc2_bias_, tp, slots, fp8_fc2);
  const lf::backend::DeviceBackend* bep = &be;  // the lambda may run again in backward
  auto act = [bep, kind](const at::Tensor& t) { return lf::ops::activation(*bep, kind, t); };
  at::Tensor a = selective_recompute
                     ? lf::models::recompute([act](const std::vector<at::Tensor>& t) { return act(t[0]); }, {fc1})
                     : act(fc1);
  return lf::parallel::row_parallel_linear(a, fc2_, fc2_bias_, tp, slots, fp8_fc2) +
         (*ad)[LoraModule::down_proj].forward(tp, a, lora->row_gen(tp));
}

}  // namespace lf::models

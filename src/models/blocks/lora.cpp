#include "loongforge/models/blocks/lora.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>

#include "loongforge/core/error.h"
#include "loongforge/parallel/tensor/mappings.h"

namespace lf::models {

namespace {
const char* const kNames[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
}  // namespace

const char* lora_module_name(LoraModule m) { return kNames[static_cast<size_t>(m)]; }

LoraModule lora_module_of(const std::string& name) {
  for (LoraModule m : kLoraModules)
    if (name == lora_module_name(m)) return m;
  LF_FAIL("unknown LoRA target module '", name, "'",
           lf::hint("PEFT's names: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj (or all-linear)"));
}

bool is_attention_module(LoraModule m) {
  return m == LoraModule::q_proj || m == LoraModule::k_proj || m == LoraModule::v_proj || m == LoraModule::o_proj;
}

bool LoraSpec::targets_module(LoraModule m) const {
  if (!enabled()) return false;
  for (LoraModule t : targets)
    if (t == m) return true;
  return false;
}

double LoraSpec::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

LoraSpec LoraSpec::from(int64_t rank, double alpha, double dropout, bool rslora, const std::vector<std::string>& names) {
  LoraSpec s;
  s.rank = rank;
  s.alpha = alpha;
  s.dropout = dropout;
  s.rslora = rslora;
  for (const auto& n : names) {
    if (n == "all-linear") {
      s.targets.assign(kLoraModules.begin(), kLoraModules.end());
      return s;
    }
    s.targets.push_back(lora_module_of(n));
  }
  return s;
}

LoraAdapter::LoraAdapter(ParamBuilder& b, const std::string& prefix, int64_t in, int64_t out, Kind kind,
                         const LoraSpec& spec)
    : kind_(kind), scale_(spec.scale()), dropout_(spec.dropout) {
  const int64_t r = spec.rank;
  // PEFT: nn.init.kaiming_uniform_(A, a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)); B = 0.
  at::Tensor a;
  if (b.meta()) {
    a = at::empty({r, in}, at::TensorOptions().dtype(at::kFloat).device(c10::kMeta));
  } else {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    a = at::empty({r, in}, at::kFloat).uniform_(-bound, bound, b.generator());
  }
  const bool column = kind == Kind::column;
  a_ = b.add(prefix + ".lora_A.weight", a, column ? Sharding::replicated() : Sharding::along(1), false);
  b_ = b.add(prefix + ".lora_B.weight", at::zeros({out, r}), column ? Sharding::along(0) : Sharding::replicated(),
             false);
}

at::Tensor LoraAdapter::forward(const lf::parallel::TensorParallel& tp, const at::Tensor& x,
                                at::Generator* dropout_gen) const {
  namespace P = lf::parallel;
  at::Tensor in = dropout_gen && dropout_ > 0 ? P::dropout(x, dropout_, *dropout_gen) : x;
  at::Tensor t = at::matmul(in, a_.t());  // [s(/tp), b, r]: rank-r activations
  const bool split = tp.tp != nullptr && tp.size() > 1;
  if (kind_ == Kind::column) {
    // A is replicated: the rank-r activation enters the TP region like the layer's input (gathered
    // along the sequence under SP; its gradient summed over the ranks' B shards).
    if (split) t = tp.sequence_parallel ? P::gather_from_sequence_parallel(t, *tp.tp) : P::copy_to_tp(t, *tp.tp);
    return at::matmul(t * scale_, b_.t());  // [s, b, out / tp]; the scale on the rank-r side
  }
  // Row: each rank's A shard sees its input columns; the partial rank-r sums are reduced (scattered
  // along the sequence under SP) before the replicated B.
  if (split) t = tp.sequence_parallel ? P::reduce_scatter_to_sequence_parallel(t, *tp.tp) : P::reduce_from_tp(t, *tp.tp);
  return at::matmul(t * scale_, b_.t());  // [s(/tp), b, out]
}

std::vector<at::Tensor> LoraAdapter::column_group(const lf::parallel::TensorParallel& tp, const at::Tensor& x,
                                                  at::Generator* dropout_gen,
                                                  const std::vector<const LoraAdapter*>& adapters) {
  namespace P = lf::parallel;
  std::vector<at::Tensor> out(adapters.size());
  std::vector<at::Tensor> as;
  bool dropout = false;
  for (const LoraAdapter* a : adapters)
    if (a && a->on()) {
      LF_CHECK(a->kind_ == Kind::column, "LoraAdapter::column_group: a row-parallel adapter");
      as.push_back(a->a_);
      dropout = dropout || (dropout_gen && a->dropout_ > 0);
    }
  if (as.size() <= 1 || dropout) {
    for (size_t i = 0; i < adapters.size(); ++i)
      if (adapters[i] && adapters[i]->on()) out[i] = adapters[i]->forward(tp, x, dropout_gen);
    return out;
  }
  at::Tensor t = at::matmul(x, at::cat(as, 0).t());  // [s(/tp), b, sum of ranks]
  if (tp.tp != nullptr && tp.size() > 1)
    t = tp.sequence_parallel ? P::gather_from_sequence_parallel(t, *tp.tp) : P::copy_to_tp(t, *tp.tp);
  int64_t at_col = 0;
  for (size_t i = 0; i < adapters.size(); ++i) {
    const LoraAdapter* a = adapters[i];
    if (!a || !a->on()) continue;
    const int64_t r = a->a_.size(0);
    out[i] = at::matmul(t.narrow(-1, at_col, r) * a->scale_, a->b_.t());
    at_col += r;
  }
  return out;
}

bool LayerLora::any() const {
  for (const auto& a : adapters)
    if (a.on()) return true;
  return false;
}

at::Generator* LoraInputs::column_gen(const lf::parallel::TensorParallel& tp) const {
  if (!training || !rng) return nullptr;
  const bool split = tp.sequence_parallel && tp.size() > 1;
  return &rng->get(split ? lf::parallel::RngTracker::kModelParallel : lf::parallel::RngTracker::kDefault);
}

at::Generator* LoraInputs::row_gen(const lf::parallel::TensorParallel& tp) const {
  if (!training || !rng) return nullptr;
  return &rng->get(tp.size() > 1 ? lf::parallel::RngTracker::kModelParallel : lf::parallel::RngTracker::kDefault);
}

}  // namespace lf::models

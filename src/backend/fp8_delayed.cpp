// Delayed FP8 scaling: the per-group tables of scales and amax histories. See backend/fp8_delayed.h.
#include "loongforge/backend/fp8_delayed.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "loongforge/backend/communicator.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"

namespace lf::ops {

namespace {
constexpr int64_t kColumns = 3;  // input, weight, output gradient
}

Fp8AmaxTable::Fp8AmaxTable(const Fp8Recipe& recipe, const std::vector<Fp8Weight>& weights,
                           std::vector<lf::backend::Communicator*> groups)
    : recipe_(recipe), groups_(std::move(groups)) {
  LF_CHECK(recipe.amax_history_len >= 1, "fp8 delayed scaling: amax history length ", recipe.amax_history_len,
           " (want >= 1)");
  int64_t n = 0;
  at::TensorOptions opts = at::TensorOptions().dtype(at::kFloat);
  for (const auto& [name, w, parts, part] : weights) {
    if (w.dim() != 2 && w.dim() != 3) continue;
    LF_CHECK(parts >= 1 && part >= 0 && part < parts && (parts == 1 || w.dim() == 3), "fp8 delayed scaling: ", name,
             " as part ", part, " of ", parts, lf::hint("internal: only grouped (expert) weights come in parts"));
    const int64_t width = kColumns * (w.dim() == 3 ? w.size(0) : 1);
    entries_.push_back({name, n, width, parts, part});
    n += width;
    opts = opts.device(w.device());
  }
  loaded_.assign(entries_.size(), false);
  history_ = at::zeros({recipe.amax_history_len, n}, opts);
  scale_ = at::ones({n}, opts);
  // Inputs and weights in the forward dtype, output gradients in the gradient dtype.
  const float fwd = static_cast<float>(fp8_max(recipe.forward_dtype())), bwd = static_cast<float>(fp8_max(recipe.grad_dtype()));
  fp8_max_ = at::tensor(std::vector<float>{fwd, fwd, bwd}).repeat({n / kColumns}).to(opts.device());
}

void Fp8AmaxTable::update() {
  if (history_.size(1) == 0) return;
  at::NoGradGuard no_grad;
  at::Tensor current = history_.select(0, 0);  // contiguous: row 0 of a row-major table
  for (auto* g : groups_)
    if (g != nullptr && g->size() > 1) g->all_reduce(current, lf::backend::ReduceOp::max);
  const at::Tensor amax = recipe_.amax_compute_algo == Fp8AmaxAlgo::max ? history_.amax(0) : current.clone();
  // As quantize(): 2^-margin fp8_max / amax, in fp32. An amax of 0 (nothing recorded) or inf/NaN
  // keeps the scale.
  const at::Tensor fresh = (fp8_max_ * std::ldexp(1.0, -recipe_.margin)) / amax;
  scale_.copy_(at::where((amax > 0).logical_and(at::isfinite(amax)), fresh, scale_));
  if (history_.size(0) > 1) history_.copy_(history_.roll({-1}, {0}));
  history_.select(0, 0).zero_();
}

std::vector<const Fp8AmaxTable::Entry*> Fp8AmaxTable::used() const {
  std::vector<const Entry*> out;
  if (history_.size(1) == 0) return out;
  const at::Tensor flag = (history_ != 0).any(0).logical_or(scale_ != 1).to(at::kCPU).contiguous();
  const bool* f = flag.data_ptr<bool>();
  for (const auto& e : entries_)
    for (int64_t c = e.offset; c < e.offset + e.width; ++c)
      if (f[c]) {
        out.push_back(&e);
        break;
      }
  return out;
}

std::pair<at::Tensor, at::Tensor> Fp8AmaxTable::state(const Entry& e) const {
  // Copies (a checkpoint may write them in the background while training goes on).
  return {history_.narrow(1, e.offset, e.width).to(at::kCPU).clone(), scale_.narrow(0, e.offset, e.width).to(at::kCPU).clone()};
}

void Fp8AmaxTable::set_state(const Entry& e, const at::Tensor& history, const at::Tensor& scale,
                             const std::string& source) {
  const int64_t len = history_.size(0), whole = e.width * e.parts;
  LF_CHECK(history.dim() == 2 && history.size(0) == len && history.size(1) == whole, source,
           ": the FP8 amax history of ", e.name, " is ", history.sizes(), ", this run's is [", len, ", ", whole, "]",
           lf::hint(history.dim() == 2 && history.size(0) != len
                        ? "resume with --fp8-amax-history-len " + std::to_string(history.size(0))
                        : std::string("the checkpoint is of another model; check --load")));
  LF_CHECK(scale.dim() == 1 && scale.size(0) == whole, source, ": the FP8 scales of ", e.name, " are ", scale.sizes(),
           ", this run's are [", whole, "]", lf::hint("the checkpoint is of another model; check --load"));
  const auto it = std::find_if(entries_.begin(), entries_.end(),
                               [&](const Entry& k) { return k.offset == e.offset && k.name == e.name; });
  LF_CHECK(it != entries_.end(), "fp8 delayed scaling: set_state of ", e.name, ", an entry of another table");
  at::NoGradGuard no_grad;
  const at::Tensor h = history.narrow(1, e.part * e.width, e.width), s = scale.narrow(0, e.part * e.width, e.width);
  history_.narrow(1, e.offset, e.width).copy_(h);
  scale_.narrow(0, e.offset, e.width).copy_(s);
  // State, not an entry stored untouched (a part of an expert weight's is stored whether used or
  // not): an amax recorded or a scale moved.
  if ((h != 0).any().item<bool>() || (s != 1).any().item<bool>()) loaded_[static_cast<size_t>(it - entries_.begin())] = true;
}

void Fp8AmaxTable::expect_state_from(const std::string& source) { expected_source_ = source; }

std::vector<std::string> Fp8AmaxTable::take_recorded_without_state() {
  std::vector<std::string> out;
  if (expected_source_.empty()) return out;
  expected_source_.clear();
  if (history_.size(1) == 0) return out;
  const at::Tensor recorded = (history_.select(0, 0) > 0).to(at::kCPU).contiguous();
  const bool* f = recorded.data_ptr<bool>();
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (loaded_[i]) continue;
    const auto& e = entries_[i];
    for (int64_t c = e.offset; c < e.offset + e.width; ++c)
      if (f[c]) {
        out.push_back(e.name);
        break;
      }
  }
  return out;
}

Fp8DelayedScaling::Fp8DelayedScaling(const Fp8Recipe& recipe) : recipe_(recipe) {
  LF_CHECK(recipe.scaling == Fp8Scaling::delayed, "Fp8DelayedScaling for the ", to_string(recipe.scaling), " recipe");
  recipe_.delayed = nullptr;
}

Fp8AmaxTable& Fp8DelayedScaling::add_group(const std::vector<Fp8Weight>& weights,
                                           std::vector<lf::backend::Communicator*> groups) {
  reindex();
  std::vector<Fp8Weight> fresh;
  for (const auto& w : weights)
    if ((w.tensor.dim() == 2 || w.tensor.dim() == 3) && w.tensor.numel() > 0 && !by_data_.count(w.tensor.data_ptr())) {
      by_data_.emplace(w.tensor.data_ptr(), weights_.size());  // a second handle of it in this call: skipped
      fresh.push_back(w);
    }
  tables_.push_back(std::make_unique<Fp8AmaxTable>(recipe_, fresh, std::move(groups)));
  Fp8AmaxTable* t = tables_.back().get();
  for (size_t i = 0; i < fresh.size(); ++i) weights_.push_back({fresh[i].tensor, t, t->entries_[i].offset});
  reindex();
  return *t;
}

void Fp8DelayedScaling::reindex() const {
  by_data_.clear();
  for (size_t i = 0; i < weights_.size(); ++i) by_data_.emplace(weights_[i].tensor.data_ptr(), i);
}

at::Tensor Fp8DelayedScaling::Site::scale(int64_t column) const { return table->scale_.narrow(0, offset + column, 1); }

void Fp8DelayedScaling::Site::record(int64_t column, const at::Tensor& x) const {
  at::NoGradGuard no_grad;
  at::Tensor slot = table->history_.select(0, 0).narrow(0, offset + column, 1);
  const at::Tensor amax = x.numel() == 0 ? at::zeros({1}, slot.options()) : x.abs().amax().to(at::kFloat).reshape({1});
  slot.copy_(at::maximum(slot, amax.to(slot.device())));
}

Fp8DelayedScaling::Site Fp8DelayedScaling::site(const at::Tensor& w) const {
  // The entry of the weight at w's storage, if that weight is still there with w's shape.
  auto find = [&]() -> const Weight* {
    const auto it = by_data_.find(w.data_ptr());
    if (it == by_data_.end()) return nullptr;
    const Weight& k = weights_[it->second];
    return k.tensor.data_ptr() == w.data_ptr() && k.tensor.sizes() == w.sizes() ? &k : nullptr;
  };
  const Weight* k = find();
  if (k == nullptr) {  // moved since the last lookup (e.g. into the optimizer's flat storage)?
    reindex();
    k = find();
  }
  LF_CHECK(k != nullptr, "fp8 delayed scaling: a GEMM's weight ", w.sizes(),
           " is not a parameter the run keeps scales for",
           lf::hint("this layer cannot use --fp8-recipe delayed; use tensorwise or blockwise"));
  return {k->table, k->offset};
}

void Fp8DelayedScaling::update() {
  std::vector<std::string> fresh;
  std::string source;
  for (auto& t : tables_) {
    if (!t->expected_source_.empty()) source = t->expected_source_;
    for (auto& name : t->take_recorded_without_state()) fresh.push_back(std::move(name));
  }
  if (!fresh.empty()) {
    std::string names;
    for (size_t i = 0; i < fresh.size() && i < 6; ++i) names += (i ? ", " : "") + fresh[i];
    if (fresh.size() > 6) names += ", and " + std::to_string(fresh.size() - 6) + " more";
    LF_WARN(source, " holds no delayed FP8 scaling state for ", fresh.size(), " weight(s) whose GEMMs ran in FP8 this step (",
            names, "): new to FP8 since it was saved (e.g. --first-last-layers-bf16 changed), their scales start at 1 "
            "as in a new run");
  }
  for (auto& t : tables_) t->update();
}

}  // namespace lf::ops

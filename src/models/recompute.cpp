// Activation checkpointing as a custom autograd Function (models/recompute.h).
#include "loongforge/models/recompute.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "loongforge/core/error.h"
#include "loongforge/core/stream_pair.h"
#include "loongforge/parallel/tensor/random.h"

namespace lf::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved inputs; travels as an IValue capsule so that its
// lifetime is the autograd node's.
struct Replay : torch::CustomClassHolder {
  RecomputeFn fn;
  std::vector<at::Tensor> inputs;  // detached views: no reference to the graph they came from
  std::vector<bool> needs_grad;
  lf::parallel::RngTracker* rng = nullptr;
  std::map<std::string, at::Tensor> rng_state;
  lf::StreamPair* streams = nullptr;
};

struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  static at::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<Replay> replay,
                            at::TensorList inputs) {
    // Grad mode is off here: fn builds no graph, so its activations are freed on return.
    if (replay->rng) replay->rng_state = replay->rng->state();
    at::Tensor out = replay->fn(inputs.vec());
    for (const auto& t : inputs) {
      replay->needs_grad.push_back(t.requires_grad() && at::isFloatingType(t.scalar_type()));
      replay->inputs.push_back(t.detach());
    }
    ctx->saved_data["replay"] = c10::IValue::make_capsule(replay);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto replay = c10::static_intrusive_pointer_cast<Replay>(ctx->saved_data["replay"].toCapsule());
    const auto& saved = replay->inputs;
    // Fresh leaves that share storage with the inputs: the recomputed graph ends at them, and
    // their gradients are returned to the engine, which routes them to the real inputs.
    std::vector<at::Tensor> leaves;
    std::vector<at::Tensor> wrt;
    std::vector<size_t> wrt_index;
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor leaf = saved[i].detach();
      if (replay->needs_grad[i]) {
        leaf.set_requires_grad(true);
        wrt.push_back(leaf);
        wrt_index.push_back(i);
      }
      leaves.push_back(leaf);
    }
    // The generator is the replay's until it is set back: no hand-over to the other stream before.
    std::optional<lf::StreamPair::Hold> hold;
    if (replay->rng) hold.emplace(replay->streams);
    std::map<std::string, at::Tensor> now;
    if (replay->rng) {
      now = replay->rng->state();
      replay->rng->set_state(replay->rng_state);
    }
    at::Tensor out;
    {
      at::AutoGradMode enable(true);
      out = replay->fn(leaves);
    }
    if (replay->rng) replay->rng->set_state(now);
    hold.reset();
    variable_list grads(saved.size() + 1);  // [0]: the Replay argument
    if (out.requires_grad()) {
      // Reentrant backward over the recomputed graph: parameters fn reads directly (leaves of
      // the model) accumulate their gradients here, exactly as without recomputation; the fresh
      // input leaves collect theirs in .grad and are handed back to the engine.
      torch::autograd::backward({out}, {grad_out[0]});
      for (size_t j = 0; j < wrt.size(); ++j) grads[wrt_index[j] + 1] = wrt[j].grad();
    }
    replay->inputs.clear();  // backward runs once (retain_graph is not supported here)
    return grads;
  }
};

}  // namespace

at::Tensor recompute(RecomputeFn fn, const std::vector<at::Tensor>& inputs,
                     lf::parallel::RngTracker* rng, lf::StreamPair* streams) {
  bool any = false;
  for (const auto& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!at::GradMode::is_enabled() || !any) return fn(inputs);
  for (size_t i = 0; i < inputs.size(); ++i)
    LF_CHECK(inputs[i].defined(), "recompute: input ", i, " is undefined",
             lf::hint("pass only the tensors the recomputed function reads"));
  auto replay = c10::make_intrusive<Replay>();
  replay->fn = std::move(fn);
  replay->rng = rng;
  replay->streams = streams;
  return RecomputeFunction::apply(replay, at::TensorList(inputs));
}

BlockGroup recompute_group(const RecomputeOptions& r, int64_t i, int64_t n) {
  if (r.granularity != RecomputeOptions::Granularity::full) return {};
  if (r.method == RecomputeOptions::Method::uniform) return {std::min(std::max<int64_t>(r.num_layers, 1), n - i), true};
  return {1, i < r.num_layers};
}

at::Tensor run_blocks(int64_t n, at::Tensor x, const RecomputeOptions& r, const BlockFn& block,
                      const std::vector<int64_t>& exposed, const std::function<void(int64_t, const at::Tensor&)>& after) {
  for (int64_t i = 0; i < n;) {
    const BlockGroup g = recompute_group(r, i, n);
    int64_t group = g.size;
    const bool again = g.recomputed;
    for (int64_t j = i; j < i + group - 1; ++j)
      if (std::find(exposed.begin(), exposed.end(), j) != exposed.end()) {
        group = j - i + 1;
        break;
      }
    if (!again) {
      x = block(i, x);
    } else {
      const int64_t first = i;
      x = recompute(
          [block, first, group](const std::vector<at::Tensor>& v) {
            at::Tensor y = v[0];
            for (int64_t j = first; j < first + group; ++j) y = block(j, y);
            return y;
          },
          {x});
    }
    i += group;
    if (after) after(i - 1, x);
  }
  return x;
}

}  // namespace lf::models

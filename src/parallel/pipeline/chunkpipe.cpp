#include "loongforge/parallel/pipeline/chunkpipe.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <vector>

#include "loongforge/core/error.h"

namespace lf::parallel::pipeline {
namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The earlier chunks' keys (or values) as the recomputation's input: `value` (a view of the
// store) passed through, its gradient added into `acc` (the store's gradient slots) the moment
// backward produces it, so no full-prefix gradient tensor outlives its layer. `anchor` only makes
// the output require grad.
struct GradSink : torch::autograd::Function<GradSink> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& anchor,
                            const at::Tensor& value, const at::Tensor& acc) {
    ctx->saved_data["acc"] = acc;
    return value.alias();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    if (grad[0].defined()) ctx->saved_data["acc"].toTensor().add_(grad[0]);
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// One sequence's keys and values on this stage, per layer: [b, nkv, chunks * c, d] buffers
// filled chunk by chunk in the first pass, and their gradients, filled from the last chunk back
// (the last chunk's keys/values are seen by no later chunk: no slot).
struct KvStore {
  std::vector<at::Tensor> k, v, dk, dv;
  int64_t chunk_len = 0;

  void append(int64_t chunk, int64_t chunks, const ChunkAttention& kv, const char* where) {
    LF_CHECK(kv.k.size() == kv.v.size() && (chunk == 0 || kv.k.size() == k.size()), where,
             ": the forward step of chunk ", chunk, " left ", kv.k.size(), " keys and ", kv.v.size(),
             " values, chunk 0 ", k.size(), " (one of each per layer of the stage)");
    if (kv.k.empty()) return;  // a stage without layers (e.g. the embedding alone)
    if (chunk == 0) {
      chunk_len = kv.k[0].size(2);
      for (const auto* src : {&kv.k, &kv.v}) {
        auto& dst = src == &kv.k ? k : v;
        auto& grad = src == &kv.k ? dk : dv;
        dst.clear();
        grad.clear();
        for (const auto& t : *src) {
          auto shape = t.sizes().vec();
          shape[2] = chunks * chunk_len;
          dst.push_back(at::empty(shape, t.options()));
          // Gradients accumulate over up to `chunks` contributions: fp32 even for a bf16 model.
          shape[2] = (chunks - 1) * chunk_len;
          grad.push_back(at::zeros(shape, t.options().dtype(at::kFloat)));
        }
      }
    }
    for (size_t l = 0; l < k.size(); ++l) {
      LF_CHECK(kv.k[l].size(2) == chunk_len, where, ": chunk ", chunk, " has ", kv.k[l].size(2),
               " tokens, chunk 0 had ", chunk_len, " (ChunkPipe needs equal chunks)");
      k[l].narrow(2, chunk * chunk_len, chunk_len).copy_(kv.k[l]);
      v[l].narrow(2, chunk * chunk_len, chunk_len).copy_(kv.v[l]);
    }
  }
};

}  // namespace

double run_chunkpipe(StageExchange* ex, int64_t chunks, const ChunkPipeStep& step, ScheduleTrace* trace) {
  LF_CHECK(chunks >= 1, "ChunkPipe: at least one chunk is needed, got ", chunks);
  LF_CHECK(static_cast<bool>(step.forward), "ChunkPipe: ChunkPipeStep::forward is not set");
  const bool first = !ex || ex->is_first(), last = !ex || ex->is_last();
  const std::string where = "ChunkPipe stage " + std::to_string(ex ? ex->stage() : 0);
  auto record = [&](char kind, int64_t k, double start) {
    if (trace) trace->events.push_back({kind, k, start, now_us() - start, 0});
  };
  double step_start = 0;
  if (trace) {
    if (ex) ex->barrier();
    step_start = now_us();
  }

  // Pass 1, every chunk forward without autograd: keys/values and the stage's inputs are kept.
  KvStore store;
  std::vector<TensorMap> inputs(static_cast<size_t>(chunks));
  for (int64_t k = 0; k < chunks; ++k) {
    TensorMap input = first ? TensorMap() : ex->recv_forward_map();
    inputs[static_cast<size_t>(k)] = input;
    ChunkAttention kv;
    for (size_t l = 0; l < store.k.size(); ++l) {
      kv.prefix_k.push_back(store.k[l].narrow(2, 0, k * store.chunk_len));
      kv.prefix_v.push_back(store.v[l].narrow(2, 0, k * store.chunk_len));
    }
    StageResult out;
    {
      at::NoGradGuard no_grad;
      const double start = trace ? now_us() : 0;
      out = step.forward(k, input, kv, false);
      record('F', k, start);
    }
    store.append(k, chunks, kv, where.c_str());
    if (!last) {
      LF_CHECK(!out.activations.empty(), where, ": the forward step of chunk ", k, " returned nothing");
      // The first pass runs without autograd: the receiver learns from the manifest that these
      // carry gradients in the recomputation.
      TensorMap send;
      for (const auto& [name, t] : out.activations.items())
        send.set(name, t.is_floating_point() ? t.detach().set_requires_grad(true) : t);
      ex->send_forward(send);
    }
  }

  // Pass 2, last chunk first: recompute with autograd, backpropagate the output's gradient plus
  // the gradients later chunks left on this chunk's keys/values; the prefix's gradients go to the
  // earlier chunks' slots.
  double loss_sum = 0;
  const at::Tensor anchor =
      at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(store.k.empty() ? c10::Device(c10::kCPU) : store.k[0].device()))
          .set_requires_grad(true);
  for (int64_t k = chunks - 1; k >= 0; --k) {
    TensorMap output_grads = last ? TensorMap() : ex->recv_backward_map();
    const double start = trace ? now_us() : 0;
    TensorMap input;
    for (const auto& [name, t] : inputs[static_cast<size_t>(k)].items())
      input.set(name, t.is_floating_point() ? t.detach().set_requires_grad(true) : t);
    const int64_t past = k * store.chunk_len;
    ChunkAttention kv;
    for (size_t l = 0; l < store.k.size() && k > 0; ++l) {
      kv.prefix_k.push_back(GradSink::apply(anchor, store.k[l].narrow(2, 0, past), store.dk[l].narrow(2, 0, past)));
      kv.prefix_v.push_back(GradSink::apply(anchor, store.v[l].narrow(2, 0, past), store.dv[l].narrow(2, 0, past)));
    }
    if (step.before_backward) step.before_backward(k);
    StageResult out = step.forward(k, input, kv, true);
    LF_CHECK(kv.k.size() == store.k.size(), where, ": the recomputation of chunk ", k,
             " returned other keys/values than the first pass");
    std::vector<at::Tensor> roots, grads;
    if (last) {
      LF_CHECK(out.loss.defined() && out.loss.numel() == 1, where,
               ": the last stage's step must return the scalar loss");
      loss_sum += out.loss.detach().to(at::kDouble).item<double>();
      roots.push_back(out.loss);
      grads.push_back(at::ones_like(out.loss));
    } else {
      for (const auto& [name, t] : out.activations.items()) {
        if (!t.requires_grad()) continue;
        const at::Tensor* g = output_grads.find(name);
        LF_CHECK(g && g->sizes() == t.sizes(), where, ": the gradient received for chunk ", k, " '", name,
                 "' has shape ", g ? g->sizes() : c10::IntArrayRef{}, ", its activation ", t.sizes());
        roots.push_back(t);
        grads.push_back(g->to(t.scalar_type()));
      }
    }
    if (k < chunks - 1) {  // the last chunk's keys/values are seen by no later chunk
      for (size_t l = 0; l < store.k.size(); ++l) {
        roots.push_back(kv.k[l]);
        grads.push_back(store.dk[l].narrow(2, past, store.chunk_len).to(kv.k[l].scalar_type()));
        roots.push_back(kv.v[l]);
        grads.push_back(store.dv[l].narrow(2, past, store.chunk_len).to(kv.v[l].scalar_type()));
      }
    }
    torch::autograd::backward(roots, grads);
    record('B', k, start);
    inputs[static_cast<size_t>(k)] = TensorMap();
    if (!first) {
      TensorMap input_grads;
      for (const auto& [name, t] : input.items()) {
        if (!t.requires_grad()) continue;
        at::Tensor g = t.grad();
        input_grads.set(name, g.defined() ? g : at::zeros_like(t));
      }
      ex->send_backward(input_grads);
    }
  }
  if (ex) ex->flush();
  if (trace) {
    if (ex) ex->barrier();
    trace->steps.emplace_back(step_start, now_us());
  }
  return loss_sum;
}

double chunkpipe_train(StageExchange* ex, const lf::data::Batch& micro, int64_t s, int64_t c,
                       const ChunkedStage& stage, ScheduleTrace* trace) {
  LF_CHECK(c >= 1 && s % c == 0, "ChunkPipe: a sequence of ", s, " tokens does not split into chunks of ", c);
  const int64_t chunks = s / c;
  const bool rng = stage.rng_state && stage.set_rng_state;
  // Dropout streams before each chunk of the first pass (replayed), and after the last one
  // (where the next micro-batch continues).
  std::vector<std::map<std::string, at::Tensor>> rng_states(static_cast<size_t>(chunks) + 1);
  ChunkPipeStep step;
  step.forward = [&](int64_t k, const TensorMap& input, ChunkAttention& kv, bool with_grad) {
    if (rng) {
      if (with_grad)
        stage.set_rng_state(rng_states[static_cast<size_t>(k)]);
      else
        rng_states[static_cast<size_t>(k)] = stage.rng_state();
    }
    const lf::data::Batch chunk = micro.slice_sequence(k * c, c);
    StageResult out = stage.forward(chunk, input, k * c, kv, /*with_head=*/with_grad);
    if (rng && !with_grad && k == chunks - 1) rng_states.back() = stage.rng_state();
    return out;
  };
  step.before_backward = stage.before_backward;
  const double loss = run_chunkpipe(ex, chunks, step, trace);
  if (rng) stage.set_rng_state(rng_states.back());
  return loss;
}

void chunkpipe_evaluate(StageExchange* ex, const lf::data::Batch& micro, int64_t s, int64_t c,
                        const ChunkedStage& stage) {
  LF_CHECK(c >= 1 && s % c == 0, "ChunkPipe: a sequence of ", s, " tokens does not split into chunks of ", c);
  const bool first = !ex || ex->is_first(), last = !ex || ex->is_last();
  std::vector<at::Tensor> keys, values;  // per layer: the keys/values of the chunks so far
  for (int64_t k = 0; k < s / c; ++k) {
    TensorMap input = first ? TensorMap() : ex->recv_forward_map();
    ChunkAttention kv;
    kv.prefix_k = keys;
    kv.prefix_v = values;
    StageResult out = stage.forward(micro.slice_sequence(k * c, c), input, k * c, kv, /*with_head=*/true);
    keys.resize(kv.k.size());
    values.resize(kv.v.size());
    for (size_t l = 0; l < kv.k.size(); ++l) {
      keys[l] = keys[l].defined() ? at::cat({keys[l], kv.k[l]}, 2) : kv.k[l];
      values[l] = values[l].defined() ? at::cat({values[l], kv.v[l]}, 2) : kv.v[l];
    }
    if (!last) ex->send_forward(out.activations);
  }
  if (ex) ex->flush();
}

}  // namespace lf::parallel::pipeline

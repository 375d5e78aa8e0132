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
  std::vector<at::Tensor> inputs(static_cast<size_t>(chunks));
  for (int64_t k = 0; k < chunks; ++k) {
    at::Tensor input = first ? at::Tensor() : ex->recv_forward();
    inputs[static_cast<size_t>(k)] = input;
    ChunkAttention kv;
    for (size_t l = 0; l < store.k.size(); ++l) {
      kv.prefix_k.push_back(store.k[l].narrow(2, 0, k * store.chunk_len));
      kv.prefix_v.push_back(store.v[l].narrow(2, 0, k * store.chunk_len));
    }
    at::Tensor out;
    {
      at::NoGradGuard no_grad;
      const double start = trace ? now_us() : 0;
      out = step.forward(k, input, kv, false);
      record('F', k, start);
    }
    store.append(k, chunks, kv, where.c_str());
    if (!last) {
      LF_CHECK(out.defined(), where, ": the forward step of chunk ", k, " returned nothing");
      ex->send_forward(out);
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
    at::Tensor output_grad = last ? at::Tensor() : ex->recv_backward();
    const double start = trace ? now_us() : 0;
    at::Tensor input = inputs[static_cast<size_t>(k)];
    if (input.defined()) input = input.detach().set_requires_grad(true);
    const int64_t past = k * store.chunk_len;
    ChunkAttention kv;
    for (size_t l = 0; l < store.k.size() && k > 0; ++l) {
      kv.prefix_k.push_back(GradSink::apply(anchor, store.k[l].narrow(2, 0, past), store.dk[l].narrow(2, 0, past)));
      kv.prefix_v.push_back(GradSink::apply(anchor, store.v[l].narrow(2, 0, past), store.dv[l].narrow(2, 0, past)));
    }
    if (step.before_backward) step.before_backward(k);
    at::Tensor out = step.forward(k, input, kv, true);
    LF_CHECK(out.defined() && kv.k.size() == store.k.size(), where, ": the recomputation of chunk ", k,
             " returned nothing or other keys/values than the first pass");
    std::vector<at::Tensor> roots{out}, grads{last ? at::ones_like(out) : output_grad.to(out.scalar_type())};
    if (last) {
      LF_CHECK(out.numel() == 1, where, ": the last stage's step must return the scalar loss, got shape ", out.sizes());
      loss_sum += out.detach().to(at::kDouble).item<double>();
    } else {
      LF_CHECK(output_grad.sizes() == out.sizes(), where, ": the gradient received for chunk ", k, " has shape ",
               output_grad.sizes(), ", its activation ", out.sizes());
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
    inputs[static_cast<size_t>(k)] = at::Tensor();
    if (!first) {
      at::Tensor g = input.grad();
      ex->send_backward(g.defined() ? g : at::zeros_like(input));
    }
  }
  if (ex) ex->flush();
  if (trace) {
    if (ex) ex->barrier();
    trace->steps.emplace_back(step_start, now_us());
  }
  return loss_sum;
}

}  // namespace lf::parallel::pipeline

// One training step's forward/backward under each schedule (no pipelining, 1F1B, interleaved,
// ChunkPipe), the global-batch normalisation of the loss terms, and evaluation of one batch.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/parallel/pipeline/chunkpipe.h"
#include "trainer_impl.h"

namespace lf::train {

using lf::data::TensorMap;

std::vector<GradBuffer*> Trainer::Impl::grad_list() const {
  std::vector<GradBuffer*> out;
  for (const auto& b : buffers) out.push_back(b.grads.get());
  return out;
}

void Trainer::Impl::begin_micro_batch(bool last) {
  for (auto& b : buffers) b.grads->begin_micro_batch(last);
}

std::vector<lf::data::Batch> Trainer::Impl::read_step() {
  std::vector<lf::data::Batch> out;
  for (int64_t m = 0; m < micro_batches; ++m) out.push_back(train_data->next().to(backend.device()));
  return out;
}

std::map<std::string, double> Trainer::Impl::loss_weights(const std::vector<lf::data::Batch>& batches) const {
  std::map<std::string, double> counts;
  for (const auto& b : batches)
    for (const auto& [name, n] : model.loss_counts(b)) counts[name] += n;
  if (dp() && !counts.empty()) {
    std::vector<double> v;
    for (const auto& [name, n] : counts) v.push_back(n);
    auto t = at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(backend.device());
    dp()->all_reduce(t, lf::backend::ReduceOp::sum);
    t = t.cpu();
    size_t i = 0;
    for (auto& [name, n] : counts) n = t[static_cast<int64_t>(i++)].item<double>();
  }
  std::map<std::string, double> w;
  for (const auto& [name, n] : counts) w[name] = n > 0 ? scaler.scale() / n : 0.0;  // nothing counted: no loss
  return w;
}

at::Tensor Trainer::Impl::objective(const std::vector<lf::models::LossTerm>& terms,
                                    const std::map<std::string, double>& weights,
                                    TermSums& sums) const {
  at::Tensor total;
  for (const auto& t : terms) {
    auto it = weights.find(t.name);
    LF_CHECK(it != weights.end(), "the model returned loss term '", t.name, "', which its loss_counts() does not count");
    at::Tensor& sum = sums[t.name];
    const at::Tensor value = t.sum.detach().to(at::kDouble).reshape({});
    sum = sum.defined() ? sum + value : value;
    at::Tensor scaled = t.sum * it->second;
    total = total.defined() ? total + scaled : scaled;
  }
  LF_CHECK(total.defined(), "the model's last stage returned no loss term in training");
  return total;
}

std::optional<lf::backend::GradInto> BufferGradientSink::take(const at::Tensor& param,
                                                               const std::string& loss_term) const {
  if (!weights_) return std::nullopt;
  auto w = weights_->find(loss_term);
  if (w == weights_->end()) return std::nullopt;
  for (const auto& gb : buffers_) {
    auto d = gb.grads->direct_slot(param);
    if (d.index < 0) continue;
    return lf::backend::GradInto{d.slot, w->second, d.accumulate};
  }
  return std::nullopt;
}

std::optional<lf::backend::GradInto> BufferGradientSink::weight_grad_slot(const at::Tensor& param) const {
  if (!weights_) return std::nullopt;  // outside a training step's forward/backward
  for (const auto& gb : buffers_) {
    auto d = gb.grads->direct_slot(param);
    if (d.index < 0) continue;
    return lf::backend::GradInto{d.slot, 1.0, d.accumulate};
  }
  return std::nullopt;
}

double Trainer::Impl::forward_backward() {
  const auto batches = read_step();
  const auto weights = loss_weights(batches);
  compute_start = std::chrono::steady_clock::now();
  // The step's loss weights scale what the gradient sink's users write; none outside the step.
  struct SinkWeights {
    BufferGradientSink* sink;
    SinkWeights(BufferGradientSink* s, const std::map<std::string, double>* w) : sink(s) {
      if (sink) sink->set_weights(w);
    }
    ~SinkWeights() {
      if (sink) sink->set_weights(nullptr);
    }
  } sink_weights(sink.get(), &weights);
  struct ModelWeights {
    lf::models::Model& model;
    ModelWeights(lf::models::Model& m, const std::map<std::string, double>* w) : model(m) { model.set_loss_weights(w); }
    ~ModelWeights() { model.set_loss_weights(nullptr); }
  } model_weights(model, &weights);
  TermSums sums;
  for (const auto& [name, w] : weights) sums[name] = at::Tensor();  // undefined: no micro-batch counted it yet
  model.begin_step(batches);
  if (job.parallel.chunkpipe_chunk_size) return forward_backward_chunkpipe(batches, weights, sums);
  if (exchange) return forward_backward_pipelined(batches, weights, sums);
  if (pair_micro_batches) {
    forward_backward_paired(batches, weights, sums);
    return finish_step(sums, weights);
  }
  for (int64_t m = 0; m < micro_batches; ++m) {
    auto out = model.forward_step(batches[static_cast<size_t>(m)], lf::models::Pass::train);
    at::Tensor loss = objective(out.losses, weights, sums);
    begin_micro_batch(m == micro_batches - 1);
    loss.backward();
  }
  return finish_step(sums, weights);
}

void Trainer::Impl::run_pair(const std::function<void()>& forward, const std::function<void()>& backward) {
  // The backward stream's thread starts with this thread's ATen state (grad mode), device and
  // intra-op thread count.
  const at::ThreadLocalState state;
  streams.run(forward, [&] {
    const at::ThreadLocalStateGuard guard(state);
    const c10::DeviceGuard device(backend.device());  // a GPU rank's own device
    at::init_num_threads();
    backward();
  });
  ++pairs_run;
}

void Trainer::Impl::log_pairing() {
  if (pairing_logged || !pair_micro_batches) return;
  pairing_logged = true;
  LF_INFO("MoE overlap across micro-batches: the forward of one micro-batch ran with the backward of another (",
          pairs_run, " pairs, ", streams.total_switches(), " hand-overs at all-to-all waits in the first step)");
}

void Trainer::Impl::forward_backward_paired(const std::vector<lf::data::Batch>& batches,
                                            const std::map<std::string, double>& weights,
                                            TermSums& sums) {
  auto forward = [&](int64_t m) {
    auto out = model.forward_step(batches[static_cast<size_t>(m)], lf::models::Pass::train);
    return objective(out.losses, weights, sums);
  };
  auto backward = [&](int64_t m, at::Tensor& loss) {
    begin_micro_batch(m == micro_batches - 1);
    loss.backward();
    loss = at::Tensor();  // the graph's last reference
  };
  at::Tensor done = forward(0);
  for (int64_t m = 1; m < micro_batches; ++m) {
    at::Tensor next;
    run_pair([&] { next = forward(m); }, [&] { backward(m - 1, done); });
    done = std::move(next);
  }
  backward(micro_batches - 1, done);
  log_pairing();
}

// pp > 1: this stage's part of the step under 1F1B, or interleaved 1F1B over its model chunks.
double Trainer::Impl::forward_backward_pipelined(const std::vector<lf::data::Batch>& batches,
                                                 const std::map<std::string, double>& weights,
                                                 TermSums& sums) {
  namespace pl = lf::parallel::pipeline;
  const int chunks = static_cast<int>(model.num_model_chunks());
  auto run = [&](int chunk, int64_t m, const TensorMap& input) {
    auto out = model.stage_forward(batches[static_cast<size_t>(m)], input, chunk, lf::models::Pass::train);
    pl::StageResult r;
    const bool heads = model.last_stage() && chunk == chunks - 1;
    if (heads)
      r.loss = objective(out.losses, weights, sums);
    else
      r.activations = std::move(out.activations);
    return r;
  };
  if (chunks > 1) {
    pl::VirtualStageStep step;
    step.forward = run;
    step.before_backward = [&](int, int64_t, bool final) { begin_micro_batch(final); };
    if (pair_micro_batches) step.run_pair = [this](const auto& f, const auto& b) { run_pair(f, b); };
    pl::run_interleaved_1f1b(*exchange, chunks, micro_batches, step, trace.get());
    log_pairing();
  } else {
    pl::StageStep step;
    step.forward = [&](int64_t m, const TensorMap& input) { return run(0, m, input); };
    step.before_backward = [&](int64_t m) { begin_micro_batch(m == micro_batches - 1); };
    if (pair_micro_batches) step.run_pair = [this](const auto& f, const auto& b) { run_pair(f, b); };
    pl::run_1f1b(*exchange, micro_batches, step, trace.get());
    log_pairing();
  }
  return finish_step(sums, weights);
}

// ChunkPipe (--chunkpipe-chunk-size c): each micro-batch's sequence runs as s / c chunks through
// the stages (pipeline/chunkpipe.h), every chunk's loss weighted as in the unchunked step.
double Trainer::Impl::forward_backward_chunkpipe(const std::vector<lf::data::Batch>& batches,
                                                 const std::map<std::string, double>& weights,
                                                 TermSums& sums) {
  namespace pl = lf::parallel::pipeline;
  LF_CHECK(model.supports_chunkpipe(), "model type ", model.type(), " does not run under ChunkPipe",
           lf::hint("drop --chunkpipe-chunk-size"));
  const int64_t s = job.training.seq_length, c = *job.parallel.chunkpipe_chunk_size;
  for (int64_t m = 0; m < micro_batches; ++m) {
    pl::ChunkedStage stage;
    stage.forward = [&](const lf::data::Batch& chunk, const TensorMap& input, int64_t start,
                        lf::models::ChunkAttention& kv, bool with_head) {
      auto out = model.chunk_forward(chunk, input, start, kv, with_head, lf::models::Pass::train);
      pl::StageResult r;
      if (model.last_stage() && with_head)
        r.loss = objective(out.losses, weights, sums);
      else
        r.activations = std::move(out.activations);
      return r;
    };
    stage.rng_state = [&] { return model.rng_state(); };
    stage.set_rng_state = [&](const std::map<std::string, at::Tensor>& st) { model.set_rng_state(st); };
    stage.before_backward = [&](int64_t k) { begin_micro_batch(m == micro_batches - 1 && k == 0); };
    pl::chunkpipe_train(exchange.get(), batches[static_cast<size_t>(m)], s, c, stage, trace.get());
  }
  return finish_step(sums, weights);
}

double Trainer::Impl::finish_step(TermSums& sums, const std::map<std::string, double>& weights) {
  model.end_backward();  // the backward of what begin_step ran, before any gradient is reduced
  train_data->report_compute_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - compute_start).count());
  // Tied embeddings over pipeline stages: the first stage's embedding and the last stage's copy
  // get their gradients summed over the embedding group (Megatron's _allreduce_word_embedding_grads),
  // before the DP reduction (both are sums).
  if (ctx.pp_size() > 1 && ctx.in_embedding_group() && ctx.embedding().size() > 1)
    for (auto& b : buffers) {
      b.grads->zero_unreported();
      for (size_t i = 0; i < b.grads->parameters().size(); ++i)
        if (b.grads->parameters()[i].pipeline_tied) {
          at::Tensor g = b.grads->main_grad(static_cast<int>(i));
          ctx.embedding().all_reduce(g, lf::backend::ReduceOp::sum);
        }
    }
  for (auto& b : buffers) b.grads->finish_grad_sync();
  // Losses computed inside layers (MoE) come from every stage (host values); the others from the
  // last stage's objective (device tensors).
  std::map<std::string, double> host;
  for (const auto& [name, s] : model.internal_loss_sums()) {
    LF_CHECK(sums.count(name), "the model computed loss term '", name, "', which its loss_counts() does not count");
    host[name] += s;
  }
  // MoE: tokens per expert over the global batch (the expert-bias rule), and the load balance of
  // this stage's layers for the log.
  double load_ratio_sum = 0, moe_layers = 0;
  if (at::Tensor load = model.expert_load(); load.defined()) {
    if (dp()) {
      auto l = load.to(backend.device());
      dp()->all_reduce(l, lf::backend::ReduceOp::sum);
      load = l.cpu();
    }
    model.end_step(load);
    auto ratio = std::get<0>(load.max(1)) / load.mean(1).clamp_min(1e-12);
    load_ratio_sum = ratio.to(at::kDouble).sum().item<double>();
    moe_layers = static_cast<double>(load.size(0));
  } else {
    model.end_step({});
  }
  // The terms' sums: each stage's share summed over the pipeline (the last stage's terms are zero
  // elsewhere), then over DP (and CP); the load statistics ride along (summed over the pipeline only).
  std::vector<double> v;
  std::vector<at::Tensor> on_device;
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(backend.device());
  for (const auto& [name, s] : sums) {
    v.push_back(host.count(name) ? host.at(name) : 0.0);
    on_device.push_back(s.defined() ? s.reshape({1}) : at::zeros({1}, f64));
  }
  v.push_back(load_ratio_sum);
  v.push_back(moe_layers);
  on_device.push_back(at::zeros({2}, f64));
  auto t = at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(backend.device()) + at::cat(on_device);
  if (exchange) ctx.pp().all_reduce(t, lf::backend::ReduceOp::sum);
  const int64_t n = static_cast<int64_t>(sums.size());
  {
    auto stats = t.narrow(0, n, 2).cpu();
    last_expert_load = stats[1].item<double>() > 0 ? stats[0].item<double>() / stats[1].item<double>() : -1;
  }
  t = t.narrow(0, 0, n).contiguous();
  if (dp_cp()) dp_cp()->all_reduce(t, lf::backend::ReduceOp::sum);
  t = t.cpu();
  last_terms.clear();
  double total = 0;
  size_t i = 0;
  for (const auto& [name, s] : sums) {
    // weights = loss scale / units: the term's global-batch mean.
    const double w = weights.at(name) / scaler.scale();
    const double value = t[static_cast<int64_t>(i++)].item<double>() * w;
    last_terms.emplace_back(name, value);
    total += value;
  }
  return total;
}

void Trainer::Impl::evaluate_batch(const lf::data::Batch& batch, int64_t index, int64_t iters,
                                   lf::models::Metrics& out) {
  namespace pl = lf::parallel::pipeline;
  auto add = [&](const lf::models::Metrics& m) {
    for (const auto& [name, v] : m) {
      out[name].sum += v.sum;
      out[name].count += v.count;
    }
  };
  if (const auto c = job.parallel.chunkpipe_chunk_size) {
    pl::ChunkedStage stage;
    stage.forward = [&](const lf::data::Batch& chunk, const TensorMap& input, int64_t start,
                        lf::models::ChunkAttention& kv, bool with_head) {
      auto o = model.chunk_forward(chunk, input, start, kv, with_head, lf::models::Pass::eval);
      if (model.last_stage()) add(o.metrics);
      pl::StageResult r;
      r.activations = std::move(o.activations);
      return r;
    };
    pl::chunkpipe_evaluate(exchange.get(), batch, job.training.seq_length, *c, stage);
    return;
  }
  if (!exchange) {
    add(model.forward_step(batch, lf::models::Pass::eval).metrics);
    return;
  }
  // Model chunks in order (virtual stages travel the ring; one chunk: stage to stage).
  const int64_t chunks = model.num_model_chunks();
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t vs = c * ctx.pp_size() + ctx.pp_rank(), msg = vs * iters + index;
    TensorMap input;
    if (!(model.first_stage() && c == 0))
      input = chunks > 1 ? exchange->recv_forward_map(msg - iters, /*ring=*/true) : exchange->recv_forward_map();
    auto o = model.stage_forward(batch, input, c, lf::models::Pass::eval);
    if (model.last_stage() && c == chunks - 1) {
      add(o.metrics);
      break;
    }
    if (chunks > 1)
      exchange->send_forward(o.activations, msg, /*ring=*/true);
    else
      exchange->send_forward(o.activations);
  }
}

}  // namespace lf::train

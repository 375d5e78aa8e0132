#include "loongforge/train/trainer.h"

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>

#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/parallel/pipeline/chunkpipe.h"
#include "loongforge/parallel/pipeline/p2p.h"
#include "loongforge/parallel/pipeline/schedules.h"
#include "loongforge/train/grad_buffer.h"
#include "loongforge/train/lr_schedule.h"
#include "loongforge/train/optimizer.h"
#include "trainer_checkpointing.h"

namespace lf::train {

int64_t num_micro_batches(const lf::config::TrainingConfig& t, int dp_size) {
  const int64_t per_step = t.micro_batch_size * dp_size;
  const int64_t global = t.global_batch_size.value_or(per_step);
  LF_CHECK(global % per_step == 0, "global_batch_size ", global,
           " is not a multiple of micro_batch_size ", t.micro_batch_size, " x data-parallel size ",
           dp_size, " = ", per_step,
           lf::hint("choose --global-batch-size as a multiple of " + std::to_string(per_step)));
  return global / per_step;
}

namespace {

// Gradients are averaged over every rank that sees different data with the same parameters:
// dp, and dp x cp when context parallelism splits the sequence.
lf::backend::Communicator* grad_reduce_group(const lf::dist::ParallelContext& ctx) {
  if (ctx.dp_size() * ctx.cp_size() == 1) return nullptr;
  return ctx.cp_size() > 1 ? &ctx.dp_cp() : &ctx.dp();
}

// Tied embeddings split over pipeline stages: the first stage's embedding and the last stage's
// copy of it get their gradients summed over the embedding group.
bool has_tied_copy(const lf::models::Decoder& m) {
  for (const auto& p : m.parameters())
    if (p.tied_copy) return true;
  return m.stage().first && !m.stage().last && !m.config().untie_embeddings_and_output_weights;
}

GradBufferOptions grad_buffer_options(const lf::config::JobConfig& job, const lf::models::Decoder& m) {
  GradBufferOptions o;
  if (job.parallel.ddp_bucket_size) o.bucket_size = *job.parallel.ddp_bucket_size;
  // The embedding-group sum must happen before the DP reduction starts, so a bucket must not
  // launch from the hooks (the sum is done between backward and finish_grad_sync).
  o.overlap_grad_reduce = job.parallel.overlap_grad_reduce && !has_tied_copy(m);
  o.distributed_optimizer = job.optimizer.use_distributed_optimizer;
  return o;
}

GradNormGroups norm_groups(const lf::dist::ParallelContext& ctx) {
  GradNormGroups g;
  if (ctx.tp_size() * ctx.pp_size() > 1 && ctx.has(lf::dist::GroupKind::mp))
    g.model_parallel = &ctx.mp();
  g.tp_rank = ctx.tp_rank();
  return g;
}

// Deterministic mode must be on before the first op that could pick a nondeterministic kernel.
bool apply_determinism(const lf::config::TrainingConfig& t) {
  if (t.deterministic_mode) at::globalContext().setDeterministicAlgorithms(true, false);
  return t.deterministic_mode;
}

}  // namespace

struct Trainer::Impl {
  const lf::config::JobConfig& job;
  lf::models::Decoder& model;
  const lf::dist::ParallelContext& ctx;
  const lf::backend::DeviceBackend& backend;
  std::unique_ptr<BatchSource> train_data, valid_data;
  bool deterministic;
  GradBuffer grads;
  AdamW optimizer;
  LrSchedule schedule;
  int64_t micro_batches;
  TrainerCheckpointing checkpoints;
  // Pipeline parallelism (pp > 1): activations and gradients to and from the adjacent stages.
  std::unique_ptr<lf::parallel::pipeline::StageExchange> exchange;
  std::unique_ptr<lf::parallel::pipeline::ScheduleTrace> trace;  // --pipeline-trace

  Impl(const lf::config::JobConfig& j, lf::models::Decoder& m, const lf::dist::ParallelContext& c,
       const lf::backend::DeviceBackend& b, std::unique_ptr<BatchSource> t,
       std::unique_ptr<BatchSource> v)
      : job(j), model(m), ctx(c), backend(b), train_data(std::move(t)), valid_data(std::move(v)),
        deterministic(apply_determinism(j.training)),
        grads(m.parameters(), grad_reduce_group(c), c.tp_size() > 1 ? &c.tp() : nullptr,
              grad_buffer_options(j, m)),
        optimizer(grads, j.optimizer, b, norm_groups(c)),
        schedule(j.optimizer, j.training.train_iters),
        micro_batches(num_micro_batches(j.training, c.dp_size())),
        checkpoints(j, m, c, b, grads, optimizer, schedule,
                    j.training.micro_batch_size * c.dp_size() * micro_batches) {
    if (c.pp_size() > 1) {
      exchange = std::make_unique<lf::parallel::pipeline::StageExchange>(c.pp(), b.device());
      if (j.parallel.pipeline_trace) trace = std::make_unique<lf::parallel::pipeline::ScheduleTrace>();
    }
  }

  lf::backend::Communicator* dp() const { return ctx.dp_size() > 1 ? &ctx.dp() : nullptr; }

  double dp_mean(double value) const {
    if (!dp()) return value;
    auto t = at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(backend.device()));
    dp()->all_reduce(t, lf::backend::ReduceOp::avg);
    return t.item<double>();
  }

  // One forward/backward over the step's micro-batches, gradients reduced over DP; returns the
  // mean per-token loss of the global batch.
  double forward_backward() {
    if (job.parallel.chunkpipe_chunk_size) return forward_backward_chunkpipe();
    if (exchange) return forward_backward_pipelined();
    const int64_t s = job.training.seq_length;
    double loss_sum = 0;
    for (int64_t m = 0; m < micro_batches; ++m) {
      at::Tensor batch = train_data->next();  // [mb, s + 1]
      auto inputs = batch.narrow(1, 0, s).to(backend.device());
      auto labels = batch.narrow(1, 1, s).to(backend.device());
      // Scaled so that the DP average of the accumulated gradients is the global-batch mean.
      auto per_token = model.loss(inputs, labels);
      auto loss = per_token.sum() / static_cast<double>(per_token.numel() * micro_batches);
      grads.begin_micro_batch(m == micro_batches - 1);
      loss.backward();
      loss_sum += loss.item<double>();
    }
    grads.finish_grad_sync();
    return dp_mean(loss_sum);
  }

  // pp > 1: this stage's part of the step under 1F1B. Every stage reads the micro-batches (the
  // first needs the tokens, the last the labels; the others keep the data stream in step). The
  // loss is known on the last stage and broadcast over the pipeline group.
  double forward_backward_pipelined() {
    const int64_t s = job.training.seq_length;
    const auto& stage = model.stage();
    lf::parallel::pipeline::StageStep step;
    step.forward = [&](int64_t, const at::Tensor& input) {
      at::Tensor batch = train_data->next();  // [mb, s + 1]
      auto labels = batch.narrow(1, 1, s).to(backend.device());
      if (!stage.last) return model.stage_forward(stage.first ? batch.narrow(1, 0, s).to(backend.device()) : input);
      auto per_token = model.stage_forward(stage.first ? batch.narrow(1, 0, s).to(backend.device()) : input, labels);
      return per_token.sum() / static_cast<double>(per_token.numel() * micro_batches);
    };
    step.before_backward = [&](int64_t m) { grads.begin_micro_batch(m == micro_batches - 1); };
    double loss_sum = stage.num_chunks() > 1 ? run_interleaved()
                                             : lf::parallel::pipeline::run_1f1b(*exchange, micro_batches, step, trace.get());
    return finish_pipelined(loss_sum);
  }

  // ChunkPipe (--chunkpipe-chunk-size c): each micro-batch's sequence runs as s / c chunks through
  // the stages (pipeline/chunkpipe.h), every chunk's loss scaled as in the unchunked step. The
  // first pass draws the dropout masks; the recomputation replays them from the saved RNG state.
  double forward_backward_chunkpipe() {
    const int64_t s = job.training.seq_length, c = *job.parallel.chunkpipe_chunk_size, chunks = s / c;
    const auto& stage = model.stage();
    double loss_sum = 0;
    for (int64_t m = 0; m < micro_batches; ++m) {
      at::Tensor batch = train_data->next();  // [mb, s + 1]
      // Dropout streams: before each chunk of the first pass (replayed), and after the last one
      // (where the next micro-batch continues).
      std::vector<std::map<std::string, at::Tensor>> rng_states(static_cast<size_t>(chunks) + 1);
      lf::parallel::pipeline::ChunkPipeStep step;
      step.forward = [&](int64_t k, const at::Tensor& input, lf::models::ChunkAttention& kv, bool with_grad) {
        if (with_grad)
          model.rng().set_state(rng_states[static_cast<size_t>(k)]);
        else
          rng_states[static_cast<size_t>(k)] = model.rng().state();
        at::Tensor in = stage.first ? batch.narrow(1, k * c, c).to(backend.device()) : input;
        if (!with_grad) {
          auto out = model.stage_forward_chunk(in, {}, k * c, kv, /*with_head=*/false);
          if (k == chunks - 1) rng_states.back() = model.rng().state();
          return out;
        }
        if (!stage.last) return model.stage_forward_chunk(in, {}, k * c, kv);
        auto per_token = model.stage_forward_chunk(in, batch.narrow(1, k * c + 1, c).to(backend.device()), k * c, kv);
        return per_token.sum() / static_cast<double>(per_token.numel() * chunks * micro_batches);
      };
      step.before_backward = [&](int64_t k) { grads.begin_micro_batch(m == micro_batches - 1 && k == 0); };
      loss_sum += lf::parallel::pipeline::run_chunkpipe(exchange.get(), chunks, step, trace.get());
      model.rng().set_state(rng_states.back());
    }
    if (exchange) return finish_pipelined(loss_sum);
    grads.finish_grad_sync();
    return dp_mean(loss_sum);
  }

  // After a pipelined step: the tied embedding's gradient summed over its group, the DP
  // reduction, and the loss (known on the last stage) broadcast over the pipeline group.
  double finish_pipelined(double loss_sum) {
    // Tied embeddings: sum the embedding's gradient over the first and last stage (Megatron's
    // _allreduce_word_embedding_grads), before the DP reduction (both are sums).
    if (has_tied_copy(model) && ctx.in_embedding_group() && ctx.embedding().size() > 1) {
      for (size_t i = 0; i < model.parameters().size(); ++i) {
        const auto& p = model.parameters()[i];
        if (p.name != "embedding.word_embeddings.weight") continue;
        at::Tensor g = grads.main_grad(static_cast<int>(i));
        ctx.embedding().all_reduce(g, lf::backend::ReduceOp::sum);
      }
    }
    grads.finish_grad_sync();
    auto t = at::full({1}, loss_sum, at::TensorOptions().dtype(at::kDouble).device(backend.device()));
    ctx.pp().broadcast(t, ctx.pp_size() - 1);
    return dp_mean(t.item<double>());
  }

  // Interleaved 1F1B: chunk 0 of the first stage reads the tokens, the last stage's last chunk
  // the labels. The forwards of a micro-batch's chunks are not consecutive, so each micro-batch is
  // read once (in micro-batch order, keeping every rank's data stream in step) and kept until its
  // last chunk has run forward.
  double run_interleaved() {
    const int64_t s = job.training.seq_length;
    const auto& stage = model.stage();
    const int chunks = static_cast<int>(stage.num_chunks());
    std::map<int64_t, std::pair<at::Tensor, int>> batches;  // m -> (batch, forwards left)
    int64_t next_read = 0;
    lf::parallel::pipeline::VirtualStageStep step;
    step.forward = [&](int chunk, int64_t m, const at::Tensor& input) {
      while (next_read <= m) batches[next_read++] = {train_data->next(), chunks};
      auto& [batch, left] = batches.at(m);
      const at::Tensor b = batch;
      if (--left == 0) batches.erase(m);
      const bool embeds = stage.first && chunk == 0, heads = stage.last && chunk == chunks - 1;
      at::Tensor in = embeds ? b.narrow(1, 0, s).to(backend.device()) : input;
      if (!heads) return model.stage_forward(in, {}, chunk);
      auto per_token = model.stage_forward(in, b.narrow(1, 1, s).to(backend.device()), chunk);
      return per_token.sum() / static_cast<double>(per_token.numel() * micro_batches);
    };
    step.before_backward = [&](int, int64_t, bool final) { grads.begin_micro_batch(final); };
    return lf::parallel::pipeline::run_interleaved_1f1b(*exchange, chunks, micro_batches, step, trace.get());
  }

  // ChunkPipe validation: each sequence in chunks, forward only (one chunk's logits at a time);
  // a chunk's prefix is the concatenation of the earlier chunks' keys/values. Under pp > 1 the
  // chunks travel the stages in order and the last one scores. Returns [loss sum, correct, tokens].
  at::Tensor evaluate_chunked(int64_t iters) {
    const int64_t c = *job.parallel.chunkpipe_chunk_size, chunks = job.training.seq_length / c;
    const auto& stage = model.stage();
    double loss_sum = 0, correct = 0, tokens = 0;
    for (int64_t i = 0; i < iters; ++i) {
      at::Tensor batch = valid_data->next();
      std::vector<at::Tensor> keys, values;  // per layer: the keys/values of the chunks so far
      for (int64_t k = 0; k < chunks; ++k) {
        at::Tensor input = stage.first ? batch.narrow(1, k * c, c).to(backend.device()) : exchange->recv_forward();
        lf::models::ChunkAttention kv;
        kv.prefix_k = keys;
        kv.prefix_v = values;
        at::Tensor out = model.stage_forward_chunk(input, {}, k * c, kv);
        keys.resize(kv.k.size());
        values.resize(kv.v.size());
        for (size_t l = 0; l < kv.k.size(); ++l) {
          keys[l] = keys[l].defined() ? at::cat({keys[l], kv.k[l]}, 2) : kv.k[l];
          values[l] = values[l].defined() ? at::cat({values[l], kv.v[l]}, 2) : kv.v[l];
        }
        if (!stage.last) {
          exchange->send_forward(out);
          continue;
        }
        auto target = batch.narrow(1, k * c + 1, c).to(backend.device()).t().reshape({-1});
        auto flat = out.reshape({-1, out.size(-1)});
        loss_sum += lf::ops::softmax_cross_entropy(backend, flat, target).sum().item<double>();
        correct += flat.argmax(-1).eq(target).sum().item<double>();
        tokens += static_cast<double>(target.numel());
      }
    }
    auto totals = at::tensor({loss_sum, correct, tokens}, at::TensorOptions().dtype(at::kDouble))
                      .to(backend.device());
    if (exchange) {
      exchange->flush();
      ctx.pp().broadcast(totals, ctx.pp_size() - 1);
    }
    return totals;
  }

  // pp > 1 validation: forward only through the stages; the last one scores, then broadcasts
  // [loss sum, correct, tokens] over the pipeline group.
  at::Tensor evaluate_pipelined(int64_t iters) {
    const int64_t s = job.training.seq_length;
    const auto& stage = model.stage();
    double loss_sum = 0, correct = 0, tokens = 0;
    const int64_t chunks = stage.num_chunks();
    for (int64_t i = 0; i < iters; ++i) {
      at::Tensor batch = valid_data->next();
      at::Tensor out;
      // Model chunks in order (virtual stages travel the ring; one chunk: stage to stage).
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t vs = c * ctx.pp_size() + ctx.pp_rank(), msg = vs * iters + i;
        at::Tensor input = stage.first && c == 0 ? batch.narrow(1, 0, s).to(backend.device())
                           : chunks > 1          ? exchange->recv_forward_ring(msg - iters)
                                                 : exchange->recv_forward();
        out = model.stage_forward(input, {}, c);
        if (stage.last && c == chunks - 1) break;
        if (chunks > 1)
          exchange->send_forward_ring(out, msg);
        else
          exchange->send_forward(out);
      }
      if (!stage.last) continue;
      auto target = batch.narrow(1, 1, s).to(backend.device()).t().reshape({-1});
      auto flat = out.reshape({-1, out.size(-1)});
      loss_sum += lf::ops::softmax_cross_entropy(backend, flat, target).sum().item<double>();
      correct += flat.argmax(-1).eq(target).sum().item<double>();
      tokens += static_cast<double>(target.numel());
    }
    exchange->flush();
    auto totals = at::tensor({loss_sum, correct, tokens}, at::TensorOptions().dtype(at::kDouble))
                      .to(backend.device());
    ctx.pp().broadcast(totals, ctx.pp_size() - 1);
    return totals;
  }
};

Trainer::Trainer(const lf::config::JobConfig& job, lf::models::Decoder& model,
                 const lf::dist::ParallelContext& ctx, const lf::backend::DeviceBackend& backend,
                 std::unique_ptr<BatchSource> train_data, std::unique_ptr<BatchSource> valid_data)
    : impl_(std::make_unique<Impl>(job, model, ctx, backend, std::move(train_data),
                                   std::move(valid_data))) {
  model.set_recompute(recompute_options(job.training));
}

lf::models::RecomputeOptions recompute_options(const lf::config::TrainingConfig& t) {
  using R = lf::models::RecomputeOptions;
  R r;
  if (!t.recompute_granularity) return r;
  r.granularity = *t.recompute_granularity == "full" ? R::Granularity::full : R::Granularity::selective;
  r.method = t.recompute_method.value_or("uniform") == "block" ? R::Method::block : R::Method::uniform;
  r.num_layers = t.recompute_num_layers.value_or(1);
  return r;
}

Trainer::~Trainer() = default;

void Trainer::set_config_yaml(std::string yaml) { impl_->checkpoints.set_config_yaml(std::move(yaml)); }

EvalResult Trainer::evaluate() {
  auto& I = *impl_;
  EvalResult r;
  if (!I.valid_data || I.job.training.eval_iters == 0) return r;
  at::NoGradGuard no_grad;
  // Eval mode (no dropout) for the evaluation only.
  struct TrainingMode {
    lf::models::Decoder& m;
    ~TrainingMode() { m.set_training(true); }
  } restore{I.model};
  I.model.set_training(false);
  I.valid_data->rewind();
  const int64_t s = I.job.training.seq_length;
  double loss_sum = 0, correct = 0, tokens = 0;
  const bool chunked = I.job.parallel.chunkpipe_chunk_size.has_value();
  for (int64_t i = 0; i < I.job.training.eval_iters && !I.exchange && !chunked; ++i) {
    at::Tensor batch = I.valid_data->next();
    auto inputs = batch.narrow(1, 0, s).to(I.backend.device());
    auto labels = batch.narrow(1, 1, s).to(I.backend.device());
    auto logits = I.model.forward(inputs);  // [s, b, v]
    auto target = labels.t().reshape({-1});
    auto flat = logits.reshape({-1, logits.size(-1)});
    loss_sum += lf::ops::softmax_cross_entropy(I.backend, flat, target).sum().item<double>();
    correct += flat.argmax(-1).eq(target).sum().item<double>();
    tokens += static_cast<double>(target.numel());
  }
  auto totals = chunked      ? I.evaluate_chunked(I.job.training.eval_iters)
                : I.exchange ? I.evaluate_pipelined(I.job.training.eval_iters)
                             : at::tensor({loss_sum, correct, tokens}, at::TensorOptions().dtype(at::kDouble))
                                   .to(I.backend.device());
  if (I.dp()) I.dp()->all_reduce(totals, lf::backend::ReduceOp::sum);
  r.loss = totals[0].item<double>() / totals[2].item<double>();
  r.accuracy = totals[1].item<double>() / totals[2].item<double>();
  r.tokens = static_cast<int64_t>(totals[2].item<double>());
  return r;
}

TrainSummary Trainer::run() {
  auto& I = *impl_;
  const auto& t = I.job.training;
  const auto& log = I.job.logging;
  const bool rank0 = I.ctx.global_rank() == 0;
  const int64_t global_batch = t.micro_batch_size * I.ctx.dp_size() * I.micro_batches;
  const int64_t tokens_per_step = global_batch * t.seq_length;
  std::ofstream metrics;
  if (rank0 && log.metrics_file) {
    metrics.open(*log.metrics_file, std::ios::app);
    LF_CHECK(metrics.good(), "cannot open --metrics-file ", *log.metrics_file,
             lf::hint("check that its directory exists and is writable"));
  }
  if (rank0) {
    const auto& o = I.grads.options();
    LF_INFO("gradients: ", I.grads.buckets().size(), " bucket(s) in an fp32 buffer of ",
            I.grads.main_grad().numel(), " elements, reduction ",
            o.overlap_grad_reduce ? "overlapped with backward" : "after backward",
            " | optimizer state ", I.optimizer.state_bytes() / 1048576.0, " MiB on this rank",
            o.distributed_optimizer ? " (ZeRO-1, sharded over data-parallel ranks)" : "",
            I.deterministic ? " | deterministic mode" : "");
  }
  TrainSummary summary;
  summary.start_iteration = I.checkpoints.load(*I.train_data);
  summary.iterations = summary.start_iteration;
  summary.first_eval = evaluate();
  if (rank0 && summary.first_eval.tokens > 0)
    LF_INFO("validation before training | loss ", summary.first_eval.loss, " | accuracy ",
            summary.first_eval.accuracy);
  const auto start = std::chrono::steady_clock::now();
  auto window_start = start;
  int64_t window_iters = 0;
  for (int64_t it = summary.start_iteration + 1; it <= t.train_iters; ++it) {
    const double loss = I.forward_backward();
    const bool skip = t.skip_nonfinite_steps;
    const double lr = I.schedule.lr(it);
    double grad_norm = 0;
    if (!std::isfinite(loss)) {
      // Every rank sees the same (DP-averaged) loss, so all take the same branch.
      LF_CHECK(skip, "loss is ", loss, " at iteration ", it,
               lf::hint("lower --lr or check the data; the run stops here (set "
                        "training.skip_nonfinite_steps=true to skip such steps instead)"));
      if (rank0) LF_WARN("iteration ", it, ": loss is ", loss, "; step skipped");
      grad_norm = loss;
    } else {
      auto step = I.optimizer.step(lr, /*skip_nonfinite=*/true);
      grad_norm = step.grad_norm;
      LF_CHECK(!step.skipped || skip, "gradient norm is ", step.grad_norm, " at iteration ", it,
               lf::hint("lower --lr, enable --clip-grad, or check the data for corrupt tokens "
                        "(training.skip_nonfinite_steps=true skips such steps)"));
      if (step.skipped && rank0)
        LF_WARN("iteration ", it, ": gradient norm is ", step.grad_norm, "; step skipped");
    }
    I.grads.zero_grad();
    summary.iterations = it;
    summary.last_loss = loss;
    ++window_iters;
    if (it % log.log_interval == 0 || it == t.train_iters) {
      const auto now = std::chrono::steady_clock::now();
      const double secs = std::chrono::duration<double>(now - window_start).count();
      const double tps = tokens_per_step * window_iters / std::max(secs, 1e-9);
      const double elapsed = std::chrono::duration<double>(now - start).count();
      const double eta = elapsed / (it - summary.start_iteration) * (t.train_iters - it);
      window_start = now;
      window_iters = 0;
      summary.tokens_per_sec = tps;
      if (rank0) {
        const double flops = I.model.config().flops_per_token(t.seq_length) * tps /
                             std::max(1, I.ctx.world_size());
        std::ostringstream line;
        line << std::setprecision(4) << "iteration " << it << "/" << t.train_iters
             << " | consumed samples " << it * global_batch << " | loss " << loss << " | lr "
             << lr << " | grad norm " << grad_norm << " | tokens/s " << std::setprecision(6)
             << tps << " | TFLOP/s per rank " << std::setprecision(3) << flops / 1e12;
        // Peak of live tensor bytes on this rank since the start (the backend's allocator).
        const auto mem = I.backend.memory_stats();
        const double peak_mib = static_cast<double>(mem.peak_allocated_bytes) / (1 << 20);
        if (mem.supported) line << " | peak memory " << std::setprecision(5) << peak_mib << " MiB";
        line << " | ETA " << std::setprecision(3) << eta << " s";
        LF_INFO(line.str());
        if (metrics.is_open()) {
          metrics << std::setprecision(10) << "{\"iteration\": " << it << ", \"loss\": " << loss
                  << ", \"grad_norm\": " << grad_norm << ", \"lr\": " << lr
                  << ", \"tokens_per_sec\": " << tps << ", \"consumed_samples\": "
                  << it * global_batch;
          if (mem.supported) metrics << ", \"peak_memory_mib\": " << peak_mib;
          metrics << "}\n";
          metrics.flush();
        }
      }
    }
    if (t.eval_interval > 0 && it % t.eval_interval == 0 && it != t.train_iters) {
      auto e = evaluate();
      if (rank0 && e.tokens > 0)
        LF_INFO("validation at iteration ", it, " | loss ", e.loss, " | accuracy ", e.accuracy);
    }
    if (I.checkpoints.after_step(it)) {
      summary.preempted = true;
      break;
    }
    if (t.exit_interval && it % *t.exit_interval == 0) {
      if (rank0) LF_INFO("exiting at iteration ", it, " (exit_interval ", *t.exit_interval, ")");
      break;
    }
    if (t.exit_duration_in_mins) {
      // Every rank must take the same decision, or the ones that continue would hang.
      double minutes =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 60.0;
      auto flag = at::full({1}, minutes > *t.exit_duration_in_mins ? 1.0 : 0.0,
                           at::TensorOptions().dtype(at::kDouble).device(I.backend.device()));
      if (I.ctx.world_size() > 1) I.ctx.world().all_reduce(flag, lf::backend::ReduceOp::max);
      if (flag.item<double>() > 0) {
        if (rank0) LF_INFO("exiting at iteration ", it, " (exit_duration_in_mins)");
        break;
      }
    }
  }
  I.checkpoints.finish(summary.iterations);
  if (I.trace && !I.trace->steps.empty()) {
    // Each stage writes its timeline; the bubble is averaged over the stages.
    const std::string path = *I.job.parallel.pipeline_trace + ".stage" + std::to_string(I.ctx.pp_rank()) + ".json";
    if (I.ctx.tp_rank() == 0 && I.ctx.dp_rank() == 0) I.trace->write_chrome_trace(path, I.ctx.pp_rank());
    auto bubble = at::full({1}, I.trace->bubble_fraction(), at::TensorOptions().dtype(at::kDouble).device(I.backend.device()));
    I.ctx.pp().all_reduce(bubble, lf::backend::ReduceOp::avg);
    // The ideal of equal stages: 1F1B (p - 1) / (m + p - 1); interleaved (p - 1) / (v m + p - 1);
    // ChunkPipe, whose sequences of n chunks pass forward then backward, (p - 1) / (n + p - 1).
    const double p = I.ctx.pp_size(), m = static_cast<double>(I.micro_batches);
    const double v = static_cast<double>(I.model.stage().num_chunks());
    std::ostringstream ideal;
    if (const auto c = I.job.parallel.chunkpipe_chunk_size) {
      const double n = static_cast<double>(t.seq_length / *c);
      ideal << "ChunkPipe ideal (p - 1) / (n + p - 1) = " << (p - 1) / (n + p - 1) << " for p " << p << ", n " << n
            << " chunks";
    } else if (v > 1) {
      ideal << "interleaved ideal (p - 1) / (v m + p - 1) = " << (p - 1) / (v * m + p - 1) << " for p " << p
            << ", v " << v << ", m " << m;
    } else {
      ideal << "1F1B ideal (p - 1) / (m + p - 1) = " << (p - 1) / (m + p - 1) << " for p " << p << ", m " << m;
    }
    if (rank0)
      LF_INFO("pipeline bubble: ", bubble.item<double>(), " of each step (", ideal.str(), ") | trace: ",
              *I.job.parallel.pipeline_trace, ".stage<k>.json");
  }
  summary.last_eval = evaluate();
  if (rank0 && summary.last_eval.tokens > 0)
    LF_INFO("validation after training | loss ", summary.last_eval.loss, " | accuracy ",
            summary.last_eval.accuracy);
  return summary;
}

}  // namespace lf::train

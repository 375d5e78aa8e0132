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
#include <sstream>

#include "loongforge/backend/functional.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/train/grad_buffer.h"
#include "loongforge/train/lr_schedule.h"
#include "loongforge/train/optimizer.h"

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

GradBufferOptions grad_buffer_options(const lf::config::JobConfig& job) {
  GradBufferOptions o;
  if (job.parallel.ddp_bucket_size) o.bucket_size = *job.parallel.ddp_bucket_size;
  o.overlap_grad_reduce = job.parallel.overlap_grad_reduce;
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

  Impl(const lf::config::JobConfig& j, lf::models::Decoder& m, const lf::dist::ParallelContext& c,
       const lf::backend::DeviceBackend& b, std::unique_ptr<BatchSource> t,
       std::unique_ptr<BatchSource> v)
      : job(j), model(m), ctx(c), backend(b), train_data(std::move(t)), valid_data(std::move(v)),
        deterministic(apply_determinism(j.training)),
        grads(m.parameters(), grad_reduce_group(c), c.tp_size() > 1 ? &c.tp() : nullptr,
              grad_buffer_options(j)),
        optimizer(grads, j.optimizer, b, norm_groups(c)),
        schedule(j.optimizer, j.training.train_iters),
        micro_batches(num_micro_batches(j.training, c.dp_size())) {}

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
};

Trainer::Trainer(const lf::config::JobConfig& job, lf::models::Decoder& model,
                 const lf::dist::ParallelContext& ctx, const lf::backend::DeviceBackend& backend,
                 std::unique_ptr<BatchSource> train_data, std::unique_ptr<BatchSource> valid_data)
    : impl_(std::make_unique<Impl>(job, model, ctx, backend, std::move(train_data),
                                   std::move(valid_data))) {}

Trainer::~Trainer() = default;

EvalResult Trainer::evaluate() {
  auto& I = *impl_;
  EvalResult r;
  if (!I.valid_data || I.job.training.eval_iters == 0) return r;
  at::NoGradGuard no_grad;
  I.valid_data->rewind();
  const int64_t s = I.job.training.seq_length;
  double loss_sum = 0, correct = 0, tokens = 0;
  for (int64_t i = 0; i < I.job.training.eval_iters; ++i) {
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
  auto totals = at::tensor({loss_sum, correct, tokens}, at::TensorOptions().dtype(at::kDouble))
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
  summary.first_eval = evaluate();
  if (rank0 && summary.first_eval.tokens > 0)
    LF_INFO("validation before training | loss ", summary.first_eval.loss, " | accuracy ",
            summary.first_eval.accuracy);
  const auto start = std::chrono::steady_clock::now();
  auto window_start = start;
  int64_t window_iters = 0;
  for (int64_t it = 1; it <= t.train_iters; ++it) {
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
      const double eta = elapsed / it * (t.train_iters - it);
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
             << tps << " | TFLOP/s per rank " << std::setprecision(3) << flops / 1e12
             << " | ETA " << std::setprecision(3) << eta << " s";
        LF_INFO(line.str());
        if (metrics.is_open()) {
          metrics << std::setprecision(10) << "{\"iteration\": " << it << ", \"loss\": " << loss
                  << ", \"grad_norm\": " << grad_norm << ", \"lr\": " << lr
                  << ", \"tokens_per_sec\": " << tps << ", \"consumed_samples\": "
                  << it * global_batch << "}\n";
          metrics.flush();
        }
      }
    }
    if (t.eval_interval > 0 && it % t.eval_interval == 0 && it != t.train_iters) {
      auto e = evaluate();
      if (rank0 && e.tokens > 0)
        LF_INFO("validation at iteration ", it, " | loss ", e.loss, " | accuracy ", e.accuracy);
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
  summary.last_eval = evaluate();
  if (rank0 && summary.last_eval.tokens > 0)
    LF_INFO("validation after training | loss ", summary.last_eval.loss, " | accuracy ",
            summary.last_eval.accuracy);
  return summary;
}

}  // namespace lf::train

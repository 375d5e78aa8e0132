#include "loongforge/train/trainer.h"
#include "loongforge/train/step_profiler.h"

#include <ATen/record_function.h>

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iomanip>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/train/step_profiler.h"
#include "trainer_impl.h"

namespace lf::train {

int64_t num_micro_batches(const lf::config::TrainingConfig& t, int dp_size) {
  const int64_t per_step = t.micro_batch_size * dp_size;
  const int64_t global = t.global_batch_size.value_or(per_step);
  LF_CHECK(global % per_step == 0, "global_batch_size ", global, " is not a multiple of micro_batch_size ",
           t.micro_batch_size, " x data-parallel size ", dp_size, " = ", per_step,
           lf::hint("choose --global-batch-size as a multiple of " + std::to_string(per_step)));
  return global / per_step;
}

std::string display_name(const std::string& metric) { return metric == "lm loss" ? "loss" : metric; }

double EvalResult::value(const std::string& name) const {
  auto it = metrics.find(name);
  return it == metrics.end() || it->second.count == 0 ? 0.0 : it->second.sum / it->second.count;
}

std::unique_ptr<lf::ops::Fp8Policy> fp8_policy(const lf::config::TrainingConfig& t) {
  if (!t.fp8_format) return nullptr;
  const auto r = lf::ops::Fp8Recipe::from_names(*t.fp8_format, t.fp8_recipe, static_cast<int>(t.fp8_margin),
                                                t.fp8_amax_history_len, t.fp8_amax_compute_algo);
  auto p = t.fp8_policy ? std::make_unique<lf::ops::Fp8Policy>(lf::ops::Fp8Policy::read(*t.fp8_policy, r))
                        : std::make_unique<lf::ops::Fp8Policy>(r);
  if (t.first_last_layers_bf16) p->set_layers_in_training_dtype(t.num_layers_at_start_in_bf16, t.num_layers_at_end_in_bf16);
  return p;
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

namespace {

// Gradients are reduced over every rank that sees different data with the same parameters: the
// group's dp, and dp x cp when context parallelism (or a heterogeneous encoder's share axis)
// splits the data further.
lf::backend::Communicator* grad_reduce_group(const lf::dist::ParallelContext& c) {
  if (c.dp_size() * c.cp_size() == 1) return nullptr;
  return c.cp_size() > 1 ? &c.dp_cp() : &c.dp();
}

// Deterministic mode must be on before the first op that could pick a nondeterministic kernel.
bool apply_determinism(const lf::config::TrainingConfig& t) {
  if (t.deterministic_mode) at::globalContext().setDeterministicAlgorithms(true, false);
  return t.deterministic_mode;
}

}  // namespace

Trainer::Impl::Impl(const lf::config::JobConfig& j, lf::models::Model& m, const lf::dist::ParallelContext& c,
                    const lf::backend::DeviceBackend& b, std::unique_ptr<BatchSource> t, std::unique_ptr<BatchSource> v,
                    TrainerHooks hooks)
    : job(j), model(m), ctx(c), backend(b), train_data(std::move(t)), valid_data(std::move(v)),
      deterministic(apply_determinism(j.training)), groups(m.parameter_groups()),
      schedule(j.optimizer, j.training.train_iters), scaler(j.training),
      micro_batches(num_micro_batches(j.training, c.dp_size())) {
  std::vector<CheckpointGroup> ckpt_groups;
  fp8 = fp8_policy(j.training);
  if (fp8 && fp8->recipe().scaling == lf::ops::Fp8Scaling::delayed) {
    fp8_delayed = std::make_unique<lf::ops::Fp8DelayedScaling>(fp8->recipe());
    fp8->set_delayed(fp8_delayed.get());
  }
  // EMA weights start as the initial weights (a loaded checkpoint's, or its weights, replace them).
  if (j.training.ema_decay) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < groups.size(); ++i) {
      if (!groups[i].trainable || groups[i].params.empty()) continue;
      std::vector<at::Tensor> e;
      for (const auto& p : groups[i].params) e.push_back(p.tensor.detach().to(at::kFloat).clone());
      ema.push_back(std::move(e));
      ema_groups.push_back(i);
    }
  }
  for (const auto& g : groups) {
    LF_CHECK(g.context != nullptr, "parameter group ", g.name, " of model type ", m.type(), " has no parallel context");
    CheckpointGroup cg{g.name, &g.params, g.context, -1, g.base};
    if (fp8_delayed) {
      // Reduced over the ranks that hold the same weights (or TP shards of them): the group's TP x DP
      // x CP ranks; for experts spread over expert-parallel ranks (the experts' context: its tp axis
      // is EP, or EP x TP when the experts are split over TP), expert-DP and that TP.
      std::vector<lf::ops::Fp8Weight> weights;
      bool experts = false, dense = false;
      int64_t within = 1;  // the TP ranks that share an expert-parallel rank's experts
      const auto& gc = *g.context;
      for (const auto& p : g.params) {
        if (p.state) continue;
        (p.expert ? experts : dense) = true;
        if (!p.expert) {
          weights.push_back({p.name, p.tensor});
          continue;
        }
        // Split along the experts over tp_size EP ranks (rank tp_rank holds part tp_rank), or two-level
        // (Sharding::outer > 1: outer EP parts, each over tp_size / outer TP ranks).
        const int64_t inner = p.sharding.outer > 1 ? p.tp_size / p.sharding.outer : 1;
        within = std::max(within, inner);
        weights.push_back({p.name, p.tensor, p.tp_size / inner, p.tp_rank / inner});
      }
      LF_CHECK(!(experts && dense), "parameter group ", g.name, " mixes expert-parallel and other weights",
               lf::hint("internal: expert-parallel weights form their own group"));
      std::vector<lf::backend::Communicator*> over;
      if (!experts) {
        if (gc.tp_size() * gc.dp_size() * gc.cp_size() > 1) over.push_back(&gc.tp_dp_cp());
      } else {
        if (gc.dp_size() * gc.cp_size() > 1) over.push_back(gc.cp_size() > 1 ? &gc.dp_cp() : &gc.dp());
        if (within > 1) {
          LF_CHECK(c.tp_size() == within, "parameter group ", g.name, ": experts split over ", within,
                   " TP ranks, the job's TP group has ", c.tp_size(),
                   lf::hint("internal: the trainer's context must be the dense layout's"));
          over.push_back(&c.tp());
        }
      }
      cg.fp8 = &fp8_delayed->add_group(weights, over);
    }
    for (size_t k = 0; k < ema_groups.size(); ++k)
      if (&groups[ema_groups[k]] == &g) cg.ema = &ema[k];
    if (g.trainable && !g.params.empty()) {
      lf::parallel::GradBufferOptions o;
      if (j.parallel.ddp_bucket_size) o.bucket_size = *j.parallel.ddp_bucket_size;
      // The embedding-group sum must happen before the DP reduction starts, so a bucket with a
      // pipeline-tied parameter must not launch from the hooks.
      bool tied = false;
      for (const auto& p : g.params) tied = tied || p.pipeline_tied;
      o.overlap_grad_reduce = j.parallel.overlap_grad_reduce && !tied;
      o.distributed_optimizer = j.optimizer.use_distributed_optimizer;
      o.average = false;  // the loss terms are normalised over the whole global batch
      GroupBuffer gb;
      gb.name = g.name;
      gb.context = g.context;
      gb.grads = std::make_unique<GradBuffer>(g.params, grad_reduce_group(*g.context),
                                              g.context->tp_size() > 1 ? &g.context->tp() : nullptr, o);
      cg.buffer = static_cast<int>(buffers.size());
      buffers.push_back(std::move(gb));
    }
    ckpt_groups.push_back(cg);
  }
  {
    // Some ranks may hold only frozen parameters (a pipeline stage of a frozen foundation); the
    // job as a whole must train something.
    auto n = at::full({1}, static_cast<double>(buffers.size()), at::TensorOptions().dtype(at::kDouble).device(b.device()));
    if (c.world_size() > 1) c.world().all_reduce(n, lf::backend::ReduceOp::max);
    LF_CHECK(n.item<double>() > 0, "nothing to train: every component of model type ", m.type(), " is frozen",
             lf::hint("drop `freeze: true` from at least one component"));
  }
  optimizer = std::make_unique<Optimizer>(grad_list(), j.optimizer, b, c.world_size() > 1 ? &c.world() : nullptr);
  checkpoints = std::make_unique<TrainerCheckpointing>(j, m, c, b, ckpt_groups, *optimizer, scaler, schedule,
                                                       j.training.micro_batch_size * c.dp_size() * micro_batches,
                                                       std::move(hooks));
  if (c.pp_size() > 1) {
    exchange = std::make_unique<lf::parallel::pipeline::StageExchange>(c.pp(), b.device());
    if (j.parallel.pipeline_trace) trace = std::make_unique<lf::parallel::pipeline::ScheduleTrace>();
  }
  if (j.logging.tensorboard_dir && c.global_rank() == 0)
    tensorboard = std::make_unique<TensorBoardWriter>(*j.logging.tensorboard_dir);
  // Last: a constructor that throws after this would leave the model pointing at a freed sink.
  if (trace) m.set_trace(&trace->spans);
  // The MoE overlap across micro-batches: whether to pair is the model's (its plan's) decision.
  pair_micro_batches = m.set_streams(&streams);
  if (j.training.gradient_accumulation_fusion && !buffers.empty()) {
    sink = std::make_unique<BufferGradientSink>(buffers);
    m.set_gradient_sink(sink.get());
  }
}

void Trainer::Impl::update_ema() {
  if (ema.empty()) return;
  RECORD_USER_SCOPE("lf::ema");
  at::NoGradGuard no_grad;
  const double d = *job.training.ema_decay;
  for (size_t k = 0; k < ema.size(); ++k) {
    const auto& params = groups[ema_groups[k]].params;
    for (size_t i = 0; i < params.size(); ++i) ema[k][i].lerp_(params[i].tensor.detach().to(at::kFloat), 1.0 - d);
  }
}

double Trainer::Impl::params_norm() const {
  at::NoGradGuard no_grad;
  double local = 0;
  for (const auto& g : groups) {
    if (g.context->dp_rank() != 0 || g.context->cp_rank() != 0) continue;  // DP replicas hold the same weights
    for (const auto& p : g.params) {
      if (p.tied_copy || (!p.is_split() && p.tp_rank != 0)) continue;
      local += p.tensor.detach().to(at::kDouble).pow(2).sum().item<double>();
    }
  }
  auto t = at::full({1}, local, at::TensorOptions().dtype(at::kDouble).device(backend.device()));
  if (ctx.world_size() > 1) ctx.world().all_reduce(t, lf::backend::ReduceOp::sum);
  return std::sqrt(t.item<double>());
}

Trainer::Trainer(const lf::config::JobConfig& job, lf::models::Model& model, const lf::dist::ParallelContext& ctx,
                 const lf::backend::DeviceBackend& backend, std::unique_ptr<BatchSource> train_data,
                 std::unique_ptr<BatchSource> valid_data, TrainerHooks hooks)
    : impl_(std::make_unique<Impl>(job, model, ctx, backend, std::move(train_data), std::move(valid_data),
                                   std::move(hooks))) {
  model.set_recompute(recompute_options(job.training));
  auto& I = *impl_;
  if (I.fp8) {
    LF_CHECK(model.set_fp8(I.fp8.get()), "--fp8-format ", *job.training.fp8_format, ": model type ", model.type(),
             " has no linear layer that runs in FP8",
             lf::hint("FP8 covers the decoder's linear layers (attention, MLP, MoE experts) and the Wan DiT's "
                      "blocks, outside the layers --first-last-layers-bf16 keeps; drop --fp8-format"));
    if (ctx.world_size() > 1) {
      // Every rank must choose the same GEMMs: TP's amax all-reduces follow the choices, and ranks
      // reading different --fp8-policy files would wait on each other forever.
      const int64_t h = static_cast<int64_t>(std::hash<std::string>{}(I.fp8->describe()) & 0x3fffffffffffULL);
      auto t = at::tensor(std::vector<int64_t>{h, -h}, at::TensorOptions().dtype(at::kLong)).to(backend.device());
      ctx.world().all_reduce(t, lf::backend::ReduceOp::max);
      t = t.cpu();
      LF_CHECK(t[0].item<int64_t>() == h && -t[1].item<int64_t>() == h, "--fp8-policy ",
               job.training.fp8_policy.value_or("(none)"), ": the FP8 choices differ between ranks (rank ",
               ctx.global_rank(), ": ", I.fp8->describe(), ")",
               lf::hint("give every rank the same policy file (the same path and contents on every node)"));
    }
    if (ctx.global_rank() == 0) LF_INFO("fp8: ", I.fp8->describe());
  }
}

Trainer::~Trainer() = default;

void Trainer::set_config_yaml(std::string yaml) { impl_->checkpoints->set_config_yaml(std::move(yaml)); }

EvalResult Trainer::evaluate() {
  auto& I = *impl_;
  EvalResult r;
  if (!I.valid_data || I.job.training.eval_iters == 0) return r;
  at::NoGradGuard no_grad;
  // Eval mode (no dropout) for the evaluation only.
  struct TrainingMode {
    lf::models::Model& m;
    ~TrainingMode() { m.set_training(true); }
  } restore{I.model};
  I.model.set_training(false);
  I.valid_data->rewind();
  const int64_t iters = I.job.training.eval_iters;
  lf::models::Metrics local;
  for (const auto& name : I.model.eval_metrics()) local[name] = {};
  for (int64_t i = 0; i < iters; ++i) I.evaluate_batch(I.valid_data->next().to(I.backend.device()), i, iters, local);
  if (I.exchange) I.exchange->flush();
  // [sum, count] per metric: known on the last stage, broadcast over the pipeline, summed over DP
  // (and CP: each context-parallel rank counts its own tokens).
  std::vector<double> v;
  for (const auto& [name, m] : local) v.insert(v.end(), {m.sum, m.count});
  auto t = at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(I.backend.device());
  if (I.exchange) I.ctx.pp().broadcast(t, I.ctx.pp_size() - 1);
  if (I.dp_cp()) I.dp_cp()->all_reduce(t, lf::backend::ReduceOp::sum);
  t = t.cpu();
  size_t k = 0;
  for (const auto& [name, m] : local) {
    r.metrics[name] = {t[static_cast<int64_t>(k)].item<double>(), t[static_cast<int64_t>(k + 1)].item<double>()};
    k += 2;
  }
  r.ran = true;
  return r;
}

namespace {

// In the model's order of its metrics.
std::string metrics_text(const EvalResult& e, const std::vector<std::string>& names) {
  std::ostringstream os;
  for (const auto& name : names) os << " | " << display_name(name) << " " << e.value(name);
  return os.str();
}

}  // namespace

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
    int64_t elements = 0, buckets = 0;
    for (const auto& b : I.buffers) elements += b.grads->main_grad().numel(), buckets += static_cast<int64_t>(b.grads->buckets().size());
    const bool overlap = !I.buffers.empty() && I.buffers.front().grads->options().overlap_grad_reduce;
    LF_INFO("gradients: ", I.buffers.size(), " group(s), ", buckets, " bucket(s) in fp32 buffers of ", elements,
            " elements, reduction ", overlap ? "overlapped with backward" : "after backward", " | ",
            I.optimizer->name(), " state ", I.optimizer->state_bytes() / 1048576.0, " MiB on this rank",
            I.job.optimizer.use_distributed_optimizer ? " (ZeRO-1, sharded over data-parallel ranks)" : "",
            I.scaler.dynamic() ? " | dynamic loss scale from " + std::to_string(I.scaler.scale()) : "",
            I.deterministic ? " | deterministic mode" : "");
  }
  const auto names = I.model.eval_metrics();
  TrainSummary summary;
  summary.start_iteration = I.checkpoints->load(*I.train_data);
  summary.iterations = summary.start_iteration;
  summary.first_eval = evaluate();
  if (rank0 && summary.first_eval.ran) LF_INFO("validation before training", metrics_text(summary.first_eval, names));
  auto log_eval = [&](const EvalResult& e, int64_t it) {
    if (!I.tensorboard || !e.ran) return;
    for (const auto& [name, m] : e.metrics) I.tensorboard->add_scalar(name + " validation", e.value(name), it);
    I.tensorboard->flush();
  };
  log_eval(summary.first_eval, summary.start_iteration);
  if (log.profile) {
    LF_CHECK(log.profile_step_start < log.profile_step_end, "logging.profile_step_start (", log.profile_step_start,
             ") must be below logging.profile_step_end (", log.profile_step_end, ")",
             lf::hint("profile iterations [start, end): e.g. --profile-step-start 3 --profile-step-end 4"));
    LF_CHECK(log.profile_step_start > summary.start_iteration && log.profile_step_end <= t.train_iters + 1,
             "--profile covers iterations [", log.profile_step_start, ", ", log.profile_step_end,
             ") but this run trains iterations ", summary.start_iteration + 1, "..", t.train_iters,
             lf::hint("set --profile-step-start / --profile-step-end inside the run, or raise --train-iters"));
  }
  StepProfiler profiler;
  const bool profiles = log.profile && rank0;
  const auto start = std::chrono::steady_clock::now();
  auto window_start = start;
  int64_t window_iters = 0;
  for (int64_t it = summary.start_iteration + 1; it <= t.train_iters; ++it) {
    if (profiles && it == log.profile_step_start) profiler.start();
    const double loss = [&] {
      RECORD_USER_SCOPE("lf::forward_backward");
      return I.forward_backward();
    }();
    // Delayed FP8 scaling: this step's amaxes (reduced over each group's ranks) into the histories,
    // the next step's scales from them.
    if (I.fp8_delayed) I.fp8_delayed->update();
    const bool skip = t.skip_nonfinite_steps;
    // Megatron's scheduler is stepped after each successful update: this update uses the value
    // at the updates completed so far.
    const double lr = I.schedule.lr(I.optimizer->steps_taken());
    const double loss_scale = I.scaler.scale();
    double grad_norm = 0;
    bool skipped = false;
    if (!std::isfinite(loss)) {
      // Every rank sees the same (DP-reduced) loss, so all take the same branch.
      LF_CHECK(skip, "loss is ", loss, " at iteration ", it,
               lf::hint("lower --lr or check the data; the run stops here (set "
                        "training.skip_nonfinite_steps=true to skip such steps instead)"));
      if (rank0) LF_WARN("iteration ", it, ": loss is ", loss, "; step skipped");
      grad_norm = loss;
      skipped = true;
    } else {
      RECORD_USER_SCOPE("lf::optimizer");
      auto step = I.optimizer->step(lr, /*skip_nonfinite=*/true, 1.0 / loss_scale);
      grad_norm = step.grad_norm;
      skipped = step.skipped;
      if (I.scaler.dynamic()) {
        I.scaler.update(step.skipped);
        if (step.skipped && rank0)
          LF_WARN("iteration ", it, ": gradients overflowed at loss scale ", loss_scale, "; step skipped, loss scale now ",
                  I.scaler.scale());
      } else {
        LF_CHECK(!step.skipped || skip || I.scaler.active(), "gradient norm is ", step.grad_norm, " at iteration ", it,
                 lf::hint("lower --lr, enable --clip-grad, or check the data for corrupt tokens "
                          "(training.skip_nonfinite_steps=true skips such steps)"));
        if (step.skipped && rank0) LF_WARN("iteration ", it, ": gradient norm is ", step.grad_norm, "; step skipped");
      }
    }
    if (skipped) ++summary.skipped_iterations;
    else I.update_ema();
    {
      RECORD_USER_SCOPE("lf::grad_zero");
      for (auto& b : I.buffers) b.grads->zero_grad();
    }
    if (profiles && it + 1 == log.profile_step_end) {
      auto report = profiler.stop(log.profile_step_end - log.profile_step_start, log.profile_trace.value_or(""));
      for (const auto& line : report.lines()) LF_INFO(line);
      if (log.profile_trace) LF_INFO("profile | Chrome trace written to ", *log.profile_trace);
    }
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
      const double pnorm = log.log_params_norm ? I.params_norm() : 0.0;  // collective: every rank
      if (rank0) {
        const double tflops = I.model.flops_per_sample(t.seq_length) * tps / static_cast<double>(t.seq_length) /
                              std::max(1, I.ctx.world_size()) / 1e12;
        std::ostringstream line;
        line << std::setprecision(4) << "iteration " << it << "/" << t.train_iters << " | consumed samples "
             << it * global_batch << " | loss " << loss;
        if (I.last_terms.size() > 1)
          for (const auto& [name, v] : I.last_terms) line << " | " << name << " " << v;
        if (I.last_expert_load >= 0) line << " | expert load max/mean " << I.last_expert_load;
        line << " | lr " << lr << " | grad norm " << grad_norm;
        if (I.scaler.active()) line << " | loss scale " << loss_scale;
        if (skipped) line << " | skipped";
        if (log.log_params_norm) line << " | params norm " << pnorm;
        line << " | tokens/s " << std::setprecision(6) << tps;
        if (log.log_throughput) line << " | TFLOP/s per rank " << std::setprecision(3) << tflops;
        // Peak of live tensor bytes on this rank since the start (the backend's allocator).
        const auto mem = I.backend.memory_stats();
        const double peak_mib = static_cast<double>(mem.peak_allocated_bytes) / (1 << 20);
        if (mem.supported) line << " | peak memory " << std::setprecision(5) << peak_mib << " MiB";
        line << " | ETA " << std::setprecision(3) << eta << " s";
        LF_INFO(line.str());
        if (metrics.is_open()) {
          // JSON has no NaN or Inf: a non-finite value (a skipped step's norm) is null.
          auto num = [](double v) { std::ostringstream o; o << std::setprecision(10); if (std::isfinite(v)) o << v; else o << "null"; return o.str(); };
          metrics << std::setprecision(10) << "{\"iteration\": " << it << ", \"loss\": " << num(loss)
                  << ", \"grad_norm\": " << num(grad_norm) << ", \"lr\": " << lr << ", \"tokens_per_sec\": " << tps
                  << ", \"consumed_samples\": " << it * global_batch;
          if (I.last_terms.size() > 1)
            for (const auto& [name, v] : I.last_terms) metrics << ", \"" << name << "\": " << v;
          if (I.last_expert_load >= 0) metrics << ", \"expert_load_max_over_mean\": " << I.last_expert_load;
          if (I.scaler.active()) metrics << ", \"loss_scale\": " << loss_scale;
          if (skipped) metrics << ", \"skipped\": true";
          if (log.log_params_norm) metrics << ", \"params_norm\": " << pnorm;
          if (log.log_throughput) metrics << ", \"tflops_per_rank\": " << tflops;
          if (mem.supported) metrics << ", \"peak_memory_mib\": " << peak_mib;
          metrics << "}\n";
          metrics.flush();
        }
        if (I.tensorboard) {
          auto& tb = *I.tensorboard;
          for (const auto& [name, v] : I.last_terms) tb.add_scalar(name, v, it);
          if (I.last_terms.size() > 1) tb.add_scalar("loss", loss, it);
          if (I.last_expert_load >= 0) tb.add_scalar("expert-load-max-over-mean", I.last_expert_load, it);
          tb.add_scalar("learning-rate", lr, it);
          tb.add_scalar("grad-norm", grad_norm, it);
          tb.add_scalar("tokens-per-sec", tps, it);
          if (I.scaler.active()) tb.add_scalar("loss-scale", loss_scale, it);
          if (log.log_params_norm) tb.add_scalar("params-norm", pnorm, it);
          if (log.log_throughput) tb.add_scalar("throughput", tflops, it);
          if (mem.supported) tb.add_scalar("mem-max-allocated-bytes", static_cast<double>(mem.peak_allocated_bytes), it);
          tb.flush();
        }
      }
    }
    if (t.eval_interval > 0 && it % t.eval_interval == 0 && it != t.train_iters) {
      auto e = evaluate();
      if (rank0 && e.ran) LF_INFO("validation at iteration ", it, metrics_text(e, names));
      log_eval(e, it);
    }
    if (I.checkpoints->after_step(it)) {
      summary.preempted = true;
      break;
    }
    if (t.exit_interval && it % *t.exit_interval == 0) {
      if (rank0) LF_INFO("exiting at iteration ", it, " (exit_interval ", *t.exit_interval, ")");
      break;
    }
    if (t.exit_duration_in_mins) {
      // Every rank must take the same decision, or the ones that continue would hang.
      double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 60.0;
      auto flag = at::full({1}, minutes > *t.exit_duration_in_mins ? 1.0 : 0.0,
                           at::TensorOptions().dtype(at::kDouble).device(I.backend.device()));
      if (I.ctx.world_size() > 1) I.ctx.world().all_reduce(flag, lf::backend::ReduceOp::max);
      if (flag.item<double>() > 0) {
        if (rank0) LF_INFO("exiting at iteration ", it, " (exit_duration_in_mins)");
        break;
      }
    }
  }
  I.checkpoints->finish(summary.iterations);
  if (I.trace && !I.trace->steps.empty()) {
    // Each stage writes its timeline; the bubble is averaged over the stages.
    const std::string path = *I.job.parallel.pipeline_trace + ".stage" + std::to_string(I.ctx.pp_rank()) + ".json";
    if (I.ctx.tp_rank() == 0 && I.ctx.dp_rank() == 0) I.trace->write_chrome_trace(path, I.ctx.pp_rank());
    auto bubble = at::full({1}, I.trace->bubble_fraction(), at::TensorOptions().dtype(at::kDouble).device(I.backend.device()));
    I.ctx.pp().all_reduce(bubble, lf::backend::ReduceOp::avg);
    // The ideal of equal stages: 1F1B (p - 1) / (m + p - 1); interleaved (p - 1) / (v m + p - 1);
    // ChunkPipe, whose sequences of n chunks pass forward then backward, (p - 1) / (n + p - 1).
    const double p = I.ctx.pp_size(), m = static_cast<double>(I.micro_batches);
    const double v = static_cast<double>(I.model.num_model_chunks());
    std::ostringstream ideal;
    if (const auto c = I.job.parallel.chunkpipe_chunk_size) {
      const double n = static_cast<double>(t.seq_length / *c);
      ideal << "ChunkPipe ideal (p - 1) / (n + p - 1) = " << (p - 1) / (n + p - 1) << " for p " << p << ", n " << n
            << " chunks";
    } else if (v > 1) {
      ideal << "interleaved ideal (p - 1) / (v m + p - 1) = " << (p - 1) / (v * m + p - 1) << " for p " << p << ", v "
            << v << ", m " << m;
    } else {
      ideal << "1F1B ideal (p - 1) / (m + p - 1) = " << (p - 1) / (m + p - 1) << " for p " << p << ", m " << m;
    }
    if (rank0)
      LF_INFO("pipeline bubble: ", bubble.item<double>(), " of each step (", ideal.str(), ") | trace: ",
              *I.job.parallel.pipeline_trace, ".stage<k>.json");
  }
  summary.last_eval = evaluate();
  if (rank0 && summary.last_eval.ran) LF_INFO("validation after training", metrics_text(summary.last_eval, names));
  log_eval(summary.last_eval, summary.iterations);
  return summary;
}

}  // namespace lf::train

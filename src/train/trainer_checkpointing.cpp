#include "trainer_checkpointing.h"

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/train/checkpoint_format.h"

namespace lf::train {

TrainerCheckpointing::TrainerCheckpointing(const lf::config::JobConfig& job, lf::models::Model& model,
                                           const lf::dist::ParallelContext& ctx,
                                           const lf::backend::DeviceBackend& backend,
                                           std::vector<CheckpointGroup> groups, Optimizer& optimizer,
                                           LossScaler& scaler, const LrSchedule& schedule, int64_t global_batch,
                                           TrainerHooks hooks)
    : job_(job), model_(model), ctx_(ctx), backend_(backend), groups_(std::move(groups)), optimizer_(optimizer),
      scaler_(scaler), schedule_(schedule), global_batch_(global_batch), hooks_(std::move(hooks)) {}

TrainerCheckpointing::~TrainerCheckpointing() = default;

int64_t TrainerCheckpointing::load(BatchSource& train_data) {
  const auto& c = job_.checkpoint;
  const bool rank0 = ctx_.global_rank() == 0;
  if (!c.load) return 0;
  LoadOptions o;
  o.load_optimizer = !c.no_load_optim;
  o.load_rng = !c.no_load_rng;
  o.finetune = c.finetune;
  auto r = load_checkpoint(*c.load, o, groups_, optimizer_, ctx_, backend_, model_.rng_state());
  if (!r) {
    // Megatron: no tracker file means a fresh start, unless --exit-on-missing-checkpoint.
    LF_CHECK(!c.exit_on_missing_checkpoint, "--load ", *c.load, " holds no checkpoint (no ", ckpt::kTrackerFile,
             ") and --exit-on-missing-checkpoint is set",
             lf::hint("check the path, or drop --exit-on-missing-checkpoint to start from scratch"));
    if (rank0) LF_WARN("--load ", *c.load, " holds no checkpoint; training starts from scratch");
    return 0;
  }
  if (!r->rng.empty()) model_.set_rng_state(r->rng);
  if (r->loss_scaler) scaler_.set_state(*r->loss_scaler);
  start_iteration_ = r->progress.iteration;
  start_consumed_ = r->progress.consumed_samples;
  last_saved_ = start_iteration_;
  if (start_consumed_ > 0 && !train_data.seek(start_consumed_)) {
    // A source without seek: skip whole micro-batches (same order as an uninterrupted run).
    const int64_t per_micro = job_.training.micro_batch_size * ctx_.dp_size();
    for (int64_t i = 0; i < start_consumed_ / per_micro; ++i) train_data.next();
  }
  if (rank0)
    LF_INFO("loaded checkpoint ", r->dir, " | iteration ", start_iteration_, " | consumed samples ", start_consumed_,
            c.finetune ? " | finetune: weights only" : "",
            r->optimizer_loaded ? " | optimizer state" : " | fresh optimizer state", r->rng_loaded ? " | RNG states" : "");
  return start_iteration_;
}

void TrainerCheckpointing::ensure_saver() {
  const auto& c = job_.checkpoint;
  if (!saver_) {
    SaveOptions o;
    o.save_dir = *c.save;
    o.save_optimizer = !c.no_save_optim;
    o.save_rng = !c.no_save_rng;
    o.keep_last = c.ckpt_keep_last;
    o.async = c.async_save;
    o.config_yaml = config_yaml_;
    o.global_batch_size = global_batch_;
    o.seq_length = job_.training.seq_length;
    o.hooks = hooks_.save;
    saver_ = std::make_unique<CheckpointSaver>(o, ctx_, backend_);
  }
}

void TrainerCheckpointing::save(int64_t it) {
  const auto& c = job_.checkpoint;
  ensure_saver();
  TrainingProgress p;
  p.iteration = it;
  p.consumed_samples = start_consumed_ + (it - start_iteration_) * global_batch_;
  p.optimizer_steps = optimizer_.steps_taken();
  p.lr = schedule_.lr(optimizer_.steps_taken());
  saver_->save(p, groups_, c.no_save_optim ? nullptr : &optimizer_, model_.rng_state(), &scaler_);
  last_saved_ = it;
}

bool TrainerCheckpointing::after_step(int64_t it) {
  if (hooks_.after_iteration) hooks_.after_iteration(it, ctx_.global_rank());
  const auto& c = job_.checkpoint;
  if (c.save && c.save_interval && it % *c.save_interval == 0) save(it);
  bool stop = false;
  if (c.save) {
    ensure_saver();
    stop = saver_->step_end(sigterm_received());
    if (stop) {
      if (ctx_.global_rank() == 0) LF_INFO("SIGTERM: saving at iteration ", it, " and exiting");
      if (last_saved_ != it) save(it);
      saver_->finish();
      preempted_ = true;
    }
  }
  return stop;
}

void TrainerCheckpointing::finish(int64_t it) {
  if (job_.checkpoint.save && last_saved_ != it && it > 0) save(it);
  if (saver_) saver_->finish();
}

}  // namespace lf::train

#include "trainer_checkpointing.h"

#include "loongforge/backend/fp8_delayed.h"
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

namespace {
std::vector<CheckpointGroup> select_groups(const std::vector<CheckpointGroup>& groups, bool base) {
  std::vector<CheckpointGroup> out;
  for (const auto& g : groups)
    if (g.from_base == base) out.push_back(g);
  return out;
}
}  // namespace

void TrainerCheckpointing::load_base(const std::string& dir) {
  const auto resolved = ckpt::resolve_checkpoint_dir(dir);
  LF_CHECK(resolved.has_value(), "base checkpoint ", dir, " holds no checkpoint (no ", ckpt::kTrackerFile, ")",
           lf::hint("pass the directory a training run or loongforge-convert hf2lf saved to"));
  LF_CHECK(!checkpoint_base(*resolved).has_value(), "base checkpoint ", *resolved,
           " is itself a LoRA checkpoint (adapters on another base)",
           lf::hint("resume it with --load, or merge it first: loongforge-convert lf2hf --merge-lora, then hf2lf"));
  LoadOptions o;
  o.finetune = true;  // weights only
  auto r = load_checkpoint(dir, o, select_groups(groups_, true), optimizer_, ctx_, backend_);
  LF_CHECK(r.has_value(), "base checkpoint ", dir, " holds no checkpoint");
  base_ = base_checkpoint_of(dir);
  if (ctx_.global_rank() == 0) LF_INFO("LoRA base weights from ", base_->dir, " (frozen)");
}

int64_t TrainerCheckpointing::load(BatchSource& train_data) {
  const auto& c = job_.checkpoint;
  const bool rank0 = ctx_.global_rank() == 0;
  bool adapters = false;
  for (const auto& g : groups_) adapters = adapters || g.from_base;
  const auto dir = c.load ? ckpt::resolve_checkpoint_dir(*c.load) : std::nullopt;
  const auto check_can_save = [&] {
    LF_CHECK(!adapters || !c.save || base_.has_value(),
             "LoRA checkpoints hold the adapters and name the base they were trained on, and this run has no base "
             "checkpoint (its base weights are the random initialisation)",
             lf::hint("pass --pretrained-checkpoint BASE (a checkpoint of the base model, e.g. from loongforge-convert "
                      "hf2lf), or drop --save"));
  };
  if (!dir) {
    if (c.pretrained_checkpoint) {
      // Megatron: the pretrained weights when --load holds nothing yet (the first launch).
      if (adapters) {
        load_base(*c.pretrained_checkpoint);
      } else {
        LoadOptions o;
        o.finetune = true;
        auto r = load_checkpoint(*c.pretrained_checkpoint, o, groups_, optimizer_, ctx_, backend_);
        LF_CHECK(r.has_value(), "--pretrained-checkpoint ", *c.pretrained_checkpoint, " holds no checkpoint",
                 lf::hint("pass the directory a training run or loongforge-convert hf2lf saved to"));
        if (rank0) LF_INFO("fine-tuning from ", r->dir, " (weights only; iteration 0, fresh optimizer)");
      }
      check_can_save();
      return 0;
    }
    check_can_save();
    if (!c.load) return 0;
    // Megatron: no tracker file means a fresh start, unless --exit-on-missing-checkpoint.
    LF_CHECK(!c.exit_on_missing_checkpoint, "--load ", *c.load, " holds no checkpoint (no ", ckpt::kTrackerFile,
             ") and --exit-on-missing-checkpoint is set",
             lf::hint("check the path, or drop --exit-on-missing-checkpoint to start from scratch"));
    if (rank0) LF_WARN("--load ", *c.load, " holds no checkpoint; training starts from scratch");
    return 0;
  }
  const auto base = adapters ? verified_checkpoint_base(*dir) : checkpoint_base(*dir);
  LF_CHECK(adapters || !base, "--load ", *dir, " holds LoRA adapters (trained on the base ", base ? base->dir : "",
           "), and this run has none",
           lf::hint("resume it with the LoRA settings it was trained with (--lora-rank, --lora-target-modules ...: see its "
                    "config.yaml), or export it with loongforge-convert lf2hf [--merge-lora]"));
  std::vector<CheckpointGroup> groups = groups_;
  if (adapters) {
    if (!base) {
      // A full checkpoint: the base of a new adapter run.
      LF_CHECK(c.finetune, "--load ", *dir, " is a full checkpoint without LoRA adapters",
               lf::hint("to train adapters on it pass --pretrained-checkpoint " + *c.load +
                        " (or --load it with --finetune)"));
      load_base(*dir);
      check_can_save();
      return 0;
    }
    if (c.pretrained_checkpoint) {
      const auto named = base_checkpoint_of(*c.pretrained_checkpoint);
      LF_CHECK(named.dir == base->dir, "the LoRA checkpoint ", *dir, " was trained on the base ", base->dir,
               ", and --pretrained-checkpoint names ", named.dir,
               lf::hint("resume on the base it was trained on, or start a new run in another --save directory"));
    }
    load_base(base->dir);
    groups = select_groups(groups_, false);
  }
  LoadOptions o;
  o.load_optimizer = !c.no_load_optim;
  o.load_rng = !c.no_load_rng;
  o.finetune = c.finetune;
  auto r = load_checkpoint(*dir, o, groups, optimizer_, ctx_, backend_, model_.rng_state());
  LF_CHECK(r.has_value(), "--load ", *dir, " holds no checkpoint");
  check_can_save();
  if (!r->rng.empty()) model_.set_rng_state(r->rng);
  if (r->loss_scaler) scaler_.set_state(*r->loss_scaler);
  // Delayed FP8 scaling: the scales and histories of every group (an adapter run's frozen base too;
  // not under --finetune, which loads weights only). Each rank warns for its own stage's tables.
  bool delayed = false;
  for (const auto& g : groups_) delayed = delayed || (g.fp8 != nullptr && !g.fp8->entries().empty());
  // A checkpoint with state for other weights only: the first step's update names this rank's new ones.
  if (delayed && !c.finetune && !load_fp8_scaling(r->dir, groups_))
    LF_WARN("checkpoint ", r->dir, " holds no delayed FP8 scaling state (saved without --fp8-recipe delayed): "
            "the FP8 scales start at 1, as in a new run");
  start_iteration_ = r->progress.iteration;
  start_consumed_ = r->progress.consumed_samples;
  // Step-keyed random streams continue from the iteration (RNG states may not have been loaded).
  model_.resume_at(start_iteration_);
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
    o.base = base_;
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

// The trainer's use of checkpoints (train/checkpoint.h) from the job config: --load with
// Megatron's semantics at the start, periodic/async saves, SIGTERM and the final save. Kept out
// of trainer.cpp so the loop shows only three calls. Internal to the train layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loongforge/train/checkpoint.h"
#include "loongforge/train/loss_scaler.h"
#include "loongforge/train/lr_schedule.h"
#include "loongforge/train/trainer.h"

namespace lf::train {

class TrainerCheckpointing {
 public:
  TrainerCheckpointing(const lf::config::JobConfig& job, lf::models::Model& model, const lf::dist::ParallelContext& ctx,
                       const lf::backend::DeviceBackend& backend, std::vector<CheckpointGroup> groups,
                       Optimizer& optimizer, LossScaler& scaler, const LrSchedule& schedule, int64_t global_batch,
                       TrainerHooks hooks);
  ~TrainerCheckpointing();
  void set_config_yaml(std::string yaml) { config_yaml_ = std::move(yaml); }
  // --load: restores the state and positions the train data; returns the last completed
  // iteration (0 for a fresh start or --finetune).
  int64_t load(BatchSource& train_data);
  // After iteration `it`: periodic save, a SIGTERM agreed by all ranks (save, then true: stop),
  // a finished background save committed, the test hook.
  bool after_step(int64_t it);
  // The end of training at iteration `it`: the final save (--save) and the wait for a pending
  // background save.
  void finish(int64_t it);
  bool preempted() const { return preempted_; }

 private:
  void ensure_saver();
  void save(int64_t it);
  // LoRA: the frozen base groups' weights from the checkpoint `dir` (recorded as the base).
  void load_base(const std::string& dir);

  const lf::config::JobConfig& job_;
  lf::models::Model& model_;
  const lf::dist::ParallelContext& ctx_;
  const lf::backend::DeviceBackend& backend_;
  std::vector<CheckpointGroup> groups_;
  Optimizer& optimizer_;
  LossScaler& scaler_;
  const LrSchedule& schedule_;
  int64_t global_batch_;
  TrainerHooks hooks_;
  std::string config_yaml_;
  std::unique_ptr<CheckpointSaver> saver_;
  int64_t start_iteration_ = 0, start_consumed_ = 0, last_saved_ = -1;
  bool preempted_ = false;
  std::optional<BaseCheckpoint> base_;  // LoRA runs: the base the adapters train on
};

}  // namespace lf::train

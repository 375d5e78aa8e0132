// Native checkpoints of a training job: SAVE/iter_NNNNNNN/ + SAVE/latest_checkpointed_iteration.txt,
// written atomically (temp dir, fsync, rename, tracker last), loadable under any other TP/DP layout
// (every tensor records its global shape and place), optionally written in the background. A
// model's parameter groups (one per component layout) each write their own files. Also the
// offline entry points (model-only checkpoints from full tensors, reading them back,
// resharding). Not the file format itself (train/checkpoint_format.h). See docs/checkpoints.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/parallel/data/grad_buffer.h"
#include "loongforge/parallel/sharding.h"
#include "loongforge/train/loss_scaler.h"
#include "loongforge/train/optimizer.h"

namespace lf::ops {
class Fp8AmaxTable;
}

namespace lf::train {

// One parameter group as checkpoints see it: its parameters (shards with their Sharding), the
// layout they follow (files are named by its TP/PP coordinates, written by its DP rank 0) and,
// when trainable, the optimizer buffer its state lives in.
struct CheckpointGroup {
  std::string name;  // "model": model_tp{t}_pp{p}.safetensors; others model_<name>_tp{t}_pp{p}...
  const std::vector<lf::parallel::Parameter>* params = nullptr;
  const lf::dist::ParallelContext* context = nullptr;
  int buffer = -1;  // index into Optimizer::buffers(); -1: frozen (weights only)
  bool from_base = false;  // an adapter run's frozen base: not saved (the checkpoint names its base)
  // EMA weights (--ema-decay), one fp32 tensor per parameter in params' order (null: none): saved
  // with the weights as pieces of kind "ema"; a checkpoint without them starts them from the weights.
  std::vector<at::Tensor>* ema = nullptr;
  // Delayed FP8 scaling (--fp8-recipe delayed): the group's scales and amax histories (null: none),
  // saved by the group's TP/DP/CP rank 0 of each pipeline stage into fp8_[<name>_]tp0_pp{p}
  // (also for an adapter run's frozen base; experts over EP: each EP rank's part, by the first TP
  // rank of it, into fp8_experts_tp{t}_pp{p}) and read back by load_fp8_scaling, by weight name.
  lf::ops::Fp8AmaxTable* fp8 = nullptr;
};

// Delayed FP8 scaling: every group's table (CheckpointGroup::fp8) from the iter_* directory
// `checkpoint_dir`, each weight's entry that the checkpoint holds (any TP/PP/DP layout: the values
// are the same on every rank of a stage); the others keep their state. A history of another
// length stops with an lf::Error naming the checkpoint and the flag. Returns whether the
// checkpoint holds delayed FP8 state for any weight; if so the tables expect theirs from it
// (Fp8AmaxTable::expect_state_from): the first step's update warns naming the weights that ran in
// FP8 without state in the checkpoint.
bool load_fp8_scaling(const std::string& checkpoint_dir, const std::vector<CheckpointGroup>& groups);

// The base checkpoint an adapter (LoRA) run trains on, recorded in its checkpoints' state.json:
// the base's iter_* directory and the CRC-32 of its manifest.json (which holds every file's CRC),
// so that a resume finds the same base or stops.
struct BaseCheckpoint {
  std::string dir;
  uint32_t manifest_crc32 = 0;
};
// The record of the checkpoint `load_dir` resolves to (a directory holding a manifest or a tracker).
// Throws naming the path when there is none.
BaseCheckpoint base_checkpoint_of(const std::string& load_dir);
// The base an adapter checkpoint names (nullopt: a full checkpoint).
std::optional<BaseCheckpoint> checkpoint_base(const std::string& checkpoint_dir);
// checkpoint_base, checked: the named base must still be readable and hold the weights it held
// (its manifest's CRC-32); otherwise an lf::Error naming both directories and what to do.
std::optional<BaseCheckpoint> verified_checkpoint_base(const std::string& checkpoint_dir);

// The scalar progress of a run that a checkpoint stores besides tensors.
struct TrainingProgress {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;  // over all DP ranks (data/sampler.h SamplerState)
  int64_t optimizer_steps = 0;   // AdamW steps taken (skipped non-finite steps do not count)
  double lr = 0;                 // the learning rate of `iteration` (informational)
};

// Points in a save where a test may stop the process (crash-safety tests). Production programs
// pass none; a test build of a program passes its own (tests/tools/fault_hooks.cpp).
struct SaveHooks {
  virtual ~SaveHooks() = default;
  // After each file, the manifest, the rename and the tracker of a save (`what` names it).
  virtual void at_save_point(const char* what) {}
};

struct SaveOptions {
  std::string save_dir;
  bool save_optimizer = true;
  bool save_rng = true;
  std::optional<int64_t> keep_last;  // keep the newest k iter_* directories (null: all)
  bool async = false;                // write in a background thread from a CPU copy
  std::string config_yaml;           // the resolved configuration, stored as config.yaml
  int64_t global_batch_size = 0, seq_length = 0;  // recorded in state.json
  SaveHooks* hooks = nullptr;                      // tests only
  std::optional<BaseCheckpoint> base;              // adapter runs: the base, into state.json
};

// Saves the checkpoints of one job. Every method is collective over the job's world (all ranks
// call it in the same order). Async: save() copies this rank's state to CPU and returns; the
// files are written by a thread; the commit (manifest, rename, tracker) happens in a later
// step_end(), save() or finish() once every rank has written its part. At most one save is in
// flight (a new save waits for the previous), so the extra memory is one CPU copy of this
// rank's share of the checkpoint.
class CheckpointSaver {
 public:
  CheckpointSaver(SaveOptions options, const lf::dist::ParallelContext& ctx,
                  const lf::backend::DeviceBackend& backend);
  ~CheckpointSaver();  // joins a pending writer thread (does not commit: call finish())
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // optimizer may be null (or options.save_optimizer false): model only. rng: the model's dropout
  // streams (possibly empty), saved with the backend generator of every rank. scaler: the loss
  // scale and its trackers (null: none).
  void save(const TrainingProgress& progress, const std::vector<CheckpointGroup>& groups, const Optimizer* optimizer,
            const std::map<std::string, at::Tensor>& rng = {}, const LossScaler* scaler = nullptr);
  // Once per iteration: commits a finished background save and returns whether any rank
  // asked to stop (`stop_requested`, e.g. SIGTERM), so that all ranks agree. One small
  // all-reduce; nothing when the world has one rank.
  bool step_end(bool stop_requested);
  // Waits for and commits a pending save (end of training).
  void finish();
  bool pending() const;
  int64_t last_committed() const { return last_committed_; }
  const SaveOptions& options() const { return options_; }

 private:
  struct Pending;
  void commit();

  SaveOptions options_;
  const lf::dist::ParallelContext& ctx_;
  const lf::backend::DeviceBackend& backend_;
  std::unique_ptr<Pending> pending_;
  int64_t last_committed_ = -1;
};

struct LoadOptions {
  bool load_optimizer = true;  // false: --no-load-optim (masters from the loaded weights, fresh moments)
  bool load_rng = true;        // false: --no-load-rng
  bool finetune = false;       // weights only; iteration, data position, optimizer, RNG start fresh
};

struct LoadResult {
  std::string dir;  // the iter_* directory loaded
  TrainingProgress progress;  // zero under finetune
  bool optimizer_loaded = false, rng_loaded = false;
  std::map<std::string, at::Tensor> rng;  // the model's dropout streams (when rng_loaded)
  std::optional<LossScaler::State> loss_scaler;
};

// Collective. Loads the checkpoint `load_dir` resolves to (ckpt::resolve_checkpoint_dir) into the
// groups' parameters (any TP layout), the optimizer state (any DP/ZeRO-1 layout) and this rank's
// RNG (only when the world layout equals the saved one; `rng_names`: the streams the model has,
// returned in LoadResult::rng). nullopt when load_dir holds no checkpoint. Call before training
// starts.
std::optional<LoadResult> load_checkpoint(const std::string& load_dir, const LoadOptions& options,
                                          const std::vector<CheckpointGroup>& groups, Optimizer& optimizer,
                                          const lf::dist::ParallelContext& ctx,
                                          const lf::backend::DeviceBackend& backend,
                                          const std::map<std::string, at::Tensor>& rng_names = {});

// --- offline (single process, CPU; tools/convert) ------------------------------------------

// Writes a model-only checkpoint (iteration `iteration`, no optimizer/RNG) from full, unsharded
// tensors, each cut for tp x pp by its Sharding in `shardings` (the model's own parameter records,
// e.g. lf::models::causal_lm_parameter_specs: a name missing there is an error), with the model
// config YAML text stored as the resolved config.
void write_model_checkpoint(const std::string& save_dir, int64_t iteration,
                            const std::vector<std::pair<std::string, at::Tensor>>& full_tensors,
                            const std::map<std::string, lf::parallel::Sharding>& shardings,
                            const std::string& config_yaml, int tp, int pp, SaveHooks* hooks = nullptr);

// Reads the model tensors of a checkpoint (latest iteration, or `iteration` >= 0), reassembled
// to full tensors, plus its stored config YAML. Embedding/output rows past the vocabulary are
// the zero padding of the layout that saved it.
struct FullModel {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::string config_yaml;
  int64_t iteration;
};
// ema: the EMA weights (pieces of kind "ema") where the checkpoint has them, the weights of the
// parameters it keeps no EMA of (frozen ones); an error when it has none at all.
FullModel read_model_checkpoint(const std::string& load_dir, int64_t iteration = -1, bool ema = false);

// Rewrites the checkpoint of load_dir (latest, or `iteration`) into save_dir split for tp x pp
// with optimizer state in dp shards: the same content (model, optimizer, progress, config);
// RNG states are kept only when the layout is unchanged. Any layout loads any checkpoint, so
// this is for tools that want files per rank of the target layout.
void reshard_checkpoint(const std::string& load_dir, const std::string& save_dir, int tp, int pp,
                        int dp, int64_t iteration = -1);

// --- preemption -------------------------------------------------------------------------------

// SIGTERM sets a flag (and nothing else) that sigterm_received() reads; the trainer finishes its
// step, saves and exits 0.
void install_sigterm_handler();
bool sigterm_received();



}  // namespace lf::train

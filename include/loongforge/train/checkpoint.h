// Native checkpoints of a training job: SAVE/iter_NNNNNNN/ + SAVE/latest_checkpointed_iteration.txt,
// written atomically (temp dir, fsync, rename, tracker last), loadable under any other TP/DP layout
// (every tensor records its global shape and place), optionally written in the background. Also
// the offline entry points (model-only checkpoints from full tensors, reading them back,
// resharding). Not the file format itself (train/checkpoint_format.h). See docs/checkpoints.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loongforge/backend/device_backend.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/train/grad_buffer.h"
#include "loongforge/train/optimizer.h"

namespace lf::parallel {
class RngTracker;
}

namespace lf::train {

// The scalar progress of a run that a checkpoint stores besides tensors.
struct TrainingProgress {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;  // over all DP ranks (data/sampler.h SamplerState)
  int64_t optimizer_steps = 0;   // AdamW steps taken (skipped non-finite steps do not count)
  double lr = 0;                 // the learning rate of `iteration` (informational)
};

struct SaveOptions {
  std::string save_dir;
  bool save_optimizer = true;
  bool save_rng = true;
  std::optional<int64_t> keep_last;  // keep the newest k iter_* directories (null: all)
  bool async = false;                // write in a background thread from a CPU copy
  std::string config_yaml;           // the resolved configuration, stored as config.yaml
  int64_t global_batch_size = 0, seq_length = 0;  // recorded in state.json
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
  // streams (may be null), saved with the backend generator of every rank.
  void save(const TrainingProgress& progress, const GradBuffer& grads, const AdamW* optimizer,
            const lf::parallel::RngTracker* rng = nullptr);
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
};

// Collective. Loads the checkpoint `load_dir` resolves to (ckpt::resolve_checkpoint_dir) into the
// model parameters (grads.parameters(), any TP layout), the optimizer state (any DP/ZeRO-1
// layout) and this rank's RNG (only when the world layout equals the saved one). nullopt when
// load_dir holds no checkpoint. Call before training starts.
std::optional<LoadResult> load_checkpoint(const std::string& load_dir, const LoadOptions& options,
                                          GradBuffer& grads, AdamW& optimizer,
                                          const lf::dist::ParallelContext& ctx,
                                          const lf::backend::DeviceBackend& backend,
                                          lf::parallel::RngTracker* rng = nullptr);

// --- offline (single process, CPU; tools/convert) ------------------------------------------

// Writes a model-only checkpoint (iteration `iteration`, no optimizer/RNG) from full, unsharded
// tensors named as the single-device Decoder names them, sharded for tp x pp, with the model
// config YAML text stored as the resolved config.
void write_model_checkpoint(const std::string& save_dir, int64_t iteration,
                            const std::vector<std::pair<std::string, at::Tensor>>& full_tensors,
                            const std::string& config_yaml, int tp, int pp);

// Reads the model tensors of a checkpoint (latest iteration, or `iteration` >= 0), reassembled
// to full tensors, plus its stored config YAML. Embedding/output rows past the vocabulary are
// the zero padding of the layout that saved it.
struct FullModel {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::string config_yaml;
  int64_t iteration;
};
FullModel read_model_checkpoint(const std::string& load_dir, int64_t iteration = -1);

// Rewrites the checkpoint of load_dir (latest, or `iteration`) into save_dir split for tp x pp
// with optimizer state in dp shards: the same content (model, optimizer, progress, config);
// RNG states are kept only when the layout is unchanged. Any layout loads any checkpoint, so
// this is for tools that want files per rank of the target layout.
void reshard_checkpoint(const std::string& load_dir, const std::string& save_dir, int tp, int pp,
                        int dp, int64_t iteration = -1);

// How a full tensor named as the Decoder names it is split over TP (dim, blocks); `fc1_blocks`
// is 2 for a SwiGLU fc1 ([gate; up]).
std::pair<int64_t, int64_t> tp_split_of(const std::string& name, int64_t fc1_blocks);

// --- preemption and test hooks ---------------------------------------------------------------

// SIGTERM sets a flag (and nothing else) that sigterm_received() reads; the trainer finishes its
// step, saves and exits 0.
void install_sigterm_handler();
bool sigterm_received();

// Test-only fault injection: LOONGFORGE_TEST_KILL_AT=RANK:ITERATION makes global rank RANK kill
// itself (SIGKILL) after iteration ITERATION, on the first attempt only (LOONGFORGE_RESTART_COUNT
// unset or 0). LOONGFORGE_TEST_SIGTERM_AT=RANK:ITERATION sends that rank SIGTERM instead.
void maybe_inject_test_fault(int64_t iteration, int global_rank);

}  // namespace lf::train

// The trainer's state and its step functions (trainer.cpp: the loop and logging; trainer_steps.cpp:
// one step's forward/backward under each schedule, and evaluation). Internal to the train layer.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/backend/fp8.h"
#include "loongforge/backend/fp8_delayed.h"
#include "loongforge/parallel/pipeline/p2p.h"
#include "loongforge/parallel/pipeline/schedules.h"
#include "loongforge/train/loss_scaler.h"
#include "loongforge/train/lr_schedule.h"
#include "loongforge/train/optimizer.h"
#include "loongforge/train/tensorboard.h"
#include "loongforge/train/trainer.h"
#include "trainer_checkpointing.h"

namespace lf::train {

// One parameter group's gradient machinery (trainable groups only).
struct GroupBuffer {
  std::string name;
  const lf::dist::ParallelContext* context = nullptr;
  std::unique_ptr<GradBuffer> grads;
};

// Gradient-accumulation fusion (models/model.h): during a training step's forward/backward, a
// parameter's slot in its group's gradient buffer, scaled by the step's weight of the loss term.
class BufferGradientSink final : public lf::models::GradientSink {
 public:
  explicit BufferGradientSink(const std::vector<GroupBuffer>& buffers) : buffers_(buffers) {}
  // The step's loss weights while its forward/backward runs; null between steps (no destination).
  void set_weights(const std::map<std::string, double>* w) { weights_ = w; }
  std::optional<lf::backend::GradInto> take(const at::Tensor& param, const std::string& loss_term) const override;
  std::optional<lf::backend::GradInto> weight_grad_slot(const at::Tensor& param) const override;

 private:
  const std::vector<GroupBuffer>& buffers_;
  const std::map<std::string, double>* weights_ = nullptr;
};

struct Trainer::Impl {
  Impl(const lf::config::JobConfig& job, lf::models::Model& model, const lf::dist::ParallelContext& ctx,
       const lf::backend::DeviceBackend& backend, std::unique_ptr<BatchSource> train_data,
       std::unique_ptr<BatchSource> valid_data, TrainerHooks hooks);
  ~Impl() {
    if (sink) model.set_gradient_sink(nullptr);  // the model outlives the trainer
    if (trace) model.set_trace(nullptr);
    if (pair_micro_batches) model.set_streams(nullptr);
    if (fp8) model.set_fp8(nullptr);
  }

  const lf::config::JobConfig& job;
  lf::models::Model& model;
  const lf::dist::ParallelContext& ctx;
  const lf::backend::DeviceBackend& backend;
  std::unique_ptr<BatchSource> train_data, valid_data;
  bool deterministic;
  std::vector<lf::models::ParameterGroup> groups;  // the model's, kept alive for the buffers
  std::vector<GroupBuffer> buffers;
  // --ema-decay: per trainable group, the EMA of each parameter (fp32, its shard), and the groups'
  // indices into `groups`.
  std::vector<std::vector<at::Tensor>> ema;
  std::vector<size_t> ema_groups;
  void update_ema();
  std::unique_ptr<BufferGradientSink> sink;  // --gradient-accumulation-fusion (the default)
  std::unique_ptr<lf::ops::Fp8Policy> fp8;   // --fp8-format (and --fp8-policy)
  // --fp8-recipe delayed: the scales and amax histories, one table per parameter group, updated
  // after each step's forward/backward.
  std::unique_ptr<lf::ops::Fp8DelayedScaling> fp8_delayed;
  std::unique_ptr<Optimizer> optimizer;
  LrSchedule schedule;
  LossScaler scaler;
  int64_t micro_batches;
  std::unique_ptr<TrainerCheckpointing> checkpoints;
  // Pipeline parallelism (pp > 1): activations and gradients to and from the adjacent stages.
  std::unique_ptr<lf::parallel::pipeline::StageExchange> exchange;
  std::unique_ptr<lf::parallel::pipeline::ScheduleTrace> trace;  // --pipeline-trace
  std::unique_ptr<TensorBoardWriter> tensorboard;                // --tensorboard-dir, rank 0
  // The MoE overlap across micro-batches (--overlap-moe-expert-parallel-comm, where the model's
  // plan pairs them): the forward of one micro-batch and the backward of another as two streams
  // taking turns at the all-to-alls.
  lf::StreamPair streams;
  bool pair_micro_batches = false;
  bool pairing_logged = false;
  int64_t pairs_run = 0;
  // Runs forward on this thread and backward as the other stream of `streams`.
  void run_pair(const std::function<void()>& forward, const std::function<void()>& backward);
  // After the first step with pairs: how many ran and how often the streams switched.
  void log_pairing();

  // The loss of the last step per term (normalised over the global batch), in term order.
  std::vector<std::pair<std::string, double>> last_terms;
  // MoE: the last step's expert load, max / mean tokens per expert averaged over the MoE layers
  // (global batch); negative when the model has none.
  double last_expert_load = -1;
  // When the current step's forward/backward began (after its loss-count reduction): the compute
  // time reported to the train source (BatchSource::report_compute_seconds).
  std::chrono::steady_clock::time_point compute_start;

  lf::backend::Communicator* dp() const { return ctx.dp_size() > 1 ? &ctx.dp() : nullptr; }
  // Ranks whose loss and metric sums add up to the global batch's: dp, and dp x cp under context
  // parallelism (each CP rank sums its own tokens; the loss counts are whole micro-batches' over dp).
  lf::backend::Communicator* dp_cp() const {
    if (ctx.dp_size() * ctx.cp_size() == 1) return nullptr;
    return ctx.cp_size() > 1 ? &ctx.dp_cp() : &ctx.dp();
  }
  std::vector<GradBuffer*> grad_list() const;
  void begin_micro_batch(bool last);
  // The step's micro-batches (every stage reads all of them, keeping the data streams in step).
  std::vector<lf::data::Batch> read_step();
  // 1 / (units of each term over the global batch) x the loss scale.
  std::map<std::string, double> loss_weights(const std::vector<lf::data::Batch>& batches) const;
  // Each loss term's detached sum over the step's micro-batches, kept on the device: a micro-batch
  // reads nothing back to the host (no synchronisation between micro-batches); finish_step reads
  // them once.
  using TermSums = std::map<std::string, at::Tensor>;
  // Sum of w_t * term_t (the scalar to backpropagate); adds the detached sums to `sums`.
  at::Tensor objective(const std::vector<lf::models::LossTerm>& terms, const std::map<std::string, double>& weights,
                       TermSums& sums) const;

  // One forward/backward over the step, gradients reduced; returns the step's total loss.
  double forward_backward();
  // pp 1, the MoE overlap across micro-batches: forward 0, then forward m + 1 paired with
  // backward m, then the last backward.
  void forward_backward_paired(const std::vector<lf::data::Batch>& batches,
                               const std::map<std::string, double>& weights, TermSums& sums);
  double forward_backward_pipelined(const std::vector<lf::data::Batch>& batches,
                                    const std::map<std::string, double>& weights, TermSums& sums);
  double forward_backward_chunkpipe(const std::vector<lf::data::Batch>& batches,
                                    const std::map<std::string, double>& weights, TermSums& sums);
  // The tied embedding's gradient sum, every buffer's reduction, the term sums reduced to every
  // rank: the step's loss per term.
  double finish_step(TermSums& sums, const std::map<std::string, double>& weights);

  // Evaluation: one micro-batch's metrics on this rank (the last stage's; zeros elsewhere).
  void evaluate_batch(const lf::data::Batch& batch, int64_t index, int64_t iters, lf::models::Metrics& out);

  // Parameter L2 norm over every group, each element counted once (--log-params-norm).
  double params_norm() const;
};

}  // namespace lf::train

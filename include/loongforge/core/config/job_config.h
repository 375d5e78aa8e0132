// The training job's configuration: typed sections (parallel, training, optimizer, data,
// checkpoint, logging) with Megatron's names and defaults, plus `model` kept as a Node for the
// model builders to validate with their own field lists. load_job() runs the whole pipeline
// (compose, overrides, interpolation, schema, cross-field checks). Checks that need the world
// size (divisibility by TP*PP*..., data-parallel size) belong to dist/, not here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loongforge/core/config/compose.h"
#include "loongforge/core/config/node.h"
#include "loongforge/core/config/schema.h"

namespace lf::config {

struct ParallelConfig {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  bool sequence_parallel = false;
  int64_t context_parallel_size = 1;
  std::string cp_comm_type = "p2p";  // context parallelism: p2p (ring attention) or a2a (Ulysses)
  int64_t expert_model_parallel_size = 1;
  std::optional<int64_t> expert_tensor_parallel_size;  // null: same as tensor_model_parallel_size
  std::string moe_token_dispatcher_type = "allgather";  // how tokens reach the expert-parallel ranks
  std::optional<int64_t> num_layers_per_virtual_pipeline_stage;
  std::optional<int64_t> decoder_first_pipeline_num_layers;  // null: even split
  std::optional<int64_t> decoder_last_pipeline_num_layers;   // null: even split
  std::optional<std::string> pipeline_model_parallel_layout;  // Megatron's layout string
  std::string order = "tp-cp-ep-dp-pp";
  int64_t distributed_timeout_minutes = 10;
  std::string distributed_backend = "auto";
  bool overlap_grad_reduce = false;
  bool overlap_moe_expert_parallel_comm = false;
  std::optional<int64_t> moe_overlap_num_chunks;  // null: 1 with pairs of micro-batches, else 2
  bool delay_wgrad_compute = false;
  bool moe_overlap_micro_batches = true;
  bool overlap_param_gather = false;
  bool enable_encoder_hetero_dp = false;
  bool enable_full_hetero_dp = false;
  bool use_vit_dp_balance = false;
  std::optional<int64_t> ddp_bucket_size;  // null: 40M elements
  std::optional<std::string> pipeline_trace;
  std::optional<int64_t> chunkpipe_chunk_size;  // null: whole sequences

  template <class V>
  void visit(V& v) {
    v("tensor_model_parallel_size", tensor_model_parallel_size, "Tensor model parallel size", Min{1});
    v("pipeline_model_parallel_size", pipeline_model_parallel_size, "Pipeline model parallel size", Min{1});
    v("sequence_parallel", sequence_parallel, "Sequence parallelism in the tensor-parallel regions");
    v("context_parallel_size", context_parallel_size,
      "Context parallel size: each sample's sequence split over this many ranks (2 x cp load-balanced chunks)",
      Min{1});
    v("cp_comm_type", cp_comm_type,
      "How context-parallel attention sees the whole sequence: p2p passes keys/values around a ring (ring "
      "attention, the transfer overlapped with the block computation), a2a exchanges heads for sequence "
      "(Ulysses all-to-all; the heads per tensor-parallel rank must divide by cp)",
      OneOf{{"p2p", "a2a"}});
    v("expert_model_parallel_size", expert_model_parallel_size, "Expert model parallel size", Min{1});
    v("expert_tensor_parallel_size", expert_tensor_parallel_size,
      "Tensor parallel size of the experts: null splits them over the tensor-parallel group like the dense MLP "
      "(with expert parallelism too: each expert-parallel rank's experts split over tp); "
      "1 keeps every expert whole on one rank (expert parallelism may then span the tensor-parallel ranks; "
      "needs --sequence-parallel when tp > 1)",
      Min{1});
    v("moe_token_dispatcher_type", moe_token_dispatcher_type,
      "How tokens reach the expert-parallel ranks holding their experts (with expert parallelism or expert TP 1): "
      "alltoall sends each token only where it is routed (uneven splits), allgather gathers every token on every "
      "rank of the expert-parallel group and reduce-scatters the results",
      OneOf{{"alltoall", "allgather"}});
    v("num_layers_per_virtual_pipeline_stage", num_layers_per_virtual_pipeline_stage,
      "Layers per virtual pipeline stage (interleaved schedule)", Min{1});
    v("decoder_first_pipeline_num_layers", decoder_first_pipeline_num_layers,
      "Layers on the first pipeline stage (null: even split); the other stages split the rest evenly",
      Min{1});
    v("decoder_last_pipeline_num_layers", decoder_last_pipeline_num_layers,
      "Layers on the last pipeline stage (null: even split); the other stages split the rest evenly",
      Min{1});
    v("pipeline_model_parallel_layout", pipeline_model_parallel_layout,
      "Stages as a layout string, e.g. Et*3|t*4|t*4|t*3L: E embedding, t decoder layer, L loss, | between "
      "stages, x*N and (...)*N repeat; pp x v stages give v model chunks per rank (interleaved)");
    v("order", order, "Rank order of the parallel axes, fastest first (a permutation of tp-cp-ep-dp-pp)");
    v("distributed_timeout_minutes", distributed_timeout_minutes,
      "Timeout of collectives and rendezvous, in minutes", Min{1});
    v("distributed_backend", distributed_backend,
      "Communication backend (auto: nccl on CUDA, gloo on CPU, the plugin's on XPU; another is refused)",
      OneOf{{"auto", "nccl", "gloo", "plugin"}});
    v("overlap_grad_reduce", overlap_grad_reduce, "Overlap the gradient reduction with the backward pass");
    v("enable_encoder_hetero_dp", enable_encoder_hetero_dp,
      "VLMs: the vision tower (TP 1) is data-parallel over the foundation's TP group: each TP rank encodes its "
      "share of the micro-batch's media, the features all-gathered (variable sizes)");
    v("enable_full_hetero_dp", enable_full_hetero_dp,
      "VLMs: the vision tower (TP 1, a replica on every rank) is data-parallel over the foundation's TP x PP (x CP) "
      "ranks: before the pipeline runs, the step's media are scattered over them by cost, the features sent to the "
      "first stage; the tower's backward runs after the step's last backward");
    v("use_vit_dp_balance", use_vit_dp_balance,
      "VLMs at DP > 1: before the vision tower, each micro-batch's images and videos are spread over the DP ranks "
      "by cost (patches^2) and their features sent back after it (the loss and the update are unchanged)");
    v("overlap_moe_expert_parallel_comm", overlap_moe_expert_parallel_comm,
      "CCT: overlap the MoE all-to-all with the experts' computation (the tokens in chunks: one chunk's dispatch "
      "and combine, forward and backward, in flight while another's experts compute); all-to-all dispatcher, ep > 1");
    v("moe_overlap_num_chunks", moe_overlap_num_chunks,
      "Token chunks of the overlapped MoE all-to-all (null: 1 where the overlap pairs micro-batches, else 2); 1: "
      "no chunks, only the overlap across micro-batches (more micro-batches a step than pipeline stages)", Min{1});
    v("moe_overlap_micro_batches", moe_overlap_micro_batches,
      "With --overlap-moe-expert-parallel-comm and more micro-batches a step than pipeline stages: the forward "
      "of one micro-batch and the backward of an earlier one take turns (DualPipe-style; under 1F1B and "
      "interleaved 1F1B one more warm-up forward per stage), each running while the other's "
      "all-to-all is in flight; false: each micro-batch's forward and backward as the schedule orders them");
    v("delay_wgrad_compute", delay_wgrad_compute,
      "With --overlap-moe-expert-parallel-comm: the experts' backward computes every chunk's input gradient first "
      "(each sent back at once) and the expert weights' gradients after the last one, while those all-to-alls are "
      "in flight");
    v("pipeline_trace", pipeline_trace,
      "Write a Chrome trace of every pipeline stage's forwards/backwards (with the MoE all-to-all overlap: its "
      "exchanges and expert computation per chunk) to PATH.stage<k>.json and print the bubble");
    v("chunkpipe_chunk_size", chunkpipe_chunk_size,
      "ChunkPipe: split each sequence into chunks of N tokens that flow through the pipeline as "
      "consecutive micro-batches (activation memory bounded by the chunk, not the sequence)",
      Min{1});
    v("overlap_param_gather", overlap_param_gather,
      "Overlap ZeRO-1's parameter all-gather with the forward pass (not implemented yet: refused)");
    v("ddp_bucket_size", ddp_bucket_size,
      "Elements per data-parallel gradient bucket (null: 40M)", Min{1});
  }
};

struct TrainingConfig {
  int64_t micro_batch_size = 1;
  std::optional<int64_t> global_batch_size;  // null: micro_batch_size * data-parallel size
  int64_t train_iters = 0;                    // required
  int64_t seq_length = 0;                     // required
  int64_t seed = 1234;
  bool bf16 = false;
  bool fp16 = false;
  std::optional<double> loss_scale;  // null: dynamic loss scaling (fp16)
  double initial_loss_scale = 4294967296.0;
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  std::optional<std::string> fp8_format;  // null: no FP8
  std::string fp8_recipe = "tensorwise";
  int64_t fp8_margin = 0;
  int64_t fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";
  std::optional<std::string> fp8_policy;  // null: every FP8-capable GEMM in FP8
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 1;
  int64_t num_layers_at_end_in_bf16 = 1;
  std::optional<std::string> recompute_granularity;
  std::optional<std::string> recompute_method;
  std::optional<int64_t> recompute_num_layers;
  bool deterministic_mode = false;
  bool skip_nonfinite_steps = false;
  bool gradient_accumulation_fusion = true;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  std::optional<int64_t> exit_interval;
  std::optional<double> exit_duration_in_mins;
  std::string training_phase = "pretrain";
  std::optional<double> ema_decay;  // null: no EMA weights

  template <class V>
  void visit(V& v) {
    v("micro_batch_size", micro_batch_size, "Batch size per model instance (local batch size)", Min{1});
    v("global_batch_size", global_batch_size,
      "Training batch size (null: micro_batch_size * data-parallel size)", Min{1});
    v("train_iters", train_iters, "Total number of iterations to train", Required{}, Min{1});
    v("seq_length", seq_length, "Maximum sequence length to process", Required{}, Min{1});
    v("seed", seed, "Random seed (Python, NumPy, LibTorch)", Min{0});
    v("bf16", bf16, "Train in bfloat16 mixed precision");
    v("fp16", fp16, "Train in float16 mixed precision (with loss scaling)");
    v("loss_scale", loss_scale, "Static loss scale for fp16 (null: dynamic)", Min{0});
    v("initial_loss_scale", initial_loss_scale, "Initial dynamic loss scale", Min{1});
    v("min_loss_scale", min_loss_scale, "Minimum dynamic loss scale", Min{0});
    v("loss_scale_window", loss_scale_window, "Window over which to raise/lower the dynamic scale", Min{1});
    v("hysteresis", hysteresis, "Hysteresis of the dynamic loss scaler", Min{1});
    v("fp8_format", fp8_format,
      "FP8 GEMMs for the decoder's linear layers (linear_qkv, linear_proj, linear_fc1, linear_fc2, the MoE "
      "experts' and shared experts', MLA's down and up projections, DSA's indexer and linear_proj; the router, "
      "the embedding and the output layer stay in the training dtype), the Wan DiT blocks' attention and FFN "
      "linear layers, pi05's joint layers (q, k, v, o, gate/up, down) and GR00T's action-head blocks: e4m3, or hybrid "
      "(E4M3 forward, E5M2 output gradients); null: none",
      OneOf{{"e4m3", "hybrid"}});
    v("fp8_recipe", fp8_recipe,
      "FP8 scaling (needs fp8_format): tensorwise (current per-tensor scaling, the amax reduced over TP), "
      "blockwise (1x128 tiles for inputs and gradients, 128x128 blocks for weights), delayed (per-tensor scales "
      "from the amax history of earlier steps, updated once per step) or mxfp8 "
      "(blocks of 32 along each GEMM's reduction dim with power-of-two scales)",
      OneOf{{"tensorwise", "blockwise", "delayed", "mxfp8"}});
    v("fp8_margin", fp8_margin, "FP8 scales are 2^-margin fp8_max / amax (needs fp8_format)", Min{0}, Max{16});
    v("fp8_amax_history_len", fp8_amax_history_len,
      "Delayed FP8 scaling (needs fp8_recipe delayed): steps of amax history each scale comes from", Min{1},
      Max{65536});
    v("fp8_amax_compute_algo", fp8_amax_compute_algo,
      "Delayed FP8 scaling (needs fp8_recipe delayed): the amax a scale comes from, the last step's (most_recent) "
      "or the history's largest (max)",
      OneOf{{"most_recent", "max"}});
    v("fp8_policy", fp8_policy,
      "Adaptive FP8 (needs fp8_format): a policy file from loongforge-fp8-policy choosing FP8 or the training "
      "dtype per GEMM kind and token count; null: every GEMM above in FP8");
    v("first_last_layers_bf16", first_last_layers_bf16,
      "FP8 (needs fp8_format) leaves the first num_layers_at_start_in_bf16 and last num_layers_at_end_in_bf16 "
      "transformer layers in the training dtype");
    v("num_layers_at_start_in_bf16", num_layers_at_start_in_bf16,
      "Layers at the start kept out of FP8 (needs first_last_layers_bf16)", Min{0});
    v("num_layers_at_end_in_bf16", num_layers_at_end_in_bf16,
      "Layers at the end kept out of FP8 (needs first_last_layers_bf16)", Min{0});
    v("recompute_granularity", recompute_granularity, "Activation recomputation",
      OneOf{{"full", "selective"}});
    v("recompute_method", recompute_method, "How full recomputation splits layers (needs granularity full)",
      OneOf{{"uniform", "block"}});
    v("recompute_num_layers", recompute_num_layers, "Layers recomputed per chunk/stage (needs recompute_method)",
      Min{1});
    v("deterministic_mode", deterministic_mode, "Deterministic algorithms only (bitwise-reproducible runs)");
    v("skip_nonfinite_steps", skip_nonfinite_steps,
      "Skip the optimizer step when the loss or gradient norm is NaN/Inf (false: stop the run)");
    v("gradient_accumulation_fusion", gradient_accumulation_fusion,
      "Weight gradients straight into the gradient buffer (Megatron's gradient-accumulation fusion): the fused "
      "output layer's in the forward (with cross_entropy_loss_fusion on); the linear layers' of dense decoder "
      "layers, the Wan DiT and a pi05 policy in their backward's GEMM, and the token embedding's as a scatter-add (fp32 and bf16); "
      "the other weights' gradients (norms, MoE experts, MLA, bf16 linear layers) go through autograd");
    v("eval_interval", eval_interval, "Iterations between evaluations on the validation set", Min{1});
    v("eval_iters", eval_iters, "Iterations per evaluation", Min{0});
    v("exit_interval", exit_interval, "Exit after the iteration that is a multiple of this", Min{1});
    v("exit_duration_in_mins", exit_duration_in_mins, "Exit after this many minutes", Min{0});
    v("ema_decay", ema_decay,
      "Keep an exponential moving average of the trained weights, ema = d ema + (1 - d) w after every optimizer "
      "step, in the checkpoints (kind \"ema\"; loongforge-convert lf2hf --ema exports it); null: none",
      Min{0}, Max{1});
    v("training_phase", training_phase,
      "pretrain: token rows from data_path; sft: one conversation per sample from a preprocess --conversations "
      "store (data_path), loss on the answer tokens only",
      OneOf{{"pretrain", "sft"}});
  }
};

struct OptimizerConfig {
  std::string optimizer = "adam";
  double lr = 0.0;  // required
  double min_lr = 0.0;
  std::string lr_decay_style = "linear";
  std::optional<int64_t> lr_decay_iters;  // null: train_iters
  int64_t lr_warmup_iters = 0;
  std::optional<double> lr_warmup_fraction;
  double lr_warmup_init = 0.0;
  std::optional<int64_t> lr_wsd_decay_iters;
  std::string lr_wsd_decay_style = "exponential";
  double weight_decay = 0.01;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double sgd_momentum = 0.9;
  double clip_grad = 1.0;
  bool use_distributed_optimizer = false;

  template <class V>
  void visit(V& v) {
    v("optimizer", optimizer, "Optimizer (adam is AdamW: decoupled weight decay)", OneOf{{"adam", "sgd"}});
    v("lr", lr, "Peak learning rate", Required{}, Min{0});
    v("min_lr", min_lr, "Learning rate floor of the decay", Min{0});
    v("lr_decay_style", lr_decay_style, "Learning rate decay",
      OneOf{{"constant", "linear", "cosine", "inverse-square-root", "WSD"}});
    v("lr_decay_iters", lr_decay_iters, "Iterations to decay over (null: train_iters)", Min{1});
    v("lr_warmup_iters", lr_warmup_iters, "Iterations of linear warmup", Min{0});
    v("lr_warmup_fraction", lr_warmup_fraction, "Warmup as a fraction of lr_decay_iters", Min{0}, Max{1});
    v("lr_warmup_init", lr_warmup_init, "Learning rate at the start of warmup", Min{0});
    v("lr_wsd_decay_iters", lr_wsd_decay_iters, "Iterations of the final decay of WSD", Min{1});
    v("lr_wsd_decay_style", lr_wsd_decay_style, "Shape of WSD's final decay",
      OneOf{{"exponential", "linear", "cosine", "minus_sqrt"}});
    v("weight_decay", weight_decay, "Weight decay coefficient", Min{0});
    v("adam_beta1", adam_beta1, "Adam beta1", Min{0}, Max{1});
    v("adam_beta2", adam_beta2, "Adam beta2", Min{0}, Max{1});
    v("adam_eps", adam_eps, "Adam epsilon", Min{0});
    v("sgd_momentum", sgd_momentum, "SGD momentum", Min{0});
    v("clip_grad", clip_grad, "Gradient clipping by global L2 norm (0: off)", Min{0});
    v("use_distributed_optimizer", use_distributed_optimizer,
      "Shard optimizer state over data-parallel ranks (ZeRO-1)");
  }
};

struct DataConfig {
  std::vector<std::string> data_path;  // Megatron form: [path] or [w1, p1, w2, p2, ...]
  std::vector<std::string> valid_data_path;  // when set, validation reads these, not a split
  std::vector<double> split = {969, 30, 1};
  bool mock_data = false;
  std::optional<std::string> tokenizer_type;
  std::optional<std::string> tokenizer_model;
  std::optional<std::string> vocab_file;
  std::optional<std::string> merge_file;
  std::optional<std::string> data_cache_path;
  int64_t num_workers = 2;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  bool packing_sft_data = false;
  bool use_vlm_dp_balance = false;
  int64_t vlm_dp_balance_warmup_iters = 5;
  std::vector<double> vlm_dp_balance_cost;  // empty: fitted after the warm-up iterations

  template <class V>
  void visit(V& v) {
    v("data_path", data_path, "Dataset prefixes, optionally weighted: [0.3, A, 0.7, B]");
    v("valid_data_path", valid_data_path,
      "Validation dataset prefixes (empty: the valid part of split over data_path)");
    v("split", split, "Train/validation/test proportions", Min{0});
    v("mock_data", mock_data, "Synthetic data instead of data_path");
    v("tokenizer_type", tokenizer_type,
      "Tokenizer of the data (its end-of-document id for --eod-mask-loss / --reset-*; its size is checked "
      "against the vocabulary)",
      OneOf{{"HuggingFaceTokenizer", "ByteTokenizer"}});
    v("tokenizer_model", tokenizer_model, "tokenizer.json or its directory (HuggingFaceTokenizer)");
    v("vocab_file", vocab_file, "GPT2BPETokenizer vocabulary (not supported: refused; use tokenizer.json)");
    v("merge_file", merge_file, "GPT2BPETokenizer merges (not supported: refused; use tokenizer.json)");
    v("data_cache_path", data_cache_path, "Where dataset index caches are written");
    v("num_workers", num_workers, "Data loader worker threads (0: load on the training thread)", Min{0});
    v("reset_position_ids", reset_position_ids, "Restart position ids after each end-of-document token");
    v("reset_attention_mask", reset_attention_mask, "Mask attention across end-of-document tokens");
    v("eod_mask_loss", eod_mask_loss, "Mask the loss on end-of-document tokens");
    v("packing_sft_data", packing_sft_data,
      "SFT: pack whole conversations into each row (positions restart and attention stays within each "
      "conversation, computed per conversation: no [s, s] mask); off: one conversation per row, padded");
    v("use_vlm_dp_balance", use_vlm_dp_balance,
      "SFT on a multimodal store at DP > 1: each iteration's global batch is reassigned across the DP ranks to "
      "equalise their cost a*sum(len^2) + b*sum(len) + c*samples (every rank reads its planned samples; the loss "
      "and the update are unchanged)");
    v("vlm_dp_balance_warmup_iters", vlm_dp_balance_warmup_iters,
      "use_vlm_dp_balance without vlm_dp_balance_cost: iterations run with Megatron's split whose measured "
      "forward/backward times (all but the first) fit a, b, c; balancing starts after them",
      Min{2});
    v("vlm_dp_balance_cost", vlm_dp_balance_cost,
      "use_vlm_dp_balance: the cost coefficients a, b, c (any unit; empty: fitted after the warm-up)", Min{0});
  }
};

struct CheckpointConfig {
  std::optional<std::string> save;
  std::optional<std::string> load;
  std::optional<int64_t> save_interval;
  bool no_save_optim = false;
  bool no_save_rng = false;
  bool no_load_optim = false;
  bool no_load_rng = false;
  bool finetune = false;
  bool exit_on_missing_checkpoint = false;
  std::optional<int64_t> ckpt_keep_last;  // null: keep every checkpoint
  bool async_save = false;
  std::optional<std::string> save_hf;
  std::optional<std::string> pretrained_checkpoint;

  template <class V>
  void visit(V& v) {
    v("save", save, "Directory checkpoints are saved to (null: no saving)");
    v("load", load, "Directory a checkpoint is loaded from (null: start fresh)");
    v("save_interval", save_interval, "Iterations between checkpoints", Min{1});
    v("no_save_optim", no_save_optim, "Do not save the optimizer state");
    v("no_save_rng", no_save_rng, "Do not save the random number generator state");
    v("no_load_optim", no_load_optim, "Do not load the optimizer state");
    v("no_load_rng", no_load_rng, "Do not load the random number generator state");
    v("finetune", finetune, "Load weights only; start at iteration 0 with fresh optimizer and RNG");
    v("exit_on_missing_checkpoint", exit_on_missing_checkpoint, "Fail when load names no checkpoint");
    v("ckpt_keep_last", ckpt_keep_last, "Keep only the newest N checkpoints in save (null: all)", Min{1});
    v("async_save", async_save, "Write checkpoints in the background while training continues");
    v("save_hf", save_hf, "Export the final weights as an HF model directory (config.json + safetensors)");
    v("pretrained_checkpoint", pretrained_checkpoint,
      "Weights to fine-tune from when load holds no checkpoint (loaded as with finetune); with LoRA the base the "
      "adapters are trained on");
  }
};

// LoRA adapters (PEFT's LoraConfig: r, lora_alpha, lora_dropout, target_modules, use_rslora) on the
// foundation's linear layers; the base model is frozen.
struct LoraConfig {
  int64_t rank = 0;  // 0: no LoRA
  double alpha = 8;
  double dropout = 0;
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  bool use_rslora = false;

  template <class V>
  void visit(V& v) {
    v("rank", rank, "LoRA rank r (0: no adapters; > 0 freezes the base model and trains adapters only)", Min{0});
    v("alpha", alpha, "LoRA alpha: the update is scaled by alpha / r (alpha / sqrt(r) with use_rslora)", Min{0});
    v("dropout", dropout, "Dropout on the adapters' input", Min{0}, Max{1});
    v("target_modules", target_modules,
      "Linear layers that get adapters, by PEFT's names: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj "
      "(all-linear: all seven)");
    v("use_rslora", use_rslora, "Rank-stabilised LoRA: scale alpha / sqrt(r)");
  }
};

struct LoggingConfig {
  int64_t log_interval = 100;
  std::optional<std::string> metrics_file;
  std::optional<std::string> tensorboard_dir;
  bool log_params_norm = false;
  bool log_throughput = false;
  bool profile = false;
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::optional<std::string> profile_trace;

  template <class V>
  void visit(V& v) {
    v("log_interval", log_interval, "Iterations between log lines", Min{1});
    v("metrics_file", metrics_file, "Append one JSON object per logged iteration here (rank 0)");
    v("tensorboard_dir", tensorboard_dir,
      "Write TensorBoard event files here: losses, lr, grad norm, tokens/s, memory, validation (rank 0)");
    v("log_params_norm", log_params_norm, "Log the parameters' global L2 norm (progress line, metrics, TensorBoard)");
    v("log_throughput", log_throughput, "Log the model TFLOP/s per rank (progress line, metrics, TensorBoard)");
    v("profile", profile,
      "Profile iterations [profile_step_start, profile_step_end) on rank 0: time by category and top ops in the log");
    v("profile_step_start", profile_step_start, "First profiled iteration", Min{1});
    v("profile_step_end", profile_step_end, "Iteration after the last profiled one", Min{2});
    v("profile_trace", profile_trace, "With profile: write the Chrome trace (chrome://tracing, Perfetto) here");
  }
};

struct JobConfig {
  ParallelConfig parallel;
  TrainingConfig training;
  OptimizerConfig optimizer;
  DataConfig data;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  LoraConfig lora;
  Node model;  // not validated here: the model builders load it with their own field lists

  // The typed sections (model is not a field: it stays a Node).
  template <class V>
  void visit(V& v) {
    v("parallel", parallel, "Parallel layout");
    v("training", training, "Training loop");
    v("optimizer", optimizer, "Optimizer and learning-rate schedule");
    v("data", data, "Data");
    v("checkpoint", checkpoint, "Checkpointing");
    v("logging", logging, "Logging and metrics");
    v("lora", lora, "LoRA adapters (fine-tuning)");
  }
};

// Top-level keys of a job tree: the typed sections plus `model`.
std::vector<std::string> job_top_level_keys();

// Cross-field checks that do not need the world size (min_lr <= lr, bf16 xor fp16,
// recomputation options, parallel order, data source ...). Origins come from `resolved`.
void validate(const JobConfig& job, const Node& resolved, ErrorList& errors);

struct LoadedJob {
  Node resolved;  // interpolated, with schema defaults filled in (origin: default)
  JobConfig job;
};

// compose + overrides + interpolation + schema load + validate. Every problem found on the way
// is reported in one ConfigError. options.base is set to the job defaults when empty.
LoadedJob load_job(const ComposeOptions& options);

// The configuration reference of the job sections (markdown table; docs/configuration.md).
std::string job_fields_markdown();

}  // namespace lf::config

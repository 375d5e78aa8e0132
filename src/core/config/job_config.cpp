// The job pipeline (compose -> defaults -> interpolate -> typed load -> cross-field checks) and the
// checks that relate several keys. Each message names every key involved, its value and origin.
#include "loongforge/core/config/job_config.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

#include "loongforge/core/config/interpolate.h"
#include "loongforge/core/config/yaml.h"

namespace lf::config {
namespace {

class Checker {
 public:
  Checker(const Node& resolved, ErrorList& errors)
      : resolved_(resolved), defaults_(defaults_node<JobConfig>()), errors_(errors) {}

  Origin origin(const std::string& key) const {
    const Node* n = resolved_.find_path(key);
    return n ? n->origin() : Origin{};
  }
  // The key was written by the user (a file, flag or override) with another value than its
  // default: a value that restates the default changes nothing, and a checkpoint's config.yaml
  // (every key written out) runs again as a job file.
  bool given(const std::string& key) const {
    const Node* n = resolved_.find_path(key);
    if (!n || n->origin().kind == Origin::Kind::default_) return false;
    const Node* d = defaults_.find_path(key);
    return !d || to_yaml(*n) != to_yaml(*d);
  }
  // "optimizer.lr = 0.0003 (configs/train/base.yaml:12)"
  std::string show(const std::string& key) const {
    const Node* n = resolved_.find_path(key);
    std::string v = n ? to_yaml(*n) : "(absent)\n";
    v.pop_back();
    return key + " = " + v + " (" + origin(key).str() + ")";
  }
  void fail(const std::string& key, const std::string& message, const std::string& hint = {}) {
    errors_.add(key, origin(key), message, hint);
  }
  // A check runs only on keys that loaded cleanly: a check of a value that is already reported
  // (wrong type, missing) would only restate that problem in a confusing way.
  bool ok(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (bad_.count(k) || !resolved_.find_path(k)) return false;
    return true;
  }
  void snapshot() {
    for (const ConfigIssue& i : errors_.issues()) bad_.insert(i.key);
  }

 private:
  const Node& resolved_;
  const Node defaults_;
  ErrorList& errors_;
  std::set<std::string> bad_;
};

bool parses_as_number(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

void check_order(const ParallelConfig& p, Checker& c) {
  const std::vector<std::string> axes = {"tp", "cp", "ep", "dp", "pp"};
  std::vector<std::string> tokens;
  std::stringstream ss(p.order);
  for (std::string t; std::getline(ss, t, '-');) tokens.push_back(t);
  std::vector<std::string> sorted = tokens, expected = axes;
  std::sort(sorted.begin(), sorted.end());
  std::sort(expected.begin(), expected.end());
  if (sorted != expected)
    c.fail("parallel.order",
           "parallel.order '" + p.order + "' must name each of tp, cp, ep, dp, pp exactly once, "
           "separated by '-'",
           "the default is tp-cp-ep-dp-pp (tensor parallel ranks adjacent)");
}

}  // namespace

std::vector<std::string> job_top_level_keys() {
  return {"parallel", "training", "optimizer", "data", "checkpoint", "logging", "model"};
}

namespace {

// Keys that act only together with another one: given without it, each would do nothing.
void check_inert_keys(Checker& c, const JobConfig& job) {
  const auto& k = job.checkpoint;
  const auto& o = job.optimizer;
  if (c.ok({"checkpoint.save"}) && !k.save) {
    const std::pair<const char*, bool> set[] = {{"checkpoint.save_interval", k.save_interval.has_value()},
                                                {"checkpoint.no_save_optim", k.no_save_optim},
                                                {"checkpoint.no_save_rng", k.no_save_rng},
                                                {"checkpoint.ckpt_keep_last", k.ckpt_keep_last.has_value()},
                                                {"checkpoint.async_save", k.async_save}};
    for (const auto& [key, on] : set)
      if (c.ok({key}) && on)
        c.fail(key, c.show(key) + ", but checkpoint.save is not set: no checkpoint is saved, so it would do nothing",
               "add --save DIR to save checkpoints, or drop it");
  }
  if (c.ok({"checkpoint.load"}) && !k.load) {
    const std::pair<const char*, bool> set[] = {{"checkpoint.no_load_optim", k.no_load_optim},
                                                {"checkpoint.no_load_rng", k.no_load_rng},
                                                {"checkpoint.exit_on_missing_checkpoint", k.exit_on_missing_checkpoint}};
    for (const auto& [key, on] : set)
      if (c.ok({key}) && on)
        c.fail(key,
               c.show(key) + ", but checkpoint.load is not set" +
                   (k.pretrained_checkpoint ? " (--pretrained-checkpoint loads weights only)" : "") +
                   ": it would do nothing",
               "add --load DIR, or drop it");
    if (c.ok({"checkpoint.finetune", "checkpoint.pretrained_checkpoint"}) && k.finetune && !k.pretrained_checkpoint)
      c.fail("checkpoint.finetune", "--finetune is set, but checkpoint.load is not set: there are no weights to load",
             "add --load DIR (the checkpoint to fine-tune from), or drop --finetune");
  } else if (c.ok({"checkpoint.load", "checkpoint.finetune"}) && k.finetune) {
    for (const auto& [key, on] : {std::pair<const char*, bool>{"checkpoint.no_load_optim", k.no_load_optim},
                                  {"checkpoint.no_load_rng", k.no_load_rng}})
      if (c.ok({key}) && on)
        c.fail(key, c.show(key) + ", and --finetune loads the weights only: it would do nothing", "drop it");
  }
  if (c.ok({"optimizer.optimizer", "optimizer.sgd_momentum"}) && o.optimizer != "sgd" && c.given("optimizer.sgd_momentum"))
    c.fail("optimizer.sgd_momentum", c.show("optimizer.sgd_momentum") + ", but the optimizer is " + o.optimizer,
           "add --optimizer sgd, or drop --sgd-momentum");
  if (c.ok({"optimizer.lr_decay_style"}) && o.lr_decay_style != "WSD")
    for (const char* key : {"optimizer.lr_wsd_decay_iters", "optimizer.lr_wsd_decay_style"})
      if (c.ok({key}) && c.given(key))
        c.fail(key, c.show(key) + " shapes the final decay of lr_decay_style WSD, and the style is " + o.lr_decay_style,
               "add --lr-decay-style WSD, or drop it");
  if (c.ok({"training.fp16", "training.loss_scale"}) && job.training.fp16 && job.training.loss_scale)
    for (const char* key : {"training.initial_loss_scale", "training.min_loss_scale", "training.loss_scale_window",
                            "training.hysteresis"})
      if (c.ok({key}) && c.given(key))
        c.fail(key, c.show(key) + " configures the dynamic loss scaler, and " + c.show("training.loss_scale") +
                        " sets a constant scale",
               "drop --loss-scale for dynamic scaling, or drop it");
  if (c.ok({"data.tokenizer_type", "data.tokenizer_model"}) && job.data.tokenizer_model && job.data.tokenizer_type &&
      *job.data.tokenizer_type == "ByteTokenizer")
    c.fail("data.tokenizer_model", c.show("data.tokenizer_model") + ", and the ByteTokenizer reads no files",
           "pass --tokenizer-type HuggingFaceTokenizer to use the tokenizer there, or drop --tokenizer-model");
}

}  // namespace

void validate(const JobConfig& job, const Node& resolved, ErrorList& errors) {
  Checker c(resolved, errors);
  c.snapshot();
  const OptimizerConfig& o = job.optimizer;
  const TrainingConfig& t = job.training;
  const ParallelConfig& p = job.parallel;
  const DataConfig& d = job.data;

  if (c.ok({"training.ema_decay"}) && t.ema_decay && (*t.ema_decay <= 0 || *t.ema_decay >= 1))
    c.fail("training.ema_decay", "ema_decay must lie strictly between 0 and 1, got " + c.show("training.ema_decay"),
           "EMA weights of diffusion models use 0.999 to 0.9999");
  if (c.ok({"optimizer.min_lr", "optimizer.lr"}) && o.min_lr > o.lr)
    c.fail("optimizer.min_lr", "min_lr exceeds lr: " + c.show("optimizer.min_lr") + " > " + c.show("optimizer.lr"),
           "min_lr is the floor the learning rate decays to; lower it or raise lr");
  if (c.ok({"optimizer.lr_warmup_fraction", "optimizer.lr_warmup_iters"}) && o.lr_warmup_fraction &&
      o.lr_warmup_iters > 0)
    c.fail("optimizer.lr_warmup_fraction",
           "both lr_warmup_fraction and lr_warmup_iters are set: " + c.show("optimizer.lr_warmup_fraction") +
               ", " + c.show("optimizer.lr_warmup_iters"),
           "set only one of them (lr_warmup_iters=0 or lr_warmup_fraction=null)");
  const int64_t decay_iters = o.lr_decay_iters.value_or(t.train_iters);
  if (c.ok({"optimizer.lr_warmup_iters", "optimizer.lr_decay_iters", "training.train_iters"}) &&
      o.lr_warmup_iters > 0 && decay_iters > 0 && o.lr_warmup_iters >= decay_iters)
    c.fail("optimizer.lr_warmup_iters",
           "warmup is not shorter than the decay: " + c.show("optimizer.lr_warmup_iters") + " >= " +
               std::to_string(decay_iters) + " decay iterations (lr_decay_iters, else train_iters)");
  if (c.ok({"optimizer.lr_decay_style", "optimizer.lr_wsd_decay_iters"}) && o.lr_decay_style == "WSD" &&
      !o.lr_wsd_decay_iters)
    c.fail("optimizer.lr_wsd_decay_iters", "lr_decay_style WSD needs optimizer.lr_wsd_decay_iters",
           "set the length of the final decay, e.g. ++optimizer.lr_wsd_decay_iters=100");

  // Every flag either acts or is refused: these wait for features that are not built.
  if (c.ok({"parallel.overlap_param_gather"}) && p.overlap_param_gather)
    c.fail("parallel.overlap_param_gather",
           "--overlap-param-gather is not implemented: ZeRO-1 gathers the updated parameters right after the "
           "optimizer step; overlapping that all-gather with the next forward comes with the performance work "
           "(issue 13)",
           "drop --overlap-param-gather (--overlap-grad-reduce overlaps the gradient reduction)");
  if (c.ok({"parallel.expert_tensor_parallel_size", "parallel.tensor_model_parallel_size"}) &&
      p.expert_tensor_parallel_size && *p.expert_tensor_parallel_size != 1 &&
      *p.expert_tensor_parallel_size != p.tensor_model_parallel_size)
    c.fail("parallel.expert_tensor_parallel_size",
           "--expert-tensor-parallel-size " + std::to_string(*p.expert_tensor_parallel_size) +
               " is neither 1 nor the tensor-parallel size " + std::to_string(p.tensor_model_parallel_size) +
               ": experts are either whole on one rank or split like the dense MLP",
           "use --expert-tensor-parallel-size 1, or drop it (experts split over --tensor-model-parallel-size)");
  for (const char* key : {"data.vocab_file", "data.merge_file"})
    if (c.ok({key}) && c.given(key))
      c.fail(key,
             std::string("--") + (std::string(key) == "data.vocab_file" ? "vocab-file" : "merge-file") +
                 " is not read: loongforge-train's tokenizers are ByteTokenizer and HuggingFaceTokenizer "
                 "(tokenizer.json); GPT2BPETokenizer vocab/merge files are not supported",
             "save the tokenizer as tokenizer.json (HF tokenizers) and pass --tokenizer-type HuggingFaceTokenizer "
             "--tokenizer-model DIR");
  if (c.ok({"training.fp16"}) && !t.fp16)
    for (const char* key : {"training.initial_loss_scale", "training.min_loss_scale", "training.loss_scale_window",
                            "training.hysteresis"})
      if (c.ok({key}) && c.given(key))
        c.fail(key, c.show(key) + " configures the dynamic loss scaler, which runs with --fp16 only",
               "add --fp16, or drop it (--loss-scale sets a constant scale in any precision)");

  if (c.ok({"training.bf16", "training.fp16"}) && t.bf16 && t.fp16)
    c.fail("training.fp16", "bf16 and fp16 are both on: " + c.show("training.bf16") + ", " + c.show("training.fp16"),
           "choose one mixed-precision mode");
  if (c.ok({"training.global_batch_size", "training.micro_batch_size"}) && t.global_batch_size &&
      *t.global_batch_size % t.micro_batch_size != 0)
    c.fail("training.global_batch_size",
           "global_batch_size is not a multiple of micro_batch_size: " + c.show("training.global_batch_size") +
               ", " + c.show("training.micro_batch_size"));
  // The FP8 knobs do nothing without fp8_format: refused rather than ignored.
  for (const char* key : {"training.fp8_recipe", "training.fp8_margin", "training.fp8_policy",
                          "training.first_last_layers_bf16", "training.fp8_amax_history_len",
                          "training.fp8_amax_compute_algo"})
    if (c.ok({key, "training.fp8_format"}) && c.given(key) && !t.fp8_format &&
        (key != std::string("training.fp8_policy") || t.fp8_policy) &&
        (key != std::string("training.first_last_layers_bf16") || t.first_last_layers_bf16))
      c.fail(key, c.show(key) + " configures FP8 GEMMs, which are off (" + c.show("training.fp8_format") + ")",
             "add --fp8-format hybrid (or e4m3), or drop it");
  // The history knobs belong to delayed scaling; the other recipes compute each scale from its tensor.
  for (const char* key : {"training.fp8_amax_history_len", "training.fp8_amax_compute_algo"})
    if (c.ok({key, "training.fp8_recipe", "training.fp8_format"}) && c.given(key) && t.fp8_format &&
        t.fp8_recipe != "delayed")
      c.fail(key, c.show(key) + " configures delayed FP8 scaling, which " + c.show("training.fp8_recipe") +
                      " does not use",
             "add --fp8-recipe delayed, or drop it");
  // most_recent reads only the newest amax: a longer history would change nothing.
  if (c.ok({"training.fp8_amax_history_len", "training.fp8_amax_compute_algo", "training.fp8_recipe"}) &&
      t.fp8_format && t.fp8_recipe == "delayed" && t.fp8_amax_history_len > 1 &&
      t.fp8_amax_compute_algo == "most_recent")
    c.fail("training.fp8_amax_history_len",
           c.show("training.fp8_amax_history_len") + " is unused under " + c.show("training.fp8_amax_compute_algo") +
               ", which takes only the newest amax",
           "add --fp8-amax-compute-algo max (the history's largest amax), or drop --fp8-amax-history-len");
  for (const char* key : {"training.num_layers_at_start_in_bf16", "training.num_layers_at_end_in_bf16"})
    if (c.ok({key, "training.first_last_layers_bf16"}) && c.given(key) && !t.first_last_layers_bf16)
      c.fail(key, c.show(key) + " counts the layers --first-last-layers-bf16 keeps out of FP8, which is off (" +
                      c.show("training.first_last_layers_bf16") + ")",
             "add --first-last-layers-bf16, or drop it");
  const bool recompute_ok =
      c.ok({"training.recompute_granularity", "training.recompute_method", "training.recompute_num_layers"});
  if (recompute_ok && t.recompute_method && t.recompute_granularity != "full")
    c.fail("training.recompute_method",
           "recompute_method applies to full recomputation only: " + c.show("training.recompute_method") + ", " +
               c.show("training.recompute_granularity"),
           "set training.recompute_granularity=full, or recompute_method=null");
  if (recompute_ok && t.recompute_granularity == "full" && (!t.recompute_method || !t.recompute_num_layers))
    c.fail("training.recompute_granularity",
           "full recomputation needs recompute_method and recompute_num_layers: " +
               c.show("training.recompute_method") + ", " + c.show("training.recompute_num_layers"),
           "e.g. --recompute-method uniform --recompute-num-layers 1");
  if (recompute_ok && c.ok({"parallel.chunkpipe_chunk_size"}) && p.chunkpipe_chunk_size &&
      t.recompute_granularity == "full")
    c.fail("training.recompute_granularity",
           "ChunkPipe's backward pass recomputes every chunk from its input already, as full recomputation would: " +
               c.show("training.recompute_granularity") + ", " + c.show("parallel.chunkpipe_chunk_size"),
           "drop --recompute-granularity full (and its method and layer count); selective recomputation still applies");
  if (recompute_ok && t.recompute_num_layers && !t.recompute_method && t.recompute_granularity != "full")
    c.fail("training.recompute_num_layers", "recompute_num_layers is set without recompute_method: " +
                                                c.show("training.recompute_num_layers"));

  if (c.ok({"parallel.num_layers_per_virtual_pipeline_stage", "parallel.pipeline_model_parallel_size"}) &&
      p.num_layers_per_virtual_pipeline_stage && p.pipeline_model_parallel_size < 2)
    c.fail("parallel.num_layers_per_virtual_pipeline_stage",
           "the interleaved schedule needs pipeline parallelism: " +
               c.show("parallel.num_layers_per_virtual_pipeline_stage") + ", " +
               c.show("parallel.pipeline_model_parallel_size"));
  if (c.ok({"parallel.order"})) check_order(p, c);
  if (c.ok({"parallel.context_parallel_size", "parallel.cp_comm_type"}) && p.context_parallel_size == 1 &&
      c.given("parallel.cp_comm_type"))
    c.fail("parallel.cp_comm_type",
           "--cp-comm-type chooses how context-parallel ranks attend, and context parallelism is off: " +
               c.show("parallel.context_parallel_size"),
           "add --context-parallel-size N (N > 1), or drop --cp-comm-type");
  if (c.ok({"parallel.context_parallel_size", "training.seq_length"}) && p.context_parallel_size > 1) {
    const int64_t cp = p.context_parallel_size;
    if (t.seq_length % (2 * cp) != 0)
      c.fail("training.seq_length",
             "context parallelism cuts each sequence into 2 x cp equal chunks (load-balanced causal attention): " +
                 c.show("training.seq_length") + ", " + c.show("parallel.context_parallel_size"),
             "pick --seq-length as a multiple of " + std::to_string(2 * cp));
    else if (c.ok({"parallel.sequence_parallel", "parallel.tensor_model_parallel_size"}) && p.sequence_parallel &&
             (t.seq_length / cp) % p.tensor_model_parallel_size != 0)
      c.fail("training.seq_length",
             "with sequence parallelism each context-parallel rank's " + std::to_string(t.seq_length / cp) +
                 " tokens are split over the tensor-parallel ranks: " + c.show("training.seq_length") + ", " +
                 c.show("parallel.context_parallel_size") + ", " + c.show("parallel.tensor_model_parallel_size"),
             "pick --seq-length as a multiple of " + std::to_string(cp * p.tensor_model_parallel_size * 2));
  }
  if (p.chunkpipe_chunk_size) {
    const int64_t n = *p.chunkpipe_chunk_size;
    if (c.ok({"training.seq_length"}) && t.seq_length > 0 && t.seq_length % n != 0)
      c.fail("parallel.chunkpipe_chunk_size",
             "the sequence does not split into whole chunks: " + c.show("training.seq_length") + ", " +
                 c.show("parallel.chunkpipe_chunk_size"),
             "pick a chunk size dividing the sequence length");
    if (c.ok({"parallel.sequence_parallel", "parallel.tensor_model_parallel_size"}) && p.sequence_parallel &&
        n % p.tensor_model_parallel_size != 0)
      c.fail("parallel.chunkpipe_chunk_size",
             "with sequence parallelism each chunk is split over the tensor-parallel ranks, so the chunk "
             "size must be a multiple of the TP size: " +
                 c.show("parallel.chunkpipe_chunk_size") + ", " + c.show("parallel.tensor_model_parallel_size"),
             "pick a chunk size that is a multiple of " + std::to_string(p.tensor_model_parallel_size));
    if (c.ok({"parallel.context_parallel_size", "parallel.cp_comm_type"}) && p.context_parallel_size > 1) {
      // Each chunk is split over the CP ranks like a sequence; its keys/values are all-gathered.
      const int64_t cp = p.context_parallel_size;
      if (n % (2 * cp) != 0)
        c.fail("parallel.chunkpipe_chunk_size",
               "under context parallelism each chunk is cut into 2 x cp pieces: " +
                   c.show("parallel.chunkpipe_chunk_size") + ", " + c.show("parallel.context_parallel_size"),
               "pick a chunk size that is a multiple of " + std::to_string(2 * cp));
      else if (c.ok({"parallel.sequence_parallel", "parallel.tensor_model_parallel_size"}) && p.sequence_parallel &&
               (n / cp) % p.tensor_model_parallel_size != 0)
        c.fail("parallel.chunkpipe_chunk_size",
               "with sequence parallelism a CP rank's " + std::to_string(n / cp) +
                   " tokens of each chunk are split over the tensor-parallel ranks: " +
                   c.show("parallel.chunkpipe_chunk_size") + ", " + c.show("parallel.context_parallel_size"),
               "pick a chunk size that is a multiple of " + std::to_string(2 * cp * p.tensor_model_parallel_size));
      if (c.given("parallel.cp_comm_type"))
        c.fail("parallel.cp_comm_type",
               "under ChunkPipe context-parallel ranks all-gather each chunk's keys and values (the prefix is kept "
               "on every rank); neither the ring nor Ulysses runs: " + c.show("parallel.cp_comm_type"),
               "drop --cp-comm-type with --chunkpipe-chunk-size");
    }
    if (c.ok({"parallel.num_layers_per_virtual_pipeline_stage"}) && p.num_layers_per_virtual_pipeline_stage)
      c.fail("parallel.chunkpipe_chunk_size",
             "ChunkPipe runs its own schedule, not the interleaved one: " + c.show("parallel.chunkpipe_chunk_size") +
                 ", " + c.show("parallel.num_layers_per_virtual_pipeline_stage"),
             "drop --num-layers-per-virtual-pipeline-stage");
  }

  const bool data_ok = c.ok({"data.data_path", "data.mock_data"});
  if (data_ok && d.mock_data && !d.data_path.empty())
    c.fail("data.mock_data",
           "both data.mock_data and data.data_path are set: " + c.show("data.mock_data") + ", " + c.show("data.data_path") +
               " (mock data would silently replace the dataset)",
           "drop --mock-data to train on the data, or drop --data-path (data.mock_data=false overrides a config's mock)");
  if (data_ok && !d.mock_data && d.data_path.empty())
    c.fail("data.data_path", "no training data: data.data_path is empty and data.mock_data is false",
           "pass --data-path PREFIX (the .bin/.idx pair without extension), or --mock-data");
  if (data_ok && d.data_path.size() > 1 && parses_as_number(d.data_path[0])) {
    bool ok = d.data_path.size() % 2 == 0;
    for (size_t i = 0; ok && i < d.data_path.size(); i += 2) ok = parses_as_number(d.data_path[i]);
    if (!ok)
      c.fail("data.data_path",
             "data.data_path starts with a weight, so it must alternate weight, prefix: " + c.show("data.data_path"),
             "write [0.3, prefixA, 0.7, prefixB] or list prefixes only");
  }
  // Fine-tuning: SFT data and LoRA.
  const bool sft = c.ok({"training.training_phase"}) && t.training_phase == "sft";
  if (c.ok({"data.packing_sft_data"}) && d.packing_sft_data && !sft)
    c.fail("data.packing_sft_data", "--packing-sft-data packs SFT conversations, and this is not an SFT run",
           "add --training-phase sft, or drop --packing-sft-data (pretraining rows are packed documents already)");
  if (sft && c.ok({"data.packing_sft_data", "parallel.chunkpipe_chunk_size"}) && d.packing_sft_data &&
      p.chunkpipe_chunk_size)
    c.fail("data.packing_sft_data",
           "packed conversations attend within each conversation, which ChunkPipe's chunked attention does not do",
           "drop --chunkpipe-chunk-size or --packing-sft-data");
  // VLM data-parallel load balancing: SFT only, one conversation per row.
  if (c.ok({"data.use_vlm_dp_balance"}) && d.use_vlm_dp_balance) {
    if (!sft)
      c.fail("data.use_vlm_dp_balance",
             "--use-vlm-dp-balance reassigns the conversations of a multimodal SFT store across data-parallel ranks, "
             "and this is not an SFT run",
             "add --training-phase sft with --data-path set to a `loongforge-data preprocess --multimodal` store, or "
             "drop --use-vlm-dp-balance");
    if (c.ok({"data.packing_sft_data"}) && d.packing_sft_data)
      c.fail("data.use_vlm_dp_balance",
             "--use-vlm-dp-balance places single conversations, and --packing-sft-data packs several into a row",
             "drop --packing-sft-data or --use-vlm-dp-balance");
    if (c.ok({"data.vlm_dp_balance_cost"}) && !d.vlm_dp_balance_cost.empty()) {
      const auto& k = d.vlm_dp_balance_cost;
      if (k.size() != 3)
        c.fail("data.vlm_dp_balance_cost",
               "data.vlm_dp_balance_cost takes the three coefficients a, b, c of a*sum(len^2) + b*sum(len) + "
               "c*samples: " + c.show("data.vlm_dp_balance_cost"),
               "e.g. --vlm-dp-balance-cost 0,1,0 (cost proportional to tokens), or drop it to fit them");
      else if (k[0] + k[1] + k[2] <= 0)
        c.fail("data.vlm_dp_balance_cost",
               "data.vlm_dp_balance_cost is all zero: every placement would cost the same",
               "give a positive coefficient, e.g. --vlm-dp-balance-cost 0,1,0");
      if (c.ok({"data.vlm_dp_balance_warmup_iters"}) && c.given("data.vlm_dp_balance_warmup_iters"))
        c.fail("data.vlm_dp_balance_warmup_iters",
               "data.vlm_dp_balance_warmup_iters is set with data.vlm_dp_balance_cost: the warm-up fits the cost "
               "model, and it is given",
               "drop --vlm-dp-balance-warmup-iters, or drop --vlm-dp-balance-cost to fit the coefficients");
    }
  } else {
    for (const char* key : {"data.vlm_dp_balance_warmup_iters", "data.vlm_dp_balance_cost"})
      if (c.ok({key}) && c.given(key))
        c.fail(key, std::string(key) + " is set but data.use_vlm_dp_balance is off: it would do nothing",
               "add --use-vlm-dp-balance, or drop it");
  }
  if (sft && c.ok({"data.mock_data"}) && d.mock_data)
    c.fail("training.training_phase",
           "--training-phase sft trains on conversations with answer masks; mock data has none",
           "preprocess a conversations file with `loongforge-data preprocess --conversations` and pass --data-path");
  if (sft && c.ok({"data.valid_data_path"}) && !d.valid_data_path.empty())
    c.fail("data.valid_data_path",
           "--training-phase sft validates on the valid part of --split over its conversations store",
           "drop --valid-data-path and give the validation share in --split (e.g. --split 95,5,0)");
  if (sft)
    for (const char* key : {"data.reset_position_ids", "data.reset_attention_mask", "data.eod_mask_loss"})
      if (c.ok({key}) && c.given(key))
        c.fail(key,
               std::string(key) + " acts on end-of-document tokens inside packed pretraining rows; an SFT row holds "
                                  "one conversation and its loss mask comes from the chat template",
               "drop it with --training-phase sft");
  if (c.ok({"lora.rank", "checkpoint.save_hf"}) && job.lora.rank > 0 && job.checkpoint.save_hf)
    c.fail("checkpoint.save_hf",
           "--save-hf writes the model's full weights, and a LoRA run trains adapters on a frozen base: the export "
           "would silently leave the adapters out",
           "drop --save-hf and export the saved checkpoint with `loongforge-convert lf2hf` (base + PEFT adapter/, or "
           "--merge-lora for merged weights)");
  check_inert_keys(c, job);
  if (c.ok({"logging.profile"}) && !job.logging.profile)
    for (const char* key : {"logging.profile_step_start", "logging.profile_step_end", "logging.profile_trace"})
      if (c.ok({key}) && c.given(key))
        c.fail(key, std::string(key) + " is set but logging.profile is off: nothing would be profiled",
               "add --profile, or drop it");
  if (c.ok({"lora.rank"})) {
    const auto& l = job.lora;
    if (l.rank == 0) {
      for (const char* key : {"lora.alpha", "lora.dropout", "lora.target_modules", "lora.use_rslora"})
        if (c.ok({key}) && c.given(key))
          c.fail(key, std::string(key) + " is set but lora.rank is 0 (no adapters): it would do nothing",
                 "add --lora-rank R to train LoRA adapters, or drop it");
    } else if (c.ok({"lora.target_modules"})) {
      static const std::set<std::string> known = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                  "gate_proj", "up_proj", "down_proj", "all-linear"};
      if (l.target_modules.empty())
        c.fail("lora.target_modules", "lora.target_modules is empty: no layer would get an adapter",
               "e.g. --lora-target-modules q_proj k_proj v_proj o_proj");
      std::set<std::string> seen;
      for (const auto& m : l.target_modules) {
        if (!known.count(m))
          c.fail("lora.target_modules", "unknown LoRA target module '" + m + "' in " + c.show("lora.target_modules"),
                 "use PEFT's names: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, or all-linear");
        else if (!seen.insert(m).second)
          c.fail("lora.target_modules", "LoRA target module '" + m + "' is listed twice", "list each module once");
      }
    }
  }
  double split_sum = std::accumulate(d.split.begin(), d.split.end(), 0.0);
  if (c.ok({"data.split"}) && (d.split.empty() || d.split.size() > 3 || split_sum <= 0))
    c.fail("data.split", "data.split must hold 1 to 3 proportions (train, validation, test) with a positive sum: " +
                             c.show("data.split"),
           "e.g. --split 98,2,0");
}

LoadedJob load_job(const ComposeOptions& options) {
  ErrorList errors;
  ComposeOptions o = options;
  const Node defaults = defaults_node<JobConfig>();
  if (!o.base) o.base = defaults;
  LoadedJob out;
  out.resolved = compose(o, errors);
  // Again after the overrides: a key deleted with ~key falls back to its default.
  fill_missing(out.resolved, defaults);
  resolve_interpolations(out.resolved, errors);

  Loader loader(&out.resolved, "", out.resolved.origin(), errors);
  loader.also_valid("model");
  out.job.visit(loader);
  loader.finish();
  if (const Node* model = out.resolved.find("model")) {
    if (model->is_map())
      out.job.model = *model;
    else
      detail::report_wrong_type(*model, "model", "map (section)", errors);
  } else {
    errors.add("model", Origin{}, "required key 'model' is missing",
               "compose one in the defaults list, e.g. `- /models@model: causal_lm`");
  }
  validate(out.job, out.resolved, errors);
  errors.throw_if_any();
  return out;
}

std::string job_fields_markdown() { return fields_markdown(describe<JobConfig>()); }

}  // namespace lf::config

// The Megatron flag table and loongforge-train's command-line parser. A flag's help text comes
// from the schema field it sets (job_config.h) unless the row gives one (model flags: the model
// builders own those fields), so flag help, --help, and docs cannot disagree with the schema.
#include "loongforge/core/config/flags.h"

#include <algorithm>
#include <map>

#include "loongforge/core/config/job_config.h"

namespace lf::config {
namespace {

using K = FlagSpec::Kind;

// clang-format off
const std::vector<FlagSpec> kTable = {
  // parallel
  {"--tensor-model-parallel-size", "parallel.tensor_model_parallel_size", K::value, "N", ""},
  {"--pipeline-model-parallel-size", "parallel.pipeline_model_parallel_size", K::value, "N", ""},
  {"--sequence-parallel", "parallel.sequence_parallel", K::store_true, "", ""},
  {"--enable-encoder-hetero-dp", "parallel.enable_encoder_hetero_dp", K::store_true, "", ""},
  {"--enable-full-hetero-dp", "parallel.enable_full_hetero_dp", K::store_true, "", ""},
  {"--use-vit-dp-balance", "parallel.use_vit_dp_balance", K::store_true, "", ""},
  {"--context-parallel-size", "parallel.context_parallel_size", K::value, "N", ""},
  {"--cp-comm-type", "parallel.cp_comm_type", K::value, "p2p|a2a", ""},
  {"--expert-model-parallel-size", "parallel.expert_model_parallel_size", K::value, "N", ""},
  {"--expert-tensor-parallel-size", "parallel.expert_tensor_parallel_size", K::value, "N", ""},
  {"--moe-token-dispatcher-type", "parallel.moe_token_dispatcher_type", K::value, "alltoall|allgather", ""},
  {"--num-layers-per-virtual-pipeline-stage", "parallel.num_layers_per_virtual_pipeline_stage", K::value, "N", ""},
  {"--pipeline-trace", "parallel.pipeline_trace", K::value, "PATH", ""},
  {"--chunkpipe-chunk-size", "parallel.chunkpipe_chunk_size", K::value, "N", ""},
  {"--decoder-first-pipeline-num-layers", "parallel.decoder_first_pipeline_num_layers", K::value, "N", ""},
  {"--decoder-last-pipeline-num-layers", "parallel.decoder_last_pipeline_num_layers", K::value, "N", ""},
  {"--pipeline-model-parallel-layout", "parallel.pipeline_model_parallel_layout", K::value, "LAYOUT", ""},
  {"--distributed-timeout-minutes", "parallel.distributed_timeout_minutes", K::value, "MIN", ""},
  {"--distributed-backend", "parallel.distributed_backend", K::value, "NAME", ""},
  {"--overlap-grad-reduce", "parallel.overlap_grad_reduce", K::store_true, "", ""},
  {"--overlap-moe-expert-parallel-comm", "parallel.overlap_moe_expert_parallel_comm", K::store_true, "", ""},
  {"--moe-overlap-num-chunks", "parallel.moe_overlap_num_chunks", K::value, "N", ""},
  {"--delay-wgrad-compute", "parallel.delay_wgrad_compute", K::store_true, "", ""},
  {"--no-moe-overlap-micro-batches", "parallel.moe_overlap_micro_batches", K::store_false, "",
   "Without the MoE overlap across micro-batches: forwards and backwards as the schedule orders them"},
  {"--overlap-param-gather", "parallel.overlap_param_gather", K::store_true, "", ""},
  {"--ddp-bucket-size", "parallel.ddp_bucket_size", K::value, "N", ""},
  // training
  {"--micro-batch-size", "training.micro_batch_size", K::value, "N", ""},
  {"--global-batch-size", "training.global_batch_size", K::value, "N", ""},
  {"--train-iters", "training.train_iters", K::value, "N", ""},
  {"--seq-length", "training.seq_length", K::value, "N", ""},
  {"--seed", "training.seed", K::value, "N", ""},
  {"--bf16", "training.bf16", K::store_true, "", ""},
  {"--fp16", "training.fp16", K::store_true, "", ""},
  {"--loss-scale", "training.loss_scale", K::value, "S", ""},
  {"--initial-loss-scale", "training.initial_loss_scale", K::value, "S", ""},
  {"--min-loss-scale", "training.min_loss_scale", K::value, "S", ""},
  {"--loss-scale-window", "training.loss_scale_window", K::value, "N", ""},
  {"--hysteresis", "training.hysteresis", K::value, "N", ""},
  {"--fp8-format", "training.fp8_format", K::value, "e4m3|hybrid", ""},
  {"--fp8-recipe", "training.fp8_recipe", K::value, "tensorwise|blockwise|delayed|mxfp8", ""},
  {"--fp8-margin", "training.fp8_margin", K::value, "N", ""},
  {"--fp8-amax-history-len", "training.fp8_amax_history_len", K::value, "N", ""},
  {"--fp8-amax-compute-algo", "training.fp8_amax_compute_algo", K::value, "most_recent|max", ""},
  {"--fp8-policy", "training.fp8_policy", K::value, "FILE", ""},
  {"--first-last-layers-bf16", "training.first_last_layers_bf16", K::store_true, "", ""},
  {"--num-layers-at-start-in-bf16", "training.num_layers_at_start_in_bf16", K::value, "N", ""},
  {"--num-layers-at-end-in-bf16", "training.num_layers_at_end_in_bf16", K::value, "N", ""},
  {"--recompute-granularity", "training.recompute_granularity", K::value, "full|selective", ""},
  {"--recompute-method", "training.recompute_method", K::value, "uniform|block", ""},
  {"--recompute-num-layers", "training.recompute_num_layers", K::value, "N", ""},
  {"--deterministic-mode", "training.deterministic_mode", K::store_true, "", ""},
  {"--gradient-accumulation-fusion", "training.gradient_accumulation_fusion", K::store_true, "", "Weight gradients straight into the gradient buffer: the fused output layer's, the decoder's, Wan's and pi05's linear layers', the token embedding's (the default)"},
  {"--no-gradient-accumulation-fusion", "training.gradient_accumulation_fusion", K::store_false, "", "Weight gradients through autograd (the output layer's held from forward to backward)"},
  {"--eval-interval", "training.eval_interval", K::value, "N", ""},
  {"--eval-iters", "training.eval_iters", K::value, "N", ""},
  {"--exit-interval", "training.exit_interval", K::value, "N", ""},
  {"--ema-decay", "training.ema_decay", K::value, "D", "Keep EMA weights (decay D, e.g. 0.9999) in the checkpoints"},
  {"--exit-duration-in-mins", "training.exit_duration_in_mins", K::value, "MIN", ""},
  {"--training-phase", "training.training_phase", K::value, "pretrain|sft", ""},
  // optimizer
  {"--optimizer", "optimizer.optimizer", K::value, "adam|sgd", ""},
  {"--lr", "optimizer.lr", K::value, "LR", ""},
  {"--min-lr", "optimizer.min_lr", K::value, "LR", ""},
  {"--lr-decay-style", "optimizer.lr_decay_style", K::value, "STYLE", ""},
  {"--lr-decay-iters", "optimizer.lr_decay_iters", K::value, "N", ""},
  {"--lr-warmup-iters", "optimizer.lr_warmup_iters", K::value, "N", ""},
  {"--lr-warmup-fraction", "optimizer.lr_warmup_fraction", K::value, "F", ""},
  {"--lr-warmup-init", "optimizer.lr_warmup_init", K::value, "LR", ""},
  {"--lr-wsd-decay-iters", "optimizer.lr_wsd_decay_iters", K::value, "N", ""},
  {"--lr-wsd-decay-style", "optimizer.lr_wsd_decay_style", K::value, "STYLE", ""},
  {"--weight-decay", "optimizer.weight_decay", K::value, "WD", ""},
  {"--adam-beta1", "optimizer.adam_beta1", K::value, "B1", ""},
  {"--adam-beta2", "optimizer.adam_beta2", K::value, "B2", ""},
  {"--adam-eps", "optimizer.adam_eps", K::value, "EPS", ""},
  {"--sgd-momentum", "optimizer.sgd_momentum", K::value, "M", ""},
  {"--clip-grad", "optimizer.clip_grad", K::value, "NORM", ""},
  {"--use-distributed-optimizer", "optimizer.use_distributed_optimizer", K::store_true, "", ""},
  // data
  {"--data-path", "data.data_path", K::list, "[W] PREFIX ...", ""},
  {"--valid-data-path", "data.valid_data_path", K::list, "[W] PREFIX ...", ""},
  {"--split", "data.split", K::comma_list, "TRAIN,VALID,TEST", ""},
  {"--mock-data", "data.mock_data", K::store_true, "", ""},
  {"--tokenizer-type", "data.tokenizer_type", K::value, "NAME", ""},
  {"--tokenizer-model", "data.tokenizer_model", K::value, "PATH", ""},
  {"--vocab-file", "data.vocab_file", K::value, "PATH", ""},
  {"--merge-file", "data.merge_file", K::value, "PATH", ""},
  {"--data-cache-path", "data.data_cache_path", K::value, "DIR", ""},
  {"--num-workers", "data.num_workers", K::value, "N", ""},
  {"--reset-position-ids", "data.reset_position_ids", K::store_true, "", ""},
  {"--reset-attention-mask", "data.reset_attention_mask", K::store_true, "", ""},
  {"--eod-mask-loss", "data.eod_mask_loss", K::store_true, "", ""},
  {"--packing-sft-data", "data.packing_sft_data", K::store_true, "", ""},
  {"--use-vlm-dp-balance", "data.use_vlm_dp_balance", K::store_true, "", ""},
  {"--vlm-dp-balance-warmup-iters", "data.vlm_dp_balance_warmup_iters", K::value, "N", ""},
  {"--vlm-dp-balance-cost", "data.vlm_dp_balance_cost", K::comma_list, "A,B,C", ""},
  // checkpoint
  {"--save", "checkpoint.save", K::value, "DIR", ""},
  {"--load", "checkpoint.load", K::value, "DIR", ""},
  {"--save-interval", "checkpoint.save_interval", K::value, "N", ""},
  {"--no-save-optim", "checkpoint.no_save_optim", K::store_true, "", ""},
  {"--no-save-rng", "checkpoint.no_save_rng", K::store_true, "", ""},
  {"--no-load-optim", "checkpoint.no_load_optim", K::store_true, "", ""},
  {"--no-load-rng", "checkpoint.no_load_rng", K::store_true, "", ""},
  {"--finetune", "checkpoint.finetune", K::store_true, "", ""},
  {"--exit-on-missing-checkpoint", "checkpoint.exit_on_missing_checkpoint", K::store_true, "", ""},
  {"--ckpt-keep-last", "checkpoint.ckpt_keep_last", K::value, "N", ""},
  {"--async-save", "checkpoint.async_save", K::store_true, "", ""},
  {"--save-hf", "checkpoint.save_hf", K::value, "DIR", ""},
  {"--pretrained-checkpoint", "checkpoint.pretrained_checkpoint", K::value, "DIR", ""},
  // LoRA
  {"--lora-rank", "lora.rank", K::value, "R", ""},
  {"--lora-alpha", "lora.alpha", K::value, "ALPHA", ""},
  {"--lora-dropout", "lora.dropout", K::value, "P", ""},
  {"--lora-target-modules", "lora.target_modules", K::list, "MODULE ...", ""},
  {"--use-rslora", "lora.use_rslora", K::store_true, "", ""},
  // logging
  {"--log-interval", "logging.log_interval", K::value, "N", ""},
  {"--metrics-file", "logging.metrics_file", K::value, "PATH", ""},
  {"--tensorboard-dir", "logging.tensorboard_dir", K::value, "DIR", ""},
  {"--log-params-norm", "logging.log_params_norm", K::store_true, "", ""},
  {"--log-throughput", "logging.log_throughput", K::store_true, "", ""},
  {"--profile", "logging.profile", K::store_true, "", ""},
  {"--profile-step-start", "logging.profile_step_start", K::value, "N", ""},
  {"--profile-step-end", "logging.profile_step_end", K::value, "N", ""},
  {"--profile-trace", "logging.profile_trace", K::value, "PATH", ""},
  // model (validated by the model builders)
  {"--num-layers", "model.foundation.num_layers", K::value, "N", "Number of transformer layers"},
  {"--hidden-size", "model.foundation.hidden_size", K::value, "N", "Hidden size"},
  {"--ffn-hidden-size", "model.foundation.ffn_hidden_size", K::value, "N", "Hidden size of the MLP"},
  {"--num-attention-heads", "model.foundation.num_attention_heads", K::value, "N", "Number of attention heads"},
  {"--group-query-attention", "model.foundation.group_query_attention", K::store_true, "", "Grouped-query attention (with --num-query-groups)"},
  {"--num-query-groups", "model.foundation.num_query_groups", K::value, "N", "Number of key/value head groups (GQA)"},
  {"--kv-channels", "model.foundation.kv_channels", K::value, "N", "Size of one attention head (default hidden_size / heads)"},
  {"--max-position-embeddings", "model.foundation.max_position_embeddings", K::value, "N", "Maximum sequence length of the position encoding"},
  {"--position-embedding-type", "model.foundation.position_embedding_type", K::value, "rope", "Position encoding (the decoder family uses rope)"},
  {"--rotary-base", "model.foundation.rotary_base", K::value, "BASE", "RoPE base (theta)"},
  {"--vocab-size", "model.foundation.vocab_size", K::value, "N", "Vocabulary size (before padding)"},
  {"--make-vocab-size-divisible-by", "model.foundation.make_vocab_size_divisible_by", K::value, "N", "Pad the vocabulary to a multiple of this (times TP size)"},
  {"--normalization", "model.foundation.normalization", K::value, "LayerNorm|RMSNorm", "Normalization layer"},
  {"--swiglu", "model.foundation.swiglu", K::store_true, "", "SwiGLU MLP"},
  {"--untie-embeddings-and-output-weights", "model.foundation.untie_embeddings_and_output_weights", K::store_true, "", "Separate input embedding and output projection weights"},
  {"--disable-bias-linear", "model.foundation.add_bias_linear", K::store_false, "", "No biases in the linear layers"},
  {"--add-qkv-bias", "model.foundation.add_qkv_bias", K::store_true, "", "Bias in the QKV projection only"},
  {"--qk-layernorm", "model.foundation.qk_layernorm", K::store_true, "", "Normalize queries and keys"},
  {"--init-method-std", "model.foundation.init_method_std", K::value, "STD", "Standard deviation of the weight initialization"},
  {"--hidden-dropout", "model.foundation.hidden_dropout", K::value, "P", "Dropout after attention and MLP"},
  {"--attention-dropout", "model.foundation.attention_dropout", K::value, "P", "Dropout of the attention probabilities"},
  {"--cross-entropy-loss-fusion", "model.foundation.cross_entropy_loss_fusion", K::store_true, "", "Output layer + cross entropy in one op over chunks of tokens (the default)"},
  {"--no-cross-entropy-loss-fusion", "model.foundation.cross_entropy_loss_fusion", K::store_false, "", "Whole [tokens, vocab] logits, then the cross entropy"},
  // RoPE variants, multi-latent attention
  {"--rope-type", "model.foundation.rope_type", K::value, "rope|yarn", "RoPE scaling: rope or yarn"},
  {"--rotary-scaling-factor", "model.foundation.rotary_scaling_factor", K::value, "F", "YaRN context extension factor"},
  {"--mscale", "model.foundation.mscale", K::value, "M", "YaRN mscale"},
  {"--mscale-all-dim", "model.foundation.mscale_all_dim", K::value, "M", "YaRN mscale_all_dim"},
  {"--beta-fast", "model.foundation.beta_fast", K::value, "B", "YaRN beta_fast"},
  {"--beta-slow", "model.foundation.beta_slow", K::value, "B", "YaRN beta_slow"},
  {"--rotary-interleaved", "model.foundation.rotary_interleaved", K::store_true, "", "RoPE on interleaved pairs"},
  {"--multi-latent-attention", "model.foundation.multi_latent_attention", K::store_true, "", "Multi-latent attention (DeepSeek-V2/V3)"},
  {"--q-lora-rank", "model.foundation.q_lora_rank", K::value, "N", "MLA query bottleneck rank"},
  {"--kv-lora-rank", "model.foundation.kv_lora_rank", K::value, "N", "MLA key/value latent rank"},
  {"--qk-head-dim", "model.foundation.qk_head_dim", K::value, "N", "MLA query/key dims per head without RoPE"},
  {"--qk-pos-emb-head-dim", "model.foundation.qk_pos_emb_head_dim", K::value, "N", "MLA query/key RoPE dims per head"},
  {"--v-head-dim", "model.foundation.v_head_dim", K::value, "N", "MLA value dims per head"},
  // DeepSeek Sparse Attention (DeepSeek-V3.2)
  {"--experimental-attention-variant", "model.foundation.experimental_attention_variant", K::value, "none|dsa", "dsa: DeepSeek Sparse Attention on MLA"},
  {"--dsa-indexer-n-heads", "model.foundation.dsa_indexer_n_heads", K::value, "N", "DSA indexer heads"},
  {"--dsa-indexer-head-dim", "model.foundation.dsa_indexer_head_dim", K::value, "N", "DSA indexer head size"},
  {"--dsa-indexer-topk", "model.foundation.dsa_indexer_topk", K::value, "K", "DSA keys per query"},
  {"--dsa-indexer-loss-coeff", "model.foundation.dsa_indexer_loss_coeff", K::value, "C", "Weight of the DSA indexer KL loss"},
  // diffusion (flow_matching)
  {"--min-timestep-boundary", "model.min_timestep_boundary", K::value, "F", "Lowest fraction of the training timestep indices (Wan 2.2 A14B low-noise expert: 0.358)"},
  {"--max-timestep-boundary", "model.max_timestep_boundary", K::value, "F", "Highest fraction of the training timestep indices (Wan 2.2 A14B high-noise expert: 0.358)"},
  {"--dsa-indexer-warmup", "model.foundation.dsa_indexer_warmup", K::store_true, "", "DSA warm-up: dense attention, indexer KL over all keys, only the indexers trained"},
  // mixture of experts
  {"--num-experts", "model.foundation.num_experts", K::value, "N", "Routed experts per MoE layer (0: dense)"},
  {"--moe-ffn-hidden-size", "model.foundation.moe_ffn_hidden_size", K::value, "N", "Hidden size of one routed expert"},
  {"--moe-router-topk", "model.foundation.moe_router_topk", K::value, "K", "Experts per token"},
  {"--moe-router-score-function", "model.foundation.moe_router_score_function", K::value, "softmax|sigmoid", "Router score function"},
  {"--moe-router-pre-softmax", "model.foundation.moe_router_pre_softmax", K::store_true, "", "Softmax over all experts before the top-k"},
  {"--moe-router-num-groups", "model.foundation.moe_router_num_groups", K::value, "N", "Group-limited routing: expert groups"},
  {"--moe-router-group-topk", "model.foundation.moe_router_group_topk", K::value, "N", "Group-limited routing: groups per token"},
  {"--moe-router-topk-scaling-factor", "model.foundation.moe_router_topk_scaling_factor", K::value, "F", "Scale of the routing weights"},
  {"--moe-router-load-balancing-type", "model.foundation.moe_router_load_balancing_type", K::value, "aux_loss|seq_aux_loss|none", "Load-balancing loss"},
  {"--moe-aux-loss-coeff", "model.foundation.moe_aux_loss_coeff", K::value, "C", "Weight of the load-balancing loss"},
  {"--moe-z-loss-coeff", "model.foundation.moe_z_loss_coeff", K::value, "C", "Weight of the router z-loss"},
  {"--moe-router-enable-expert-bias", "model.foundation.moe_router_enable_expert_bias", K::store_true, "", "Aux-loss-free balancing with a per-expert bias"},
  {"--moe-router-bias-update-rate", "model.foundation.moe_router_bias_update_rate", K::value, "R", "Expert bias update rate"},
  {"--moe-shared-expert-intermediate-size", "model.foundation.moe_shared_expert_intermediate_size", K::value, "N", "Hidden size of the shared experts"},
  {"--moe-shared-expert-gate", "model.foundation.moe_shared_expert_gate", K::store_true, "", "Sigmoid gate on the shared experts' output"},
  {"--moe-layer-freq", "model.foundation.moe_layer_freq", K::value, "N|PATTERN", "Which layers are MoE"},
  {"--moe-expert-capacity-factor", "model.foundation.moe_expert_capacity_factor", K::value, "F", "Per-expert capacity factor (default: dropless)"},
  {"--moe-token-drop-policy", "model.foundation.moe_token_drop_policy", K::value, "probs|position", "Which tokens go over capacity"},
  {"--mtp-num-layers", "model.foundation.mtp_num_layers", K::value, "N", "Multi-token prediction layers (DeepSeek-V3)"},
  {"--mtp-loss-scaling-factor", "model.foundation.mtp_loss_scaling_factor", K::value, "F", "Weight of the MTP loss"},
};
// clang-format on

// Megatron flags users will reach for whose features are not built yet: refused at once with
// what they wait for (never accepted and ignored).
struct Refused {
  std::string_view flag, metavar, why;
};
const std::vector<Refused> kRefused = {};

struct Switch {
  std::string_view flag, metavar, help;
};
const std::vector<Switch> kSwitches = {
    {"--config-file", "FILE", "Primary YAML config (its defaults list is composed from configs/)"},
    {"--dry-run", "", "Resolve everything, print the resolved config and layout, and exit"},
    {"--show-origin", "", "With --dry-run: print where each value came from"},
    {"--help", "", "Print this help and exit"},
};

const std::map<std::string, FieldDoc>& schema_docs() {
  static const std::map<std::string, FieldDoc> docs = [] {
    std::map<std::string, FieldDoc> m;
    for (FieldDoc& d : describe<JobConfig>()) m[d.key] = d;
    return m;
  }();
  return docs;
}

std::string flag_help(const FlagSpec& f) {
  if (!f.help.empty()) return std::string(f.help);
  auto it = schema_docs().find(std::string(f.key));
  return it == schema_docs().end() ? std::string() : it->second.help;
}

std::vector<std::string> all_flag_names() {
  std::vector<std::string> names;
  for (const FlagSpec& f : kTable) names.emplace_back(f.flag);
  for (const Switch& s : kSwitches) names.emplace_back(s.flag);
  for (const Refused& r : kRefused) names.emplace_back(r.flag);
  return names;
}

const Refused* find_refused(std::string_view flag) {
  for (const Refused& r : kRefused)
    if (r.flag == flag) return &r;
  return nullptr;
}

bool looks_like_override(std::string_view a) {
  return a.find('=') != std::string_view::npos || a.starts_with("~") || a.starts_with("+");
}

std::string section_of(std::string_view key) {
  std::string k(key);
  if (k.starts_with("model.")) return "model";
  return k.substr(0, k.find('.'));
}

std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  else s += "  ";
  return s;
}

}  // namespace

const std::vector<FlagSpec>& flag_table() { return kTable; }

std::vector<std::string> refused_flag_names() {
  std::vector<std::string> out;
  for (const Refused& r : kRefused) out.emplace_back(r.flag);
  return out;
}

const FlagSpec* find_flag(std::string_view flag) {
  for (const FlagSpec& f : kTable)
    if (f.flag == flag) return &f;
  return nullptr;
}

TrainCommandLine parse_train_command_line(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_train_command_line(args);
}

TrainCommandLine parse_train_command_line(std::span<const std::string> args) {
  TrainCommandLine cl;
  ErrorList errors;
  bool only_overrides = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (only_overrides || !(a.starts_with("--") || a == "-h")) {
      if (a == "--") continue;
      try {
        cl.overrides.push_back(Override::parse(a));
      } catch (const ConfigError& e) {
        errors.append(e);
      }
      continue;
    }
    if (a == "--") {
      only_overrides = true;
      continue;
    }
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    const std::optional<std::string> inline_value =
        eq == std::string::npos ? std::nullopt : std::optional<std::string>(a.substr(eq + 1));
    const Origin where = Origin::from_flag(a);
    // The value of a flag: inline (--lr=3e-4) or the next argument (--lr 3e-4).
    auto take_value = [&](std::string& out) -> bool {
      if (inline_value) {
        out = *inline_value;
        return true;
      }
      if (i + 1 < args.size() && !args[i + 1].starts_with("--")) {
        out = args[++i];
        return true;
      }
      errors.add("", where, "flag " + name + " needs a value");
      return false;
    };
    if (name == "--help" || name == "-h") {
      cl.help = true;
    } else if (name == "--dry-run") {
      cl.dry_run = true;
    } else if (name == "--show-origin") {
      cl.show_origin = true;
    } else if (name == "--config-file") {
      take_value(cl.config_file);
    } else if (const FlagSpec* f = find_flag(name)) {
      const std::string key(f->key);
      switch (f->kind) {
        case K::store_true:
        case K::store_false:
          if (inline_value) {
            errors.add("", where, "flag " + name + " is a switch and takes no value",
                       "write " + name + " alone, or ++" + key + "=VALUE");
            break;
          }
          cl.overrides.push_back(
              Override::from_flag(key, Node::scalar(f->kind == K::store_true ? "true" : "false"), name));
          break;
        case K::value: {
          std::string v;
          if (take_value(v)) cl.overrides.push_back(Override::from_flag(key, Node::scalar(v), name + " " + v));
          break;
        }
        case K::list: {
          Node seq = Node::sequence();
          std::string text = name;
          if (inline_value) {
            seq.push_back(Node::scalar(*inline_value));
            text += " " + *inline_value;
          }
          // Values run up to the next flag or override.
          while (!inline_value && i + 1 < args.size() && !args[i + 1].starts_with("--") &&
                 !looks_like_override(args[i + 1])) {
            seq.push_back(Node::scalar(args[++i]));
            text += " " + args[i];
          }
          if (seq.size() == 0) {
            errors.add("", where, "flag " + name + " needs at least one value");
            break;
          }
          cl.overrides.push_back(Override::from_flag(key, std::move(seq), text));
          break;
        }
        case K::comma_list: {
          std::string v;
          if (!take_value(v)) break;
          Node seq = Node::sequence();
          size_t start = 0;
          while (true) {
            size_t comma = v.find(',', start);
            std::string part = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
            part.erase(0, part.find_first_not_of(' '));
            part.erase(part.find_last_not_of(' ') + 1);
            seq.push_back(Node::scalar(part));
            if (comma == std::string::npos) break;
            start = comma + 1;
          }
          cl.overrides.push_back(Override::from_flag(key, std::move(seq), name + " " + v));
          break;
        }
      }
    } else if (const Refused* r = find_refused(name)) {
      errors.add("", where, "flag " + name + " is not supported yet: " + std::string(r->why),
                 "drop " + name);
      while (!inline_value && i + 1 < args.size() && !args[i + 1].starts_with("--") && !looks_like_override(args[i + 1]))
        ++i;
    } else {
      std::string near = nearest(name, all_flag_names());
      errors.add("", where, "unknown flag " + name,
                 (near.empty() ? std::string() : "did you mean " + near + "? ") +
                     "see loongforge-train --help; any config key can be set with ++KEY=VALUE");
      // Skip the unknown flag's values so that they are not taken for overrides.
      while (!inline_value && i + 1 < args.size() && !args[i + 1].starts_with("--") &&
             !looks_like_override(args[i + 1]))
        ++i;
    }
  }
  errors.throw_if_any();
  return cl;
}

std::string help_text() {
  std::string out =
      "Usage: loongforge-train [--config-file FILE] [FLAGS...] [OVERRIDES...] [--dry-run [--show-origin]]\n"
      "\n"
      "Precedence: config files < flags and overrides, which apply left to right.\n"
      "Overrides: a.b=v (existing key)  +a.b=v (new key)  ++a.b=v (add or replace)  ~a.b (delete)\n"
      "           group=option (choose another option of a defaults-list group)\n"
      "Values are YAML: 3, 3e-4, true, null, [1,2], {x: 1}, 'a string'.\n"
      "\nProgram options:\n";
  for (const Switch& s : kSwitches)
    out += "  " + pad(std::string(s.flag) + (s.metavar.empty() ? "" : " " + std::string(s.metavar)), 44) +
           std::string(s.help) + "\n";
  std::string section;
  for (const FlagSpec& f : kTable) {
    std::string sec = section_of(f.key);
    if (sec != section) {
      section = sec;
      out += "\n" + sec + " flags:\n";
    }
    std::string lhs = std::string(f.flag) + (f.metavar.empty() ? "" : " " + std::string(f.metavar));
    out += "  " + pad(lhs, 44) + flag_help(f) + " [" + std::string(f.key) +
           (f.kind == K::store_false ? "=false" : "") + "]\n";
  }
  out += "\nnot supported yet (refused with an error):\n";
  for (const Refused& r : kRefused)
    out += "  " + pad(std::string(r.flag) + " " + std::string(r.metavar), 44) + std::string(r.why) + "\n";
  return out;
}

std::string flags_markdown() {
  auto takes = [](const FlagSpec& f) -> std::string {
    switch (f.kind) {
      case K::store_true: return "switch: sets `true`";
      case K::store_false: return "switch: sets `false`";
      case K::value: return "`" + std::string(f.metavar) + "`";
      case K::list: return "`" + std::string(f.metavar) + "` (values up to the next flag)";
      case K::comma_list: return "`" + std::string(f.metavar) + "` (comma-separated)";
    }
    return "";
  };
  std::string out = "| flag | takes | config key | description |\n|---|---|---|---|\n";
  for (const Switch& s : kSwitches)
    out += "| `" + std::string(s.flag) + "` | " + (s.metavar.empty() ? "switch" : "`" + std::string(s.metavar) + "`") +
           " | (program option) | " + std::string(s.help) + " |\n";
  for (const FlagSpec& f : kTable) {
    std::string help = flag_help(f);
    std::string t = takes(f);
    for (std::string* s : {&help, &t}) {
      std::string e;
      for (char c : *s) e += c == '|' ? std::string("\\|") : std::string(1, c);
      *s = e;
    }
    out += "| `" + std::string(f.flag) + "` | " + t + " | `" + std::string(f.key) + "` | " + help + " |\n";
  }
  for (const Refused& r : kRefused)
    out += "| `" + std::string(r.flag) + "` | `" + std::string(r.metavar) + "` | (refused) | not supported yet: " +
           std::string(r.why) + " |\n";
  return out;
}

}  // namespace lf::config

#include "train_main.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <set>
#include <sstream>

#include "data_source.h"
#include "loongforge/backend/fp8.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/config/config_error.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/data/tokenizer.h"
#include "loongforge/dist/launch_env.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/dist/parallel_layout.h"
#include "loongforge/dist/rendezvous.h"
#include "loongforge/models/composites/causal_lm.h"
#include "loongforge/models/hf_adapter.h"
#include "loongforge/models/hf_vlm.h"
#include "loongforge/models/registry.h"
#include "loongforge/train/checkpoint.h"
#include "loongforge/train/checkpoint_format.h"
#include "loongforge/train/param_dump.h"
#include "loongforge/train/trainer.h"

namespace lf::tools {
namespace {

lf::dist::ParallelLayout make_layout(const lf::config::ParallelConfig& p, int world) {
  lf::dist::ParallelSizes sizes;
  sizes.tp = static_cast<int>(p.tensor_model_parallel_size);
  sizes.pp = static_cast<int>(p.pipeline_model_parallel_size);
  sizes.cp = static_cast<int>(p.context_parallel_size);
  sizes.ep = static_cast<int>(p.expert_model_parallel_size);
  sizes.etp = static_cast<int>(p.expert_tensor_parallel_size.value_or(0));
  return lf::dist::ParallelLayout(world, sizes, p.order);
}

lf::config::Origin origin_of(const lf::config::Node& resolved, const std::string& path) {
  const auto* n = resolved.find_path(path);
  return n ? n->origin() : lf::config::Origin::from_default();
}

// Checks of the job against the model and the world, before any process group exists
// (--dry-run reports them too).
void check_job(const lf::config::JobConfig& job, const lf::config::Node& resolved, const lf::dist::ParallelLayout& layout,
               const lf::models::ModelPlan& plan) {
  lf::config::ErrorList errors;
  // A trace the run would never write is a mistake to report, not to skip silently.
  if (job.parallel.pipeline_trace && layout.size(lf::dist::Axis::pp) == 1)
    errors.add("parallel.pipeline_trace", origin_of(resolved, "parallel.pipeline_trace"),
               "parallel.pipeline_trace is set but parallel.pipeline_model_parallel_size is 1: there is no pipeline "
               "schedule to trace",
               "add --pipeline-model-parallel-size N (N > 1), or drop --pipeline-trace");
  const auto needs = plan.data_needs();
  if (!needs.mock_only_why.empty() && (!job.data.mock_data || !job.data.data_path.empty()))
    errors.add(job.data.mock_data ? "data.data_path" : "data.mock_data",
               origin_of(resolved, job.data.mock_data ? "data.data_path" : "data.mock_data"),
               "model type " + plan.config().type + " trains on --mock-data only: " + needs.mock_only_why,
               "pass --mock-data (and no --data-path)");
  if (!job.data.valid_data_path.empty() && !needs.token_data)
    errors.add("data.valid_data_path", origin_of(resolved, "data.valid_data_path"),
               "data.valid_data_path names token datasets, and model type " + plan.config().type +
                   " reads none: its validation samples are the --split share of its own data (or of the mock data)",
               "drop --valid-data-path");
  // --save-hf: a model with an HF form (--dry-run reports it; the causal_lm mapping is checked once
  // the model is built, before training).
  if (job.checkpoint.save_hf) {
    try {
      if (const auto vlm = lf::models::hf::vlm_config_from_model_section(lf::config::to_yaml(resolved), "the job"))
        lf::models::hf::check_vlm_hf_form(*vlm);
      else
        LF_CHECK(plan.config().type == "causal_lm", "model type ", plan.config().type,
                 " has no HF form: --save-hf exports causal_lm models and the vision-language models of "
                 "docs/conversion.md");
    } catch (const lf::Error& e) {
      errors.add("checkpoint.save_hf", origin_of(resolved, "checkpoint.save_hf"), "--save-hf: " + e.message(),
                 "drop --save-hf (save a checkpoint with --save instead), or train a model an HF family expresses");
    }
  }
  if (job.parallel.enable_encoder_hetero_dp && !needs.vision_tower)
    errors.add("parallel.enable_encoder_hetero_dp", origin_of(resolved, "parallel.enable_encoder_hetero_dp"),
               "--enable-encoder-hetero-dp spreads a vision tower's media over the foundation's TP group; model type " +
                   plan.config().type + " has no vision tower",
               "drop --enable-encoder-hetero-dp");
  if (job.parallel.enable_full_hetero_dp && !needs.vision_tower)
    errors.add("parallel.enable_full_hetero_dp", origin_of(resolved, "parallel.enable_full_hetero_dp"),
               "--enable-full-hetero-dp spreads a vision tower's media over the foundation's TP x PP ranks; model type " +
                   plan.config().type + " has no vision tower",
               "drop --enable-full-hetero-dp");
  if (job.parallel.use_vit_dp_balance && !needs.vision_tower)
    errors.add("parallel.use_vit_dp_balance", origin_of(resolved, "parallel.use_vit_dp_balance"),
               "--use-vit-dp-balance spreads a vision tower's media over the data-parallel ranks; model type " +
                   plan.config().type + " has no vision tower",
               "drop --use-vit-dp-balance");
  if (needs.media && !job.data.mock_data && job.training.training_phase != "sft")
    errors.add("training.training_phase", origin_of(resolved, "training.training_phase"),
               "model type " + plan.config().type +
                   " reads images and videos: it trains on a multimodal store (loongforge-data preprocess --multimodal) "
                   "with --training-phase sft, or on --mock-data",
               "add --training-phase sft with --data-path set to the store's prefix, or pass --mock-data");
  if (job.data.use_vlm_dp_balance && !needs.media)
    errors.add("data.use_vlm_dp_balance", origin_of(resolved, "data.use_vlm_dp_balance"),
               "--use-vlm-dp-balance balances the samples of a multimodal store, and model type " +
                   plan.config().type + " reads no media",
               "train a vision-language model (e.g. model type qwen2_5_vl) on a `loongforge-data preprocess "
               "--multimodal` store, or drop --use-vlm-dp-balance");
  if (job.data.use_vlm_dp_balance && layout.size(lf::dist::Axis::dp) == 1)
    errors.add("data.use_vlm_dp_balance", origin_of(resolved, "data.use_vlm_dp_balance"),
               "--use-vlm-dp-balance spreads each global batch over the data-parallel ranks, and the data-parallel "
               "size is 1: there is nothing to balance",
               "run with a data-parallel size above 1 (more ranks than tensor x pipeline parallel), or drop "
               "--use-vlm-dp-balance");
  if (job.data.use_vlm_dp_balance && job.data.vlm_dp_balance_cost.empty() &&
      (job.data.vlm_dp_balance_warmup_iters - 1) * layout.size(lf::dist::Axis::dp) < 3)
    errors.add("data.vlm_dp_balance_warmup_iters", origin_of(resolved, "data.vlm_dp_balance_warmup_iters"),
               "the cost model's three coefficients are fitted to one observation per data-parallel rank and "
               "warm-up iteration after the first: " + std::to_string(job.data.vlm_dp_balance_warmup_iters) +
                   " warm-up iterations at DP " + std::to_string(layout.size(lf::dist::Axis::dp)) + " give " +
                   std::to_string((job.data.vlm_dp_balance_warmup_iters - 1) * layout.size(lf::dist::Axis::dp)) +
                   ", fewer than 3",
               "raise --vlm-dp-balance-warmup-iters, or give the coefficients with --vlm-dp-balance-cost A,B,C");
  const bool wants_eod = job.data.eod_mask_loss || job.data.reset_position_ids || job.data.reset_attention_mask;
  if (wants_eod && !needs.token_data)
    errors.add("data.eod_mask_loss", origin_of(resolved, "data.eod_mask_loss"),
               "--eod-mask-loss / --reset-position-ids / --reset-attention-mask work on token data; model type " +
                   plan.config().type + " reads none",
               "drop these flags");
  if (job.data.reset_attention_mask && job.parallel.chunkpipe_chunk_size)
    errors.add("data.reset_attention_mask", origin_of(resolved, "data.reset_attention_mask"),
               "--reset-attention-mask needs whole sequences; ChunkPipe attends across chunks of one document stream",
               "drop --reset-attention-mask or --chunkpipe-chunk-size");
  if (job.data.reset_position_ids && job.parallel.chunkpipe_chunk_size)
    errors.add("data.reset_position_ids", origin_of(resolved, "data.reset_position_ids"),
               "--reset-position-ids needs whole sequences (ChunkPipe keeps one position stream)",
               "drop --reset-position-ids or --chunkpipe-chunk-size");
  errors.throw_if_any();
}

// The end-of-document id the reset/eod flags need: the tokenizer's (--tokenizer-type), or the
// mock dataset's (0). Also checks that the tokenizer's ids fit the model's vocabulary.
std::optional<int64_t> end_of_document(const lf::config::JobConfig& job, const lf::config::Node& resolved,
                                       const lf::models::ModelPlan& plan) {
  const bool wants = job.data.eod_mask_loss || job.data.reset_position_ids || job.data.reset_attention_mask;
  std::optional<int64_t> eod;
  if (job.data.tokenizer_type) {
    auto tok = lf::data::make_tokenizer(*job.data.tokenizer_type, job.data.tokenizer_model.value_or(""));
    const auto vocab = plan.data_needs().vocab_size;
    if (vocab > 0 && tok->vocab_size() > vocab) {
      lf::config::ErrorList errors;
      errors.add("data.tokenizer_type", origin_of(resolved, "data.tokenizer_type"),
                 tok->describe() + " has " + std::to_string(tok->vocab_size()) + " ids, the model's vocabulary " +
                     std::to_string(vocab),
                 "raise model.foundation.vocab_size to at least the tokenizer's size");
      errors.throw_if_any();
    }
    if (auto e = tok->eod_id()) eod = *e;
  } else if (job.data.tokenizer_model && !plan.data_needs().vla) {  // VLA sources read it (pi0.5 prompts)
    lf::config::ErrorList errors;
    errors.add("data.tokenizer_model", origin_of(resolved, "data.tokenizer_model"),
               "data.tokenizer_model is set and data.tokenizer_type is not: the tokenizer would not be read",
               "add --tokenizer-type HuggingFaceTokenizer, or drop --tokenizer-model");
    errors.throw_if_any();
  } else if (job.data.mock_data) {
    eod = 0;  // the mock token dataset ends its documents with 0
  }
  if (wants && !eod) {
    lf::config::ErrorList errors;
    errors.add("data.tokenizer_type", origin_of(resolved, "data.tokenizer_type"),
               "--eod-mask-loss, --reset-position-ids and --reset-attention-mask need the end-of-document id, and no "
               "tokenizer names one",
               "pass --tokenizer-type (ByteTokenizer, or HuggingFaceTokenizer with --tokenizer-model DIR) as the "
               "data was preprocessed with");
    errors.throw_if_any();
  }
  return wants ? eod : std::nullopt;
}

// --distributed-backend against the device backend in use.
void check_distributed_backend(const lf::config::JobConfig& job, const lf::config::Node& resolved,
                               const lf::backend::DeviceBackend& backend) {
  const std::string& want = job.parallel.distributed_backend;
  const std::string& device = backend.name();
  const std::string native = device == "cpu" ? "gloo" : device == "cuda" ? "nccl" : "plugin";
  if (want == "auto" || want == native) return;
  lf::config::ErrorList errors;
  errors.add("parallel.distributed_backend", origin_of(resolved, "parallel.distributed_backend"),
             "--distributed-backend " + want + " does not run on the " + device + " device backend, whose collectives " +
                 "are " + native,
             "use --distributed-backend " + native + " or auto, or pick the device with LOONGFORGE_DEVICE");
  errors.throw_if_any();
}

}  // namespace

int train_main(const lf::config::TrainCommandLine& cl, const lf::train::TrainerHooks& hooks) {
  const auto env = lf::dist::detect_launch_env();
  lf::log::init(lf::log::options_from_env(env.rank, env.world_size));
  lf::config::ComposeOptions options;
  options.config_file = cl.config_file;
  options.overrides = cl.overrides;
  auto loaded = lf::config::load_job(options);
  const auto& job = loaded.job;
  auto model_config = lf::models::load_model_config(loaded.job.model);
  loaded.resolved.set("model", model_config->resolved);
  auto layout = make_layout(job.parallel, env.world_size);
  // Checks that need the world size (reported by --dry-run too, as configuration errors).
  lf::train::num_micro_batches(job.training, layout.size(lf::dist::Axis::dp));
  auto plan = lf::models::plan_model(model_config, {&job, &loaded.resolved, &layout});
  check_job(job, loaded.resolved, layout, *plan);
  const auto eod = end_of_document(job, loaded.resolved, *plan);
  // A bad --fp8-policy file stops here, before any process group exists (--dry-run included).
  const auto fp8 = lf::train::fp8_policy(job.training);
  if (env.rank == 0 && job.parallel.sequence_parallel && layout.size(lf::dist::Axis::tp) == 1)
    LF_WARN("--sequence-parallel is off: it splits the sequence over tensor-parallel ranks, and "
            "--tensor-model-parallel-size is 1 (as in Megatron, the run goes on without it)");

  if (cl.dry_run) {
    if (env.rank == 0) {
      std::cout << "# resolved configuration\n"
                << lf::config::to_yaml(loaded.resolved, cl.show_origin) << "\n# parallel layout (" << env.world_size
                << " ranks, launched by " << env.source << ")\n"
                << layout.describe() << "\n" << plan->describe();
      if (fp8) std::cout << "fp8: " << fp8->describe() << "\n";
      std::cout.flush();
    }
    return 0;
  }

  const auto& backend = lf::backend::select_backend();
  check_distributed_backend(job, loaded.resolved, backend);
  backend.set_device_index(env.local_rank % std::max(1, backend.device_count()));
  const uint64_t seed = static_cast<uint64_t>(job.training.seed);
  backend.manual_seed(seed + 100 * static_cast<uint64_t>(env.rank));

  lf::dist::Rendezvous rendezvous(
      env, lf::dist::timeout_from_minutes(static_cast<double>(job.parallel.distributed_timeout_minutes)));
  lf::dist::ParallelContextOptions ctx_options;
  ctx_options.timeout = rendezvous.timeout();
  ctx_options.factory = backend.communicator_factory();
  lf::dist::ParallelContext ctx(rendezvous, layout, ctx_options);

  lf::models::BuildArgs args;
  args.backend = &backend;
  args.context = &ctx;
  args.seed = seed;
  args.dtype = job.training.bf16 ? at::kBFloat16 : job.training.fp16 ? at::kHalf : at::kFloat;
  // A component with its own layout gets its own context over a subset of the ranks.
  args.make_context = [&](const std::string& name, const lf::dist::ParallelLayout& l, const std::vector<int>& ranks) {
    lf::dist::ParallelContextOptions o = ctx_options;
    o.name = name;
    o.world_ranks = ranks;
    return std::make_unique<lf::dist::ParallelContext>(rendezvous, l, o);
  };
  auto model = plan->build(args);
  if (env.rank == 0)
    LF_INFO("model: ", plan->summary(), " | world ", env.world_size, " (tp ", ctx.tp_size(), ", pp ", ctx.pp_size(),
            ", dp ", ctx.dp_size(), job.parallel.sequence_parallel && ctx.tp_size() > 1 ? ", sequence parallel" : "",
            ctx.cp_size() > 1 ? ", cp " + std::to_string(ctx.cp_size()) + " (" + job.parallel.cp_comm_type + ")" : "",
            ") | backend ", backend.name(), " | ", lf::backend::intra_op_team_size(), " CPU thread(s) a rank");
  auto* causal = dynamic_cast<lf::models::CausalLm*>(model.get());
  if (env.rank == 0 && job.parallel.overlap_grad_reduce && ctx.pp_size() > 1 && causal &&
      !causal->config().untie_embeddings_and_output_weights)
    LF_WARN("--overlap-grad-reduce is off on the first and last pipeline stages: the tied embedding's gradient is "
            "summed over the embedding group before the data-parallel reduction (untie_embeddings_and_output_weights "
            "keeps the overlap everywhere)");
  // --load of an HF model directory: its weights, converted on the fly (this rank's shards),
  // then training starts at iteration 0 (an HF directory holds no optimizer or progress).
  lf::config::JobConfig trainer_job = job;
  const auto& pretrained = job.checkpoint.pretrained_checkpoint;
  for (const auto* hf_dir : {&job.checkpoint.load, &pretrained})
    LF_CHECK(!(job.lora.rank > 0 && *hf_dir && lf::models::hf::is_hf_model_dir(**hf_dir)), **hf_dir,
             " is an HF model directory, and LoRA checkpoints name their base by a native checkpoint's manifest",
             lf::hint("convert it once: loongforge-convert hf2lf --hf-dir " + **hf_dir +
                      " --out BASE, then pass --pretrained-checkpoint BASE"));
  if (pretrained && lf::models::hf::is_hf_model_dir(*pretrained) &&
      !(job.checkpoint.load && lf::train::ckpt::resolve_checkpoint_dir(*job.checkpoint.load))) {
    // --pretrained-checkpoint of an HF directory when --load holds nothing yet: its weights, as
    // --load of one does.
    LF_CHECK(causal != nullptr, "--pretrained-checkpoint ", *pretrained, " is an HF model directory; model type ",
             model->type(), " cannot load HF weights");
    lf::models::hf::load_hf_into(*causal, *pretrained);
    if (env.rank == 0) LF_INFO("fine-tuning from the HF weights of ", *pretrained, "; starting at iteration 0");
    trainer_job.checkpoint.pretrained_checkpoint.reset();
  }
  if (job.checkpoint.load && lf::models::hf::is_hf_model_dir(*job.checkpoint.load)) {
    LF_CHECK(causal != nullptr, "--load ", *job.checkpoint.load, " is an HF model directory; model type ",
             model->type(), " cannot load HF weights",
             lf::hint("HF directories load into causal_lm models (decoder families in configs/models/*/hf.yaml)"));
    lf::models::hf::load_hf_into(*causal, *job.checkpoint.load);
    if (env.rank == 0) LF_INFO("loaded HF weights from ", *job.checkpoint.load, "; starting at iteration 0");
    trainer_job.checkpoint.load.reset();
  }
  // --save-hf: the export's form (check_job refused models without one): a vision-language model
  // through the VLM table, as loongforge-convert lf2hf writes it; a causal_lm's mapping is checked
  // here, before training, not after it.
  std::optional<lf::models::hf::VlmConfig> vlm_export;
  if (job.checkpoint.save_hf) {
    vlm_export = lf::models::hf::vlm_config_from_model_section(lf::config::to_yaml(loaded.resolved), "the job");
    if (!vlm_export) {
      try {
        (void)lf::models::hf::mapping_for_config(causal->config());
      } catch (const lf::Error& e) {
        LF_FAIL("--save-hf ", *job.checkpoint.save_hf, ": ", e.message(),
                lf::hint("drop --save-hf (save a checkpoint with --save instead), or train a model an HF family "
                         "expresses (the reasons above)"));
      }
    }
  }
  auto data = make_data_sources(job, *plan, ctx, eod);
  lf::train::Trainer trainer(trainer_job, *model, ctx, backend, std::move(data.train), std::move(data.valid), hooks);
  trainer.set_config_yaml(lf::config::to_yaml(loaded.resolved));
  // Preemption: finish the step, save, exit 0 (only meaningful with --save).
  if (job.checkpoint.save) lf::train::install_sigterm_handler();
  auto summary = trainer.run();
  // For equivalence tests across layouts: the final full parameters as fp32 safetensors.
  if (const char* dump = std::getenv("LOONGFORGE_DUMP_PARAMS"); dump && *dump)
    lf::train::dump_parameters(dump, model->parameter_groups(), ctx);
  // --save-hf: the final weights as an HF model directory (bf16 when training in bf16).
  if (job.checkpoint.save_hf) {
    // TP shards (expert-parallel shards) gathered on every rank of a stage; with pp > 1 the stages' parts then go to the
    // first stage (its tp_rank 0 / dp_rank 0 rank writes).
    auto full = lf::train::gather_full_groups(model->parameter_groups());
    if (ctx.tp_rank() == 0 && ctx.dp_rank() == 0) {
      full = lf::train::gather_pipeline_parameters(std::move(full), ctx);
      if (ctx.pp_rank() == 0) {
        lf::models::hf::WriteOptions wo;
        wo.dtype = job.training.bf16 ? at::kBFloat16 : job.training.fp16 ? at::kHalf : at::kFloat;
        if (vlm_export) {
          // With the tower on every stage (--enable-full-hetero-dp), each stage sent its copy.
          std::set<std::string> seen;
          std::erase_if(full, [&seen](const auto& named) { return !seen.insert(named.first).second; });
          lf::models::hf::write_vlm_hf(*job.checkpoint.save_hf, *vlm_export, full, wo);
          // The image processor's settings of the model it started from (an HF directory, or a
          // checkpoint of loongforge-convert hf2lf), as lf2hf copies them.
          for (const auto& from : {job.checkpoint.load, job.checkpoint.pretrained_checkpoint})
            if (from && lf::models::hf::copy_preprocessor_config(*from, *job.checkpoint.save_hf)) break;
        } else {
          lf::models::hf::write_hf(*job.checkpoint.save_hf, causal->config(), full, wo);
        }
        LF_INFO("exported HF weights to ", *job.checkpoint.save_hf);
      }
    }
    ctx.world().barrier();
  }
  if (env.rank == 0) {
    std::ostringstream heldout;
    if (summary.first_eval.ran && summary.last_eval.ran)
      for (const auto& name : model->eval_metrics())
        heldout << " | held-out " << lf::train::display_name(name) << " " << summary.first_eval.value(name) << " -> "
                << summary.last_eval.value(name);
    LF_INFO("done: ", summary.iterations, " iterations | final loss ", summary.last_loss,
            summary.skipped_iterations ? " | skipped iterations " + std::to_string(summary.skipped_iterations) : "",
            heldout.str());
  }
  lf::log::flush();
  return 0;
}

int run_train_program(int argc, char** argv, const lf::train::TrainerHooks& hooks) {
  try {
    auto cl = lf::config::parse_train_command_line(argc, argv);
    if (cl.help) {
      std::cout << lf::config::help_text();
      return 0;
    }
    return train_main(cl, hooks);
  } catch (const lf::config::ConfigError& e) {
    std::cerr << "loongforge-train: " << e.what() << std::endl;
    return 2;
  } catch (const lf::Error& e) {
    lf::log::flush();
    std::cerr << "loongforge-train: error: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    lf::log::flush();
    std::cerr << "loongforge-train: unexpected error: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace lf::tools

#include "train_main.h"

#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "data_source.h"
#include "loongforge/backend/registry.h"
#include "loongforge/core/config/job_config.h"
#include "loongforge/core/config/yaml.h"
#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/dist/launch_env.h"
#include "loongforge/dist/parallel_context.h"
#include "loongforge/dist/parallel_layout.h"
#include "loongforge/dist/rendezvous.h"
#include "loongforge/models/causal_lm.h"
#include "loongforge/models/decoder.h"
#include "loongforge/models/hf_adapter.h"
#include "loongforge/parallel/pipeline/schedules.h"
#include "loongforge/parallel/pipeline/stages.h"
#include "loongforge/train/checkpoint.h"
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
  return lf::dist::ParallelLayout(world, sizes, p.order);
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  std::ostringstream os;
  os << std::fixed << std::setprecision(b < 10 ? 2 : 1) << b << " " << units[u];
  return os.str();
}

struct StageCount {
  std::vector<lf::parallel::pipeline::LayerRange> chunks;  // model chunks (several: interleaved)
  int64_t layers = 0;
  int64_t params = 0;  // of the full model's tensors this stage holds (before / tp)
  std::string extra;   // what besides layers
};

std::vector<StageCount> stage_counts(const lf::config::JobConfig& job, const lf::models::DecoderConfig& m,
                                     int pp) {
  // num_parameters() = vocab table(s) + layers + final norm; every layer has the same count.
  const int64_t h = m.hidden_size, vocab = m.padded_vocab_size() * h;
  const int64_t final_norm = m.normalization == "LayerNorm" ? 2 * h : h;
  const int64_t tables = m.untie_embeddings_and_output_weights ? 2 * vocab : vocab;
  const int64_t per_layer = (m.num_parameters() - tables - final_norm) / m.num_layers;
  std::vector<StageCount> out;
  for (int k = 0; k < pp; ++k) {
    const auto stage = lf::models::pipeline_stage(m, pp, k, job.parallel.decoder_first_pipeline_num_layers,
                                                  job.parallel.decoder_last_pipeline_num_layers,
                                                  pp > 1 ? job.parallel.num_layers_per_virtual_pipeline_stage
                                                         : std::nullopt,
                                                  job.parallel.pipeline_model_parallel_layout);
    StageCount c{stage.chunks, 0, 0, ""};
    for (const auto& r : stage.chunks) c.layers += r.size();
    c.params = c.layers * per_layer;
    if (k == 0) c.params += vocab, c.extra += " + embedding";
    if (k == pp - 1) {
      c.params += final_norm;
      // Tied embeddings over several stages: the last stage holds a copy as its output layer.
      if (m.untie_embeddings_and_output_weights || pp > 1) c.params += vocab;
      c.extra += m.untie_embeddings_and_output_weights ? " + final norm + output layer"
                                                       : (pp > 1 ? " + final norm + tied output copy"
                                                                 : " + final norm");
    }
    out.push_back(std::move(c));
  }
  return out;
}

// Per-rank estimates from the stage's parameter count and Megatron's activation formula
// (s*b*h*(34 + 5*a*s/h) bytes per layer in 16-bit, /tp; doubled in fp32). Under 1F1B stage k
// holds the activations of up to pp - k micro-batches at once; interleaved, up to its warm-up
// forwards + 1 model chunks' worth.
std::string estimates(const lf::config::JobConfig& job, const lf::models::DecoderConfig& m,
                      const lf::dist::ParallelLayout& layout) {
  const int tp = layout.size(lf::dist::Axis::tp), pp = layout.size(lf::dist::Axis::pp),
            dp = layout.size(lf::dist::Axis::dp);
  const bool half = job.training.bf16 || job.training.fp16;
  const double s = job.training.seq_length, b = job.training.micro_batch_size,
               h = m.hidden_size, a = m.num_attention_heads;
  const double act_per_layer = s * b * h * (34 + 5 * a * s / h) / tp * (half ? 1 : 2);
  const int64_t micro_batches = lf::train::num_micro_batches(job.training, dp);
  std::ostringstream os;
  os << "per-rank estimates" << (pp > 1 ? " by pipeline stage" : "")
     << " (every rank of a pipeline stage is alike):\n";
  const auto counts = stage_counts(job, m, pp);
  for (size_t k = 0; k < counts.size(); ++k) {
    const double params = static_cast<double>(counts[k].params) / tp;
    const double weight_bytes = params * (half ? 2 : 4);
    const double grad_bytes = params * 4;                 // fp32 main gradients
    double optim_bytes = params * (8 + (half ? 4 : 0));  // Adam m, v (+ fp32 master)
    if (job.optimizer.use_distributed_optimizer) optim_bytes /= dp;
    const auto& c = counts[k];
    const int64_t v = static_cast<int64_t>(c.chunks.size());
    int64_t chunk_layers = 0;  // the largest model chunk (a layout may make them uneven)
    for (const auto& r : c.chunks) chunk_layers = std::max(chunk_layers, r.size());
    int64_t in_flight = pp > 1 ? std::min<int64_t>(pp - static_cast<int64_t>(k), micro_batches) : 1;
    double act = act_per_layer * static_cast<double>(c.layers) * static_cast<double>(in_flight);
    if (v > 1 && micro_batches % pp == 0) {  // interleaved: chunk-micro-batches in flight
      const auto order = lf::parallel::pipeline::interleaved_1f1b_order(static_cast<int>(k), pp, static_cast<int>(v), micro_batches);
      int64_t live = 0, most = 0;
      for (const auto& op : order) most = std::max(most, live += op.kind == 'F' ? 1 : -1);
      in_flight = most;
      act = act_per_layer * static_cast<double>(chunk_layers) * static_cast<double>(most);
    }
    std::string act_note = std::to_string(in_flight) + (v > 1 ? " model-chunk micro-batch" : " micro-batch") +
                           (in_flight > 1 ? "es" : "") + " in flight";
    if (const auto chunk = job.parallel.chunkpipe_chunk_size) {
      // ChunkPipe: one chunk's activations (attention over the whole prefix is flash: O(chunk)),
      // plus the kept keys/values of the sequence with their gradients (x 3 with the transient
      // prefix gradient) and, past the first stage, the stage's inputs.
      const double cs = static_cast<double>(*chunk);
      const double kv = s * b * 2.0 * static_cast<double>(m.query_groups() * m.head_dim()) / tp * (half ? 2 : 4);
      act = cs * b * h * 34 / tp * (half ? 1 : 2) * static_cast<double>(c.layers) +
            3 * kv * static_cast<double>(c.layers) + (k > 0 ? s * b * h / tp * (half ? 2 : 4) : 0.0);
      act_note = "one chunk of " + std::to_string(*chunk) + " tokens + the sequence's keys/values";
    }
    const std::string pad = pp > 1 ? "    " : "  ";
    if (pp > 1) os << "  stage " << k << ":\n";
    os << pad << "parameters      " << static_cast<int64_t>(params) << " of " << m.num_parameters()
       << " (/ tp " << tp << (pp > 1 ? ", this stage's layers" : "") << ")\n"
       << pad << "weights         " << human_bytes(weight_bytes) << "\n"
       << pad << "gradients       " << human_bytes(grad_bytes) << " (fp32)\n"
       << pad << "optimizer       " << human_bytes(optim_bytes)
       << (job.optimizer.use_distributed_optimizer ? " (sharded over dp)" : "") << "\n"
       << pad << "activations     " << human_bytes(act) << " (" << act_note << ")\n"
       << pad << "total           " << human_bytes(weight_bytes + grad_bytes + optim_bytes + act) << "\n";
  }
  os << "  model FLOPs     " << std::setprecision(4) << m.flops_per_token(job.training.seq_length)
     << " per token (training)\n";
  return os.str();
}

std::string stage_assignment(const lf::config::JobConfig& job, const lf::models::DecoderConfig& m,
                             const lf::dist::ParallelLayout& layout) {
  const int tp = layout.size(lf::dist::Axis::tp), pp = layout.size(lf::dist::Axis::pp);
  std::ostringstream os;
  os << "pipeline stages (" << pp << "):\n";
  const auto counts = stage_counts(job, m, pp);
  for (size_t k = 0; k < counts.size(); ++k) {
    const auto& c = counts[k];
    os << "  stage " << k << ": layers ";
    for (size_t j = 0; j < c.chunks.size(); ++j) {
      os << (j ? " + " : "");
      if (c.chunks[j].size() == 0)
        os << "none";  // an empty model chunk (a layout string's embedding- or loss-only stage)
      else
        os << c.chunks[j].begin << ".." << c.chunks[j].end - 1;
    }
    os << " (" << c.layers << (c.chunks.size() > 1 ? " in " + std::to_string(c.chunks.size()) + " model chunks" : "")
       << ")" << c.extra << " | " << c.params << " parameters (" << c.params / tp << " per rank, / tp " << tp << ")\n";
  }
  return os.str();
}

}  // namespace

int train_main(const lf::config::TrainCommandLine& cl) {
  const auto env = lf::dist::detect_launch_env();
  lf::log::init(lf::log::options_from_env(env.rank, env.world_size));
  lf::config::ComposeOptions options;
  options.config_file = cl.config_file;
  options.overrides = cl.overrides;
  auto loaded = lf::config::load_job(options);
  const auto& job = loaded.job;
  auto model = lf::models::load_causal_lm(loaded.job.model);
  loaded.resolved.set("model", model.resolved);
  auto layout = make_layout(job.parallel, env.world_size);
  // Checks that need the world size (reported by --dry-run too, as configuration errors).
  lf::train::num_micro_batches(job.training, layout.size(lf::dist::Axis::dp));
  {
    lf::config::ErrorList errors;
    model.foundation.validate_layout(loaded.resolved, layout.size(lf::dist::Axis::tp),
                                     job.parallel.sequence_parallel, job.training.seq_length, errors);
    // A trace the run would never write is a mistake to report, not to skip silently.
    if (job.parallel.pipeline_trace && layout.size(lf::dist::Axis::pp) == 1) {
      const auto* n = loaded.resolved.find("parallel");
      const auto* key = n ? n->find("pipeline_trace") : nullptr;
      errors.add("parallel.pipeline_trace", key ? key->origin() : lf::config::Origin::from_default(),
                 "parallel.pipeline_trace is set but parallel.pipeline_model_parallel_size is 1: there "
                 "is no pipeline schedule to trace",
                 "add --pipeline-model-parallel-size N (N > 1), or drop --pipeline-trace");
    }
    errors.throw_if_any();
  }
  // The pipeline split (layers not divisible by pp, bad first/last stage sizes, virtual stages:
  // errors naming the values), and the interleaved schedule's micro-batch count.
  const auto counts = stage_counts(job, model.foundation, layout.size(lf::dist::Axis::pp));
  LF_CHECK(counts.front().chunks.size() == 1 || !job.parallel.chunkpipe_chunk_size,
           "ChunkPipe runs one model chunk per pipeline rank, parallel.pipeline_model_parallel_layout '",
           job.parallel.pipeline_model_parallel_layout.value_or(""), "' gives ", counts.front().chunks.size(),
           lf::hint("list exactly pp stages in the layout with --chunkpipe-chunk-size"));
  if (counts.front().chunks.size() > 1)
    lf::parallel::pipeline::interleaved_1f1b_order(0, layout.size(lf::dist::Axis::pp),
                                                   static_cast<int>(counts.front().chunks.size()),
                                                   lf::train::num_micro_batches(job.training, layout.size(lf::dist::Axis::dp)));

  if (cl.dry_run) {
    if (env.rank == 0) {
      std::cout << "# resolved configuration\n"
                << lf::config::to_yaml(loaded.resolved, cl.show_origin) << "\n# parallel layout ("
                << env.world_size << " ranks, launched by " << env.source << ")\n"
                << layout.describe() << "\n" << stage_assignment(job, model.foundation, layout)
                << estimates(job, model.foundation, layout);
      std::cout.flush();
    }
    return 0;
  }

  LF_CHECK(layout.size(lf::dist::Axis::cp) == 1 && layout.size(lf::dist::Axis::ep) == 1,
           "training runs tensor-, pipeline- and data-parallel only in this build (cp ",
           layout.size(lf::dist::Axis::cp), ", ep ", layout.size(lf::dist::Axis::ep), ")",
           lf::hint("--dry-run shows any layout; context and expert parallel training land with "
                    "their issues (docs/architecture.md, roadmap)"));
  const auto& backend = lf::backend::select_backend();
  backend.set_device_index(env.local_rank % std::max(1, backend.device_count()));
  const uint64_t seed = static_cast<uint64_t>(job.training.seed);
  backend.manual_seed(seed + 100 * static_cast<uint64_t>(env.rank));

  lf::dist::Rendezvous rendezvous(env, lf::dist::timeout_from_minutes(
                                           static_cast<double>(job.parallel.distributed_timeout_minutes)));
  lf::dist::ParallelContextOptions ctx_options;
  ctx_options.timeout = rendezvous.timeout();
  ctx_options.factory = backend.communicator_factory();
  lf::dist::ParallelContext ctx(rendezvous, layout, ctx_options);

  const auto dtype = job.training.bf16 ? at::kBFloat16 : at::kFloat;
  // Tensor (and sequence) parallel when tp > 1: each rank keeps its shards of the model that
  // `seed` gives on one device.
  // Pipeline parallel when pp > 1: this rank's stage (its layers, embedding first, head last).
  const auto stage = lf::models::pipeline_stage(model.foundation, ctx.pp_size(), ctx.pp_rank(),
                                                job.parallel.decoder_first_pipeline_num_layers,
                                                job.parallel.decoder_last_pipeline_num_layers,
                                                job.parallel.num_layers_per_virtual_pipeline_stage,
                                                job.parallel.pipeline_model_parallel_layout);
  lf::models::Decoder decoder(model.foundation, backend, seed, dtype, &ctx,
                              job.parallel.sequence_parallel, stage);
  if (env.rank == 0)
    LF_INFO("model: ", model.foundation.num_parameters(), " parameters, ",
            model.foundation.num_layers, " layers, hidden ", model.foundation.hidden_size,
            " | world ", env.world_size, " (tp ", ctx.tp_size(), ", pp ", ctx.pp_size(), ", dp ", ctx.dp_size(),
            job.parallel.sequence_parallel && ctx.tp_size() > 1 ? ", sequence parallel" : "",
            ") | backend ", backend.name());
  if (env.rank == 0 && job.parallel.overlap_grad_reduce && ctx.pp_size() > 1 &&
      !model.foundation.untie_embeddings_and_output_weights)
    LF_WARN("--overlap-grad-reduce is off on the first and last pipeline stages: the tied "
            "embedding's gradient is summed over the embedding group before the data-parallel "
            "reduction (untie_embeddings_and_output_weights keeps the overlap everywhere)");
  // --load of an HF model directory: its weights, converted on the fly (this rank's shards),
  // then training starts at iteration 0 (an HF directory holds no optimizer or progress).
  lf::config::JobConfig trainer_job = job;
  if (job.checkpoint.load && lf::models::hf::is_hf_model_dir(*job.checkpoint.load)) {
    lf::models::hf::load_hf_into(decoder, *job.checkpoint.load);
    if (env.rank == 0)
      LF_INFO("loaded HF weights from ", *job.checkpoint.load, "; starting at iteration 0");
    trainer_job.checkpoint.load.reset();
  }
  auto data = make_data_sources(job, model.foundation, ctx);
  lf::train::Trainer trainer(trainer_job, decoder, ctx, backend, std::move(data.train),
                             std::move(data.valid));
  trainer.set_config_yaml(lf::config::to_yaml(loaded.resolved));
  // Preemption: finish the step, save, exit 0 (only meaningful with --save).
  if (job.checkpoint.save) lf::train::install_sigterm_handler();
  auto summary = trainer.run();
  // For equivalence tests across layouts: the final full parameters as fp32 safetensors.
  if (const char* dump = std::getenv("LOONGFORGE_DUMP_PARAMS"); dump && *dump)
    lf::train::dump_parameters(dump, decoder.parameters(), ctx);
  // --save-hf: the final weights as an HF model directory (bf16 when training in bf16).
  if (job.checkpoint.save_hf) {
    // TP shards gathered on every rank of a stage; with pp > 1 the stages' parts then go to the
    // first stage (its tp_rank 0 / dp_rank 0 rank writes).
    auto full = lf::train::gather_full_parameters(decoder.parameters(), ctx);
    if (ctx.tp_rank() == 0 && ctx.dp_rank() == 0) {
      full = lf::train::gather_pipeline_parameters(std::move(full), ctx);
      if (ctx.pp_rank() == 0) {
        lf::models::hf::WriteOptions wo;
        wo.dtype = job.training.bf16 ? at::kBFloat16 : at::kFloat;
        lf::models::hf::write_hf(*job.checkpoint.save_hf, model.foundation, full, wo);
        LF_INFO("exported HF weights to ", *job.checkpoint.save_hf);
      }
    }
    ctx.world().barrier();
  }
  if (env.rank == 0)
    LF_INFO("done: ", summary.iterations, " iterations | final loss ", summary.last_loss,
            " | held-out loss ", summary.first_eval.loss, " -> ", summary.last_eval.loss,
            " | held-out accuracy ", summary.first_eval.accuracy, " -> ",
            summary.last_eval.accuracy);
  lf::log::flush();
  return 0;
}

}  // namespace lf::tools

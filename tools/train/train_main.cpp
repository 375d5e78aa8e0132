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

// Per-rank estimates from the parameter count and Megatron's activation formula
// (s*b*h*(34 + 5*a*s/h) bytes per layer in 16-bit, /tp; doubled in fp32).
std::string estimates(const lf::config::JobConfig& job, const lf::models::DecoderConfig& m,
                      const lf::dist::ParallelLayout& layout) {
  const int tp = layout.size(lf::dist::Axis::tp), pp = layout.size(lf::dist::Axis::pp),
            dp = layout.size(lf::dist::Axis::dp);
  const bool half = job.training.bf16 || job.training.fp16;
  const double params = static_cast<double>(m.num_parameters()) / (tp * pp);
  const double weight_bytes = params * (half ? 2 : 4);
  const double grad_bytes = params * 4;  // fp32 main gradients
  double optim_bytes = params * (8 + (half ? 4 : 0));  // Adam m, v (+ fp32 master)
  if (job.optimizer.use_distributed_optimizer) optim_bytes /= dp;
  const double s = job.training.seq_length, b = job.training.micro_batch_size,
               h = m.hidden_size, a = m.num_attention_heads;
  const double act = s * b * h * (34 + 5 * a * s / h) * (m.num_layers / static_cast<double>(pp)) /
                     tp * (half ? 1 : 2);
  std::ostringstream os;
  os << "per-rank estimates (every rank of a pipeline stage is alike):\n"
     << "  parameters      " << static_cast<int64_t>(params) << " of "
     << m.num_parameters() << " (/ tp " << tp << " x pp " << pp << ")\n"
     << "  weights         " << human_bytes(weight_bytes) << "\n"
     << "  gradients       " << human_bytes(grad_bytes) << " (fp32)\n"
     << "  optimizer       " << human_bytes(optim_bytes)
     << (job.optimizer.use_distributed_optimizer ? " (sharded over dp)" : "") << "\n"
     << "  activations     " << human_bytes(act) << " per micro-batch in flight\n"
     << "  total           " << human_bytes(weight_bytes + grad_bytes + optim_bytes + act) << "\n"
     << "  model FLOPs     " << std::setprecision(4) << m.flops_per_token(job.training.seq_length)
     << " per token (training)\n";
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
  // Checks that need the world size.
  lf::train::num_micro_batches(job.training, layout.size(lf::dist::Axis::dp));

  if (cl.dry_run) {
    if (env.rank == 0) {
      std::cout << "# resolved configuration\n"
                << lf::config::to_yaml(loaded.resolved, cl.show_origin) << "\n# parallel layout ("
                << env.world_size << " ranks, launched by " << env.source << ")\n"
                << layout.describe() << "\n" << estimates(job, model.foundation, layout);
      std::cout.flush();
    }
    return 0;
  }

  LF_CHECK(layout.size(lf::dist::Axis::pp) == 1 && layout.size(lf::dist::Axis::cp) == 1 &&
               layout.size(lf::dist::Axis::ep) == 1,
           "training runs tensor- and data-parallel only in this build (pp ",
           layout.size(lf::dist::Axis::pp), ", cp ", layout.size(lf::dist::Axis::cp), ", ep ",
           layout.size(lf::dist::Axis::ep), ")",
           lf::hint("--dry-run shows any layout; pipeline, context and expert parallel "
                    "training land with their issues (docs/architecture.md, roadmap)"));
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
  lf::models::Decoder decoder(model.foundation, backend, seed, dtype, &ctx,
                              job.parallel.sequence_parallel);
  if (env.rank == 0)
    LF_INFO("model: ", model.foundation.num_parameters(), " parameters, ",
            model.foundation.num_layers, " layers, hidden ", model.foundation.hidden_size,
            " | world ", env.world_size, " (tp ", ctx.tp_size(), ", dp ", ctx.dp_size(),
            job.parallel.sequence_parallel && ctx.tp_size() > 1 ? ", sequence parallel" : "",
            ") | backend ", backend.name());
  auto data = make_data_sources(job, model.foundation, ctx);
  lf::train::Trainer trainer(job, decoder, ctx, backend, std::move(data.train),
                             std::move(data.valid));
  auto summary = trainer.run();
  // For equivalence tests across layouts: the final full parameters as fp32 safetensors.
  if (const char* dump = std::getenv("LOONGFORGE_DUMP_PARAMS"); dump && *dump)
    lf::train::dump_parameters(dump, decoder.parameters(), ctx);
  if (env.rank == 0)
    LF_INFO("done: ", summary.iterations, " iterations | final loss ", summary.last_loss,
            " | held-out loss ", summary.first_eval.loss, " -> ", summary.last_eval.loss,
            " | held-out accuracy ", summary.first_eval.accuracy, " -> ",
            summary.last_eval.accuracy);
  lf::log::flush();
  return 0;
}

}  // namespace lf::tools
